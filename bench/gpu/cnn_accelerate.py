"""cnn_single.py made distributed with Hugging Face Accelerate, as its migration guide says.

Changes from cnn_single.py, each one the guide's: Accelerator(mixed_precision=...),
accelerator.prepare(model, optimizer, loader) (which wraps the model in DDP and shards
the loader), no manual .to(device) of batches, accelerator.backward(loss),
accelerator.print. Launched with torchrun like the others; --precision default means
bf16 where the GPU has it (else fp16), fp32 means mixed_precision="no".
"""

import argparse

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader

from benchmodels import ResNet50, StepTimer, SyntheticImageNet


def parse_args():
    parser = argparse.ArgumentParser(description="ResNet-50 training, Accelerate")
    parser.add_argument("--batch-size", type=int, default=256, help="per process")
    parser.add_argument("--epochs", type=int, default=90)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--workers", type=int, default=8, help="per process")
    parser.add_argument("--dataset-size", type=int, default=100_000)
    parser.add_argument("--log-interval", type=int, default=25)
    parser.add_argument("--precision", choices=["default", "fp32"], default="default")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny model and images, for a CPU check"
    )
    return parser.parse_args()


def mixed_precision(precision):
    if precision == "fp32" or not torch.cuda.is_available():
        return "no"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def main():
    args = parse_args()
    accelerator = Accelerator(mixed_precision=mixed_precision(args.precision))
    torch.manual_seed(0)
    torch.set_float32_matmul_precision("high")

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
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, weight_decay=args.weight_decay
    )
    model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)

    timer = StepTimer(args.batch_size, tag=f"cnn_accelerate_{args.precision}")
    step = 0
    for epoch in range(args.epochs):
        model.train()
        for images, labels in train_loader:
            output = model(images)
            loss = F.cross_entropy(output, labels)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            step += 1
            if step % args.log_interval == 0:
                accelerator.print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
            timer.step()
            if timer.done:
                break
        if timer.done:
            break
    accelerator.print(timer.report())
    accelerator.end_training()


if __name__ == "__main__":
    main()
