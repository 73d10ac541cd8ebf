"""Conversion options shared by the CLI, pyproject.toml's [tool.ddpify] and verify."""

from __future__ import annotations

from dataclasses import dataclass

AMP_CHOICES = ("auto", "bf16", "fp16", "none", "apex")
OPT_LEVELS = ("O0", "O1", "O2", "O3")
# --optimize: the speed-ups ddpify may add where a static check shows them safe (opt-in).
OPTIMIZATIONS = (
    "channels-last",
    "fused-optimizer",
    "ddp-buckets",
    "static-graph",
    "cudnn-benchmark",
    "loader-workers",
)
# --scale-lr: how the learning rate follows the global batch (batch_size x WORLD_SIZE)
SCALE_LR_CHOICES = ("linear",)


def parse_optimize(value) -> tuple[str, ...]:
    """--optimize / [tool.ddpify] optimize: True or "all" for every speed-up, a comma-separated
    string or a list for some, False / "" / None for none."""
    if value is True or value == "all":
        return OPTIMIZATIONS
    if not value:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(x).strip() for x in items if str(x).strip()]
    if "all" in names:
        return OPTIMIZATIONS
    bad = [n for n in names if n not in OPTIMIZATIONS]
    if bad:
        raise ValueError(
            f"optimize: unknown speed-up {bad[0]!r} (known: all, {', '.join(OPTIMIZATIONS)})"
        )
    return tuple(o for o in OPTIMIZATIONS if o in names)


@dataclass(frozen=True)
class Options:
    # auto: bf16 where the GPU has it, else fp16 + GradScaler, off on CPU (decided at run time).
    amp: str = "auto"
    sync_bn: bool = False
    # Evaluation loaders stay unsharded by default so metrics stay exact.
    shard_eval: bool = False
    opt_level: str = "O1"  # apex target only
    # Codes never reported (so never blocking): [tool.ddpify] ignore, --ignore.
    ignore: tuple[str, ...] = ()
    # Convert even when a blocking finding remains (the exit status still says so).
    partial: bool = False
    # a --partial draft raises where a blocking finding remains (off inside project mode, which
    # marks each file after the split)
    mark_unresolved: bool = True
    # project mode: (file index, function) each console script of the project starts (a single
    # file reads its own from the project's pyproject.toml/setup.py/setup.cfg)
    console: tuple[tuple[int, str], ...] | None = None
    # functions that write files, beyond ddpify's table (ddpify/analysis/writes.py): "mylib.dump_results"
    writers: tuple[str, ...] = ()
    # --optimize: verified-safe speed-ups to add (names from OPTIMIZATIONS); () adds none
    optimize: tuple[str, ...] = ()
    # the project's line length ([tool.ruff]/[tool.black] line-length): lines the conversion
    # writes are wrapped to it as black and ruff would (ddpify/line_length.py); 0: not wrapped
    line_length: int = 88
    # the single-GPU training dynamics, on request (transforms/batch_scale.py); the default keeps
    # batch_size per process (the global batch grows with WORLD_SIZE, DDP026):
    # --keep-global-batch divides each training DataLoader's batch_size by WORLD_SIZE;
    # --scale-lr linear multiplies the optimizers' learning rates by WORLD_SIZE instead
    keep_global_batch: bool = False
    scale_lr: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "writers", tuple(self.writers))
        object.__setattr__(self, "optimize", parse_optimize(self.optimize))
        if self.amp not in AMP_CHOICES:
            raise ValueError(
                f"amp must be one of {', '.join(AMP_CHOICES)}, not {self.amp!r}"
            )
        if self.opt_level not in OPT_LEVELS:
            raise ValueError(
                f"opt_level must be one of {', '.join(OPT_LEVELS)}, not {self.opt_level!r}"
            )
        if self.scale_lr is not None and self.scale_lr not in SCALE_LR_CHOICES:
            raise ValueError(
                f"scale_lr must be one of {', '.join(SCALE_LR_CHOICES)}, not {self.scale_lr!r}"
            )
        if self.keep_global_batch and self.scale_lr is not None:
            raise ValueError(
                "keep_global_batch and scale_lr exclude each other: keep the global batch, or scale the learning rate to the larger one"
            )
        object.__setattr__(
            self,
            "ignore",
            tuple(sorted({c.strip().upper() for c in self.ignore if c.strip()})),
        )
