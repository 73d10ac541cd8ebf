"""text_single.py made distributed by hand, as the official PyTorch DDP tutorial does it.

The reference ddpify's output is compared with. Changes from text_single.py, each one the
tutorial's (https://pytorch.org/tutorials/beginner/ddp_series_multigpu.html, torchrun
version): read LOCAL_RANK from torchrun's environment, set_device + init_process_group,
DistributedSampler with shuffle, pin_memory=True, DDP(model, device_ids=[local_rank])
with default options, sampler.set_epoch each epoch, print on rank 0, destroy_process_group.
Plus the mixed precision asked for by --precision (autocast, bf16 where the GPU has it,
else fp16 with a GradScaler, unscaled before clipping; off on CPU) and non_blocking
copies from pinned memory. The training recipe (batch size per process, workers per
process, optimizer, schedule, clipping) is unchanged.

The fixture: a 6-layer transformer encoder (width 512, 8 heads, about 35 M parameters) over token
sequences of 8 to 512 tokens, padded per batch to the longest one, with a padding mask and
masked mean pooling; 4 classes. AdamW with linear warm-up and gradient clipping. Unlike the
other two fixtures, every batch has its own shape and a step is short (a small model on
64 sequences), so per-step overheads weigh more. The only benchmark parts are StepTimer
(stop after BENCH_WARMUP + BENCH_STEPS steps, print the BENCH line) and --smoke.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from benchmodels import StepTimer, SyntheticReviews, TextClassifier


def parse_args():
    parser = argparse.ArgumentParser(description="Text classifier training, DDP")
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--warmup-iters", type=int, default=200)
    parser.add_argument("--grad-clip", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=4, help="per process")
    parser.add_argument("--dataset-size", type=int, default=100_000)
    parser.add_argument("--log-interval", type=int, default=50)
    parser.add_argument("--precision", choices=["default", "fp32"], default="default")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny model on short sequences, for a CPU check",
    )
    return parser.parse_args()


def pad_batch(batch):
    """Pad a list of (tokens, label) to the longest sequence; True in the mask marks padding."""
    seqs, labels = zip(*batch)
    longest = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), longest, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
    return tokens, tokens == 0, torch.stack(labels)


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

    # --smoke: 2 layers of width 64 on sequences of at most 64 tokens.
    vocab, max_len, layers, width, heads = (
        (1000, 64, 2, 64, 4) if args.smoke else (32000, args.max_len, 6, 512, 8)
    )
    train_set = SyntheticReviews(
        args.dataset_size, max_len=max_len, vocab=vocab, median_len=max_len * 3 // 16
    )
    train_loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        shuffle=False,
        sampler=DistributedSampler(train_set, shuffle=True),
        num_workers=args.workers,
        collate_fn=pad_batch,
        pin_memory=True,
        drop_last=True,
    )
    model = TextClassifier(
        vocab=vocab, max_len=max_len, layers=layers, width=width, heads=heads
    ).to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda it: min(1.0, (it + 1) / args.warmup_iters)
    )

    dtype = amp_dtype(args.precision, device)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)

    timer = StepTimer(args.batch_size, tag=f"text_handwritten_{args.precision}")
    step = 0
    for epoch in range(args.epochs):
        train_loader.sampler.set_epoch(epoch)
        model.train()
        for tokens, pad_mask, labels in train_loader:
            tokens = tokens.to(device, non_blocking=True)
            pad_mask = pad_mask.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                logits = model(tokens, pad_mask)
                loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
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
