"""Checkpoints, and a symlink to the latest one, are written where the local rank is 0.

Source: https://github.com/NVIDIA/DeepLearningExamples/issues/1092
Cause, as stated there: the training script uses local_rank to decide who saves checkpoints, so
on several nodes each node saves, and two nodes racing to create the "last checkpoint" symlink
fail with FileExistsError; save by global rank instead.
Kind: crash (multi-node). Family: writer-local-rank.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def save_checkpoint(model, optimizer, epoch, local_rank, output_dir):
    if local_rank != 0:
        return
    checkpoint_path = os.path.join(output_dir, f"checkpoint_Tacotron2_{epoch}.pt")
    torch.save({"epoch": epoch, "state_dict": model.module.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint_path)  # expect: writer-local-rank
    symlink_src = os.path.basename(checkpoint_path)
    symlink_dst = os.path.join(output_dir, "checkpoint_Tacotron2_last.pt")
    if os.path.lexists(symlink_dst):
        os.remove(symlink_dst)
    print("Updating symlink", symlink_dst, "to point to", symlink_src)
    os.symlink(symlink_src, symlink_dst)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("gloo")
    model = DDP(nn.GRU(8, 16, batch_first=True))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = TensorDataset(torch.randn(32, 5, 8), torch.randn(32, 5, 16))
    sampler = DistributedSampler(data)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=4, sampler=sampler):
            out, _ = model(x)
            optimizer.zero_grad()
            nn.functional.mse_loss(out, y).backward()
            optimizer.step()
        save_checkpoint(model, optimizer, epoch, local_rank, args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
