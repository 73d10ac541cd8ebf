"""cnn_single.py made distributed by hand, as the official PyTorch DDP tutorial does it.

The reference ddpify's output is compared with. Changes from cnn_single.py, each one the
tutorial's (https://pytorch.org/tutorials/beginner/ddp_series_multigpu.html, torchrun
version): read LOCAL_RANK from torchrun's environment, set_device + init_process_group,
DistributedSampler with shuffle, pin_memory=True, DDP(model, device_ids=[local_rank])
with default options, sampler.set_epoch each epoch, print on rank 0, destroy_process_group.
Plus the mixed precision asked for by --precision (autocast, bf16 where the GPU has it,
else fp16 with a GradScaler; off on CPU) and non_blocking copies from pinned memory.
The training recipe (batch size per process, workers per process, optimizer) is unchanged.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from benchmodels import ResNet50, StepTimer, SyntheticImageNet


def parse_args():
    parser = argparse.ArgumentParser(description="ResNet-50 training, DDP")
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


def ddp_setup():
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        dist.init_process_group(
            backend="nccl", device_id=torch.device("cuda", local_rank)
        )
        return torch.device("cuda", local_rank)
    dist.init_process_group(backend="gloo")
    return torch.device("cpu")


def amp_dtype(precision, device):
    if precision == "fp32" or device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def main():
    args = parse_args()
    device = ddp_setup()
    rank = dist.get_rank()
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
        shuffle=False,
        sampler=DistributedSampler(train_set, shuffle=True),
        num_workers=args.workers,
        pin_memory=True,
        drop_last=True,
    )
    model = model.to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, weight_decay=args.weight_decay
    )
    dtype = amp_dtype(args.precision, device)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)

    timer = StepTimer(args.batch_size, tag=f"cnn_handwritten_{args.precision}")
    step = 0
    for epoch in range(args.epochs):
        train_loader.sampler.set_epoch(epoch)
        model.train()
        for images, labels in train_loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                output = model(images)
                loss = F.cross_entropy(output, labels)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            step += 1
            if rank == 0 and step % args.log_interval == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
            timer.step()
            if timer.done:
                break
        if timer.done:
            break
    if rank == 0:
        print(timer.report())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
