"""Conversion options shared by the CLI, pyproject.toml's [tool.ddpify] and verify."""

from __future__ import annotations

from dataclasses import dataclass

AMP_CHOICES = ("auto", "bf16", "fp16", "none", "apex")
OPT_LEVELS = ("O0", "O1", "O2", "O3")


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
    # functions that write files, beyond ddpify's table (ddpify/analysis/writes.py): "mylib.dump_results"
    writers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "writers", tuple(self.writers))
        if self.amp not in AMP_CHOICES:
            raise ValueError(f"amp must be one of {', '.join(AMP_CHOICES)}, not {self.amp!r}")
        if self.opt_level not in OPT_LEVELS:
            raise ValueError(f"opt_level must be one of {', '.join(OPT_LEVELS)}, not {self.opt_level!r}")
        object.__setattr__(self, "ignore", tuple(sorted({c.strip().upper() for c in self.ignore if c.strip()})))
