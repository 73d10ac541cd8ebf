"""The plans of the two-step concerns, declared in one place.

A concern's decide() is a function of the analysis, the options and the plans of earlier
concerns; it returns its plan, a frozen dataclass below, which the pipeline keeps as a field of
`Plans` (ctx.plans). Its emit() turns the plan into edits and findings. A later concern reads
the plan, never the edits: "which modules are made distributed, and where?" is `plans.wrap`.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ddpify.rules import Said


@dataclass(frozen=True)
class Wrap:
    """One module made distributed in place (torch's composable `replicate`)."""

    # the module as `site` names it: "model", "self.net", "self"
    module: str
    # the statement it goes before: the one that takes its parameters for its optimizer
    site: cst.BaseStatement
    # the model as the analysis names it (a.models), for findings and --optimize
    model: str
    # methods and submodules the training calls directly
    entries: tuple[str, ...] = ()
    # DDP keywords: ("find_unused_parameters", "True")
    options: tuple[tuple[str, str], ...] = ()
    # --sync-bn: BatchNorm converted to SyncBatchNorm first
    sync_bn: bool = False
    # after `site`: a model updated by hand (no optimizer) goes after its binding
    after: bool = False
    # "for m in models.values()": one module per item, where a comprehension binds it
    over: str = ""


@dataclass(frozen=True)
class WrapPlan:
    wraps: tuple[Wrap, ...] = ()
    # nn.DataParallel(...) calls to remove
    dataparallel: tuple[cst.Call, ...] = ()
    said: tuple[Said, ...] = ()

    def of(self, model: str) -> list[Wrap]:
        return [w for w in self.wraps if w.model == model]


@dataclass(frozen=True)
class DDPOptions:
    """--optimize: DDP keywords added to the wraps of `plans.wrap`, by model."""

    # (model, keyword, value)
    options: tuple[tuple[str, str, str], ...] = ()
    said: tuple[Said, ...] = ()


@dataclass
class Plans:
    """One field per two-step concern; None until its decide() ran."""

    wrap: WrapPlan | None = None
    ddp_buckets: DDPOptions | None = None
    static_graph: DDPOptions | None = None
