"""Models, synthetic datasets and the step timer shared by every benchmark variant.

All variants (single-GPU script, ddpify's output, hand-written DDP, Accelerate) import
the same model, dataset and timer from here, so they differ only in how they are made
distributed. Written for this project; no code is taken from torchvision or nanoGPT.
"""

from __future__ import annotations

import gc
import math
import os
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset

# Wall clock when the script reached its imports: the harness splits each launch's time into
# start-up, set-up, first step, warm-up, timed steps and exit with it.
IMPORTED_AT = time.time()

# ---------------------------------------------------------------- ResNet-50


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        # Zero-init of the last BN gamma: the usual ResNet training recipe.
        nn.init.zeros_(self.bn3.weight)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_ch),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = F.relu(self.bn2(self.conv2(out)), inplace=True)
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.shortcut(x), inplace=True)


class ResNet50(nn.Module):
    """The ResNet-50 layout (3, 4, 6, 3 bottlenecks); base_width=64 gives 25.6 M parameters."""

    def __init__(self, num_classes: int = 1000, base_width: int = 64) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, base_width, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(base_width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        layers = []
        in_ch = base_width
        for i, blocks in enumerate((3, 4, 6, 3)):
            width = base_width * 2**i
            for b in range(blocks):
                layers.append(
                    Bottleneck(in_ch, width, stride=2 if (b == 0 and i > 0) else 1)
                )
                in_ch = width * Bottleneck.expansion
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(in_ch, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class SyntheticImageNet(Dataset):
    """ImageNet-shaped data held in memory, with the usual CPU-side augmentation.

    A pool of random uint8 images (as if decoded and resized to 8/7 of crop_size) is reused;
    each item is a random crop, a random flip, a float conversion and a per-channel
    normalisation, done in the DataLoader workers as torchvision transforms would.
    """

    MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

    def __init__(
        self,
        length: int,
        crop_size: int = 224,
        pool: int = 256,
        num_classes: int = 1000,
    ) -> None:
        g = torch.Generator().manual_seed(0)
        stored = crop_size + crop_size // 7  # 224 -> 256, as after Resize(256)
        self.images = torch.randint(
            0, 256, (pool, 3, stored, stored), dtype=torch.uint8, generator=g
        )
        self.labels = torch.randint(0, num_classes, (pool,), generator=g)
        self.length = length
        self.crop = crop_size

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        img = self.images[index % len(self.images)]
        top, left = torch.randint(0, img.shape[1] - self.crop + 1, (2,)).tolist()
        img = img[:, top : top + self.crop, left : left + self.crop]
        if torch.rand(()) < 0.5:
            img = img.flip(2)
        img = (img.float().div_(255) - self.MEAN) / self.STD
        return img, self.labels[index % len(self.labels)]


# ---------------------------------------------------------------- GPT


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (
            z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Pre-LayerNorm decoder-only transformer with tied input/output embeddings."""

    def __init__(
        self,
        vocab: int = 32000,
        seq_len: int = 1024,
        layers: int = 12,
        width: int = 1024,
        heads: int = 16,
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                # GPT-2 style init; residual projections scaled by depth.
                std = (
                    0.02 / math.sqrt(2 * layers)
                    if name.endswith(("proj.weight", "mlp.2.weight"))
                    else 0.02
                )
                nn.init.normal_(p, mean=0.0, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class SyntheticTokens(Dataset):
    """A random token stream held in memory; item i is a (input, next-token target) window."""

    def __init__(
        self,
        length: int,
        seq_len: int = 1024,
        vocab: int = 32000,
        tokens: int = 1 << 22,
    ) -> None:
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, vocab, (tokens,), dtype=torch.int32, generator=g)
        self.length = length
        self.seq_len = seq_len

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        # A stride coprime-ish with the stream length spreads the windows over it.
        start = (index * 7919) % (len(self.data) - self.seq_len - 1)
        chunk = self.data[start : start + self.seq_len + 1].long()
        return chunk[:-1], chunk[1:]


# ---------------------------------------------------------------- text classifier


class TextClassifier(nn.Module):
    """Transformer encoder over padded token sequences, masked mean pooling, a linear head."""

    def __init__(
        self,
        vocab: int = 32000,
        max_len: int = 512,
        layers: int = 6,
        width: int = 512,
        heads: int = 8,
        classes: int = 4,
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width, padding_idx=0)
        self.pos = nn.Embedding(max_len, width)
        layer = nn.TransformerEncoderLayer(
            width,
            heads,
            4 * width,
            dropout=0.1,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        # Pre-norm layers take no nested-tensor fast path; saying so keeps the warning away.
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        # pad_mask: True where the position is padding.
        t = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
        x = self.norm(self.encoder(x, src_key_padding_mask=pad_mask))
        keep = (~pad_mask).unsqueeze(-1).to(x.dtype)
        pooled = (x * keep).sum(1) / keep.sum(1).clamp(min=1.0)
        return self.head(pooled)


class SyntheticReviews(Dataset):
    """Variable-length token sequences with a class label, held in memory.

    Lengths are log-normal (median 96 tokens), clipped to [8, max_len]: padding each batch to
    its longest sequence gives a different shape nearly every step. Item i is always the same.
    """

    def __init__(
        self,
        length: int,
        max_len: int = 512,
        vocab: int = 32000,
        classes: int = 4,
        median_len: int = 96,
    ) -> None:
        g = torch.Generator().manual_seed(0)
        lens = torch.exp(torch.randn(length, generator=g) * 0.6 + math.log(median_len))
        self.lengths = lens.round().clamp(8, max_len).long()
        self.offsets = torch.cat(
            [torch.zeros(1, dtype=torch.long), self.lengths.cumsum(0)]
        )
        # Token 0 is padding: real tokens are 1..vocab-1.
        self.tokens = torch.randint(
            1, vocab, (int(self.offsets[-1]),), dtype=torch.int32, generator=g
        )
        self.labels = torch.randint(0, classes, (length,), generator=g)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int):
        a, b = int(self.offsets[index]), int(self.offsets[index + 1])
        return self.tokens[a:b].long(), self.labels[index]


# ---------------------------------------------------------------- timing


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


class StepTimer:
    """Times optimizer steps after a warm-up and reports global samples/s.

    Call step() once per optimizer step; stop training when done is true; print report().
    BENCH_WARMUP steps are not timed, then BENCH_STEPS steps are, with a device
    synchronisation every BENCH_CHUNK steps (the per-chunk rates show the spread).
    Global rate = per-process samples x WORLD_SIZE / this process's elapsed time: the ranks
    of a DDP job run in lockstep, since every step all-reduces the gradients.
    BENCH_PROFILE=<dir> profiles the first BENCH_PROFILE_STEPS timed steps instead
    (timings from such a run are not comparable) and writes one table per rank.
    """

    def __init__(self, samples_per_step: int, tag: str = "run") -> None:
        self.samples_per_step = samples_per_step
        self.tag = tag
        self.warmup = _env_int("BENCH_WARMUP", 10)
        self.steps = _env_int("BENCH_STEPS", 40)
        self.chunk = max(1, _env_int("BENCH_CHUNK", 10))
        self.world = _env_int("WORLD_SIZE", 1)
        self.rank = _env_int("RANK", 0)
        self.count = 0
        self.marks: list[float] = []
        self.profile_dir = os.environ.get("BENCH_PROFILE", "")
        self.profile_steps = _env_int("BENCH_PROFILE_STEPS", 6)
        self.prof = None
        self.created_at = time.time()
        self.first_step_at = 0.0
        self.timed_from = 0.0
        self.ended_at = 0.0

    @staticmethod
    def _sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    @property
    def done(self) -> bool:
        return self.count >= self.warmup + self.steps

    def step(self) -> None:
        self.count += 1
        if self.count == 1:
            self.first_step_at = time.time()
        timed = self.count - self.warmup
        if timed == 0:
            self._sync()
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            self.marks.append(time.perf_counter())
            self.timed_from = time.time()
            if self.profile_dir:
                self._start_profile()
        elif timed > 0 and (timed % self.chunk == 0 or timed == self.steps):
            self._sync()
            self.marks.append(time.perf_counter())
            self.ended_at = time.time()
        if self.prof is not None and timed == self.profile_steps:
            self._stop_profile()

    def _start_profile(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + (
            [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
        )
        self.prof = profile(activities=acts)
        self.prof.__enter__()

    def _stop_profile(self) -> None:
        self._sync()
        self.prof.__exit__(None, None, None)
        os.makedirs(self.profile_dir, exist_ok=True)
        sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
        table = self.prof.key_averages().table(sort_by=sort, row_limit=40)
        path = os.path.join(self.profile_dir, f"{self.tag}.rank{self.rank}.txt")
        with open(path, "w") as f:
            f.write(
                f"# {self.tag} rank {self.rank}/{self.world}, {self.profile_steps} steps\n{table}\n"
            )
        self.prof = None

    def report(self) -> str:
        if len(self.marks) < 2:
            return f"BENCH error=too-few-steps steps_done={self.count} rank={self.rank}"
        elapsed = self.marks[-1] - self.marks[0]
        timed = self.count - self.warmup
        rate = timed * self.samples_per_step * self.world / elapsed
        chunks = []
        done = 0
        for a, b in zip(self.marks, self.marks[1:]):
            n = min(self.chunk, timed - done)
            done += n
            chunks.append(f"{n * self.samples_per_step * self.world / (b - a):.1f}")
        mem = (
            torch.cuda.max_memory_allocated() / 2**30
            if torch.cuda.is_available()
            else 0.0
        )
        # A multi-process figure means something only if gradients were synchronised.
        ddp = sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())
        return (
            f"BENCH samples_per_s={rate:.2f} world={self.world} rank={self.rank} "
            f"per_process_batch={self.samples_per_step} steps={timed} seconds={elapsed:.3f} "
            f"chunk_rates={','.join(chunks)} peak_mem_gib={mem:.2f} ddp_modules={ddp} "
            f"t_import={IMPORTED_AT:.3f} t_timer={self.created_at:.3f} t_step1={self.first_step_at:.3f} "
            f"t_timed={self.timed_from:.3f} t_end={self.ended_at:.3f}"
        )
