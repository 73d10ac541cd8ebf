"""Shared analysis of a training script, computed once per file.

It answers the questions every concern asks: which names are the models, optimizers,
schedulers and loaders; where the training step (forward, loss, backward, step) is; which
loop is the epoch loop; which functions run the model or a collective; where the entry
point is. Concerns read it and plan edits; none of them walks the tree for these facts again.

One module per question (each Analysis part is a mixin of core.Analysis):
  tree       child fields, codegen, dotted names, call arguments, climbing to statement/block/function
  walk       the one collecting walk: parents, pre-order, nodes by type, bindings; findall
  positions  node -> source range on demand, line numbers, `# ddpify: skip/off/on`
  names      qualified names through imports and scopes, is_call, locals, assignment targets
  apis       already distributed? distributed the legacy way (apex, --local_rank)?
  models     models, optimizers, schedulers; is_model_ref, is_optimizer_ref
  effects    runs_model, runs_collective (directly or through the script's functions)
  steps      training steps: backward, loss, forward, optimizer steps, micro-batch loops
  loaders    DataLoaders, their names and roles, where they are iterated
  batches    where a training batch comes from without a DataLoader (random draws, slices, an index)
  seeds      random draws before training with no seed; the outermost training loop
  loops      enclosing loop, branch owner, callers of a function, the main guard
  core       Analysis, composed of the parts above
Submodules import each other, never this package (no import cycles); this package only
re-exports, so `from ddpify.analysis import Analysis, codegen, dotted, ...` keeps working.
"""

from ddpify.analysis.apis import DISTRIBUTED_APIS, LEGACY_APIS
from ddpify.analysis.core import Analysis
from ddpify.analysis.loaders import EVAL_RE, LOADER_NAMES, TRAIN_RE, Loader
from ddpify.analysis.models import OPTIM_PREFIXES, OPTIM_RE, SCHED_RE
from ddpify.directives import OFF_RE, ON_RE, SKIP_RE
from ddpify.analysis.steps import Step
from ddpify.analysis.tree import (
    _WHITESPACE,
    SCOPES,
    _flatten_targets,
    call_args,
    child_fields,
    code,
    codegen,
    dotted,
)

__all__ = [
    "Analysis",
    "Loader",
    "Step",
    "call_args",
    "child_fields",
    "code",
    "codegen",
    "dotted",
    "DISTRIBUTED_APIS",
    "LEGACY_APIS",
    "LOADER_NAMES",
    "OPTIM_PREFIXES",
    "SCHED_RE",
    "OPTIM_RE",
    "EVAL_RE",
    "TRAIN_RE",
    "SCOPES",
    "SKIP_RE",
    "OFF_RE",
    "ON_RE",
    "_WHITESPACE",
    "_flatten_targets",
]
