"""ddpify lint: static checks for PyTorch scripts that are already distributed (hand-written DDP,
or converted once and edited since): the bugs that otherwise cost a cluster job to find (a hang
at the NCCL timeout, ranks that silently train different models, a checkpoint that does not
load). It reuses the converter's analysis; each rule is a module of ddpify/lint/rules/ with its
codes (DDP200-DDP299) declared in the registry (ddpify/rules.py)."""

from ddpify.lint.engine import LintResult, lint_project, lint_source

__all__ = ["LintResult", "lint_project", "lint_source"]
