"""Train a ResNet-50 on ImageNet-shaped data on one GPU (benchmark fixture: the input to ddpify).

Written as users write a single-GPU script: argparse, a Dataset with CPU augmentation in a
DataLoader with workers, AdamW, a loss print now and then. The only benchmark parts are
StepTimer (stop after BENCH_WARMUP + BENCH_STEPS steps, print the BENCH line) and --smoke.
"""

import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from benchmodels import ResNet50, StepTimer, SyntheticImageNet


def parse_args():
    parser = argparse.ArgumentParser(description="ResNet-50 training")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=90)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--dataset-size", type=int, default=100_000)
    parser.add_argument("--log-interval", type=int, default=25)
    parser.add_argument(
        "--channels-last",
        action="store_true",
        help="NHWC memory format for the model and images",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny model and images, for a CPU check"
    )
    return parser.parse_args()


def main():
    args = parse_args()
    torch.manual_seed(0)
    torch.set_float32_matmul_precision("high")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    # --smoke: the same network at 1/16 width on 32x32 images.
    crop, width, classes = (32, 4, 10) if args.smoke else (224, 64, 1000)
    train_set = SyntheticImageNet(
        args.dataset_size, crop_size=crop, num_classes=classes
    )
    model = ResNet50(num_classes=classes, base_width=width)
    train_loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        drop_last=True,
    )
    model = model.to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, weight_decay=args.weight_decay
    )

    timer = StepTimer(args.batch_size, tag="cnn")
    step = 0
    for epoch in range(args.epochs):
        model.train()
        for images, labels in train_loader:
            images = images.to(device)
            if args.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            labels = labels.to(device)
            output = model(images)
            loss = F.cross_entropy(output, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % args.log_interval == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
            timer.step()
            if timer.done:
                break
        if timer.done:
            break
    print(timer.report())


if __name__ == "__main__":
    main()
