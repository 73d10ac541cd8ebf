"""Train a text classifier on variable-length sequences on one GPU (benchmark fixture: the input to ddpify).

A 6-layer transformer encoder (width 512, 8 heads, about 35 M parameters) over token
sequences of 8 to 512 tokens, padded per batch to the longest one, with a padding mask and
masked mean pooling; 4 classes. AdamW with linear warm-up and gradient clipping. Unlike the
other two fixtures, every batch has its own shape and a step is short (a small model on
64 sequences), so per-step overheads weigh more. The only benchmark parts are StepTimer
(stop after BENCH_WARMUP + BENCH_STEPS steps, print the BENCH line) and --smoke.
"""

import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from benchmodels import StepTimer, SyntheticReviews, TextClassifier


def parse_args():
    parser = argparse.ArgumentParser(description="Text classifier training")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--warmup-iters", type=int, default=200)
    parser.add_argument("--grad-clip", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--dataset-size", type=int, default=100_000)
    parser.add_argument("--log-interval", type=int, default=50)
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


def main():
    args = parse_args()
    torch.manual_seed(0)
    torch.set_float32_matmul_precision("high")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

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
        shuffle=True,
        num_workers=args.workers,
        collate_fn=pad_batch,
        drop_last=True,
    )
    model = TextClassifier(
        vocab=vocab, max_len=max_len, layers=layers, width=width, heads=heads
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda it: min(1.0, (it + 1) / args.warmup_iters)
    )

    timer = StepTimer(args.batch_size, tag="text")
    step = 0
    for epoch in range(args.epochs):
        model.train()
        for tokens, pad_mask, labels in train_loader:
            tokens, pad_mask, labels = (
                tokens.to(device),
                pad_mask.to(device),
                labels.to(device),
            )
            logits = model(tokens, pad_mask)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            optimizer.step()
            scheduler.step()
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
