"""gpt_single.py made distributed by hand, as the official PyTorch DDP tutorial does it.

The reference ddpify's output is compared with. Changes from gpt_single.py, each one the
tutorial's (https://pytorch.org/tutorials/beginner/ddp_series_multigpu.html, torchrun
version): read LOCAL_RANK from torchrun's environment, set_device + init_process_group,
DistributedSampler with shuffle, pin_memory=True, DDP(model, device_ids=[local_rank])
with default options, sampler.set_epoch each epoch, print on rank 0, destroy_process_group.
Plus the mixed precision asked for by --precision (autocast, bf16 where the GPU has it,
else fp16 with a GradScaler, unscaled before clipping; off on CPU) and non_blocking
copies from pinned memory. The training recipe (batch size per process, workers per
process, optimizer, schedule, clipping) is unchanged.
"""

import argparse
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from benchmodels import GPT, StepTimer, SyntheticTokens


def parse_args():
    parser = argparse.ArgumentParser(description="GPT training, DDP")
    parser.add_argument("--batch-size", type=int, default=8, help="per process")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup-iters", type=int, default=100)
    parser.add_argument("--max-iters", type=int, default=10_000)
    parser.add_argument("--grad-clip", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=4, help="per process")
    parser.add_argument("--dataset-size", type=int, default=50_000)
    parser.add_argument("--log-interval", type=int, default=25)
    parser.add_argument("--precision", choices=["default", "fp32"], default="default")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny model, for a CPU check"
    )
    return parser.parse_args()


def lr_lambda(it, warmup, total):
    if it < warmup:
        return (it + 1) / warmup
    progress = min(1.0, (it - warmup) / max(1, total - warmup))
    return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))


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
    torch.manual_seed(1337)
    torch.set_float32_matmul_precision("high")

    # --smoke: a 2-layer, width-64 model on short sequences.
    vocab, seq_len, layers, width, heads = (
        (256, 32, 2, 64, 4) if args.smoke else (32000, args.seq_len, 12, 1024, 16)
    )
    model = GPT(vocab=vocab, seq_len=seq_len, layers=layers, width=width, heads=heads)
    train_set = SyntheticTokens(args.dataset_size, seq_len=seq_len, vocab=vocab)
    train_loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        shuffle=False,
        sampler=DistributedSampler(train_set, shuffle=True),
        num_workers=args.workers,
        pin_memory=True,
    )
    model.to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": 0.1},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda it: lr_lambda(it, args.warmup_iters, args.max_iters)
    )
    dtype = amp_dtype(args.precision, device)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)

    timer = StepTimer(args.batch_size, tag=f"gpt_handwritten_{args.precision}")
    it = 0
    for epoch in range(args.epochs):
        train_loader.sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                logits = model(x)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            it += 1
            if rank == 0 and it % args.log_interval == 0:
                print(
                    f"epoch {epoch} iter {it} loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e}"
                )
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
