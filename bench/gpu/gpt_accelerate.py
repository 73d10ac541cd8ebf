"""gpt_single.py made distributed with Hugging Face Accelerate, as its migration guide says.

Changes from gpt_single.py, each one the guide's: Accelerator(mixed_precision=...),
accelerator.prepare(model, optimizer, loader, scheduler) (which wraps the model in DDP and
shards the loader), no manual .to(device) of batches, accelerator.backward(loss),
accelerator.clip_grad_norm_, accelerator.print. Launched with torchrun like the others;
--precision default means bf16 where the GPU has it (else fp16), fp32 means
mixed_precision="no".
"""

import argparse
import math

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader

from benchmodels import GPT, StepTimer, SyntheticTokens


def parse_args():
    parser = argparse.ArgumentParser(description="GPT training, Accelerate")
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


def mixed_precision(precision):
    if precision == "fp32" or not torch.cuda.is_available():
        return "no"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def main():
    args = parse_args()
    accelerator = Accelerator(mixed_precision=mixed_precision(args.precision))
    torch.manual_seed(1337)
    torch.set_float32_matmul_precision("high")

    # --smoke: a 2-layer, width-64 model on short sequences.
    vocab, seq_len, layers, width, heads = (
        (256, 32, 2, 64, 4) if args.smoke else (32000, args.seq_len, 12, 1024, 16)
    )
    model = GPT(vocab=vocab, seq_len=seq_len, layers=layers, width=width, heads=heads)
    train_set = SyntheticTokens(args.dataset_size, seq_len=seq_len, vocab=vocab)
    train_loader = DataLoader(
        train_set, batch_size=args.batch_size, shuffle=True, num_workers=args.workers
    )

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
    model, optimizer, train_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, scheduler
    )

    timer = StepTimer(args.batch_size, tag=f"gpt_accelerate_{args.precision}")
    it = 0
    for epoch in range(args.epochs):
        model.train()
        for x, y in train_loader:
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            optimizer.zero_grad(set_to_none=True)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), args.grad_clip)
            optimizer.step()
            scheduler.step()
            it += 1
            if it % args.log_interval == 0:
                accelerator.print(
                    f"epoch {epoch} iter {it} loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e}"
                )
            timer.step()
            if timer.done:
                break
        if timer.done:
            break
    accelerator.print(timer.report())
    accelerator.end_training()


if __name__ == "__main__":
    main()
