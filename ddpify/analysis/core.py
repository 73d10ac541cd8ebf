"""Analysis: one object per file, composed of one part per question (the mixins below, one
module each), computed once by one walk; the concerns read it and plan edits.
"""

from __future__ import annotations

import libcst as cst
from ddpify.analysis.apis import APEX_APIS, DISTRIBUTED_APIS, ApisMixin
from ddpify.analysis.batches import BatchesMixin
from ddpify.analysis.effects import EffectsMixin
from ddpify.analysis.loaders import LoadersMixin
from ddpify.analysis.loops import LoopsMixin
from ddpify.analysis.manual import ManualUpdatesMixin
from ddpify.analysis.models import ModelsMixin
from ddpify.analysis.names import NamesMixin
from ddpify.analysis.kernels import compiled_lines
from ddpify.analysis.rank_tests import RankTests
from ddpify.analysis.project import ProjectMixin
from ddpify.analysis.seeds import SeedsMixin
from ddpify.analysis.positions import _NOT_ROUND_TRIP, PositionsMixin, _Positions
from ddpify.analysis.steps import StepsMixin
from ddpify.analysis.tree import TreeMixin, call_args, dotted
from ddpify.analysis.walk import WalkMixin
from ddpify.directives import skipped_lines


class Analysis(
    TreeMixin,
    WalkMixin,
    PositionsMixin,
    NamesMixin,
    ApisMixin,
    ModelsMixin,
    EffectsMixin,
    StepsMixin,
    LoadersMixin,
    LoopsMixin,
    ManualUpdatesMixin,
    BatchesMixin,
    SeedsMixin,
    ProjectMixin,
):
    def __init__(self, module: cst.Module, source: str | None = None) -> None:
        # source: the text module was parsed from (its codegen, which need not be run again:
        # positions and line numbers are those of the codegen)
        self.module = module
        # parents, name bindings and import aliases come from our own collecting walk
        # scope node (None: the module) -> name -> what binds it there: an import's full
        # dotted path, or "<value>" for anything else (assignment, def, class, parameter, ...)
        self.bindings: dict[int | None, dict[str, list[str]]] = {None: {}}
        self.parent: dict[cst.CSTNode, cst.CSTNode] = {}
        text = (
            module.code if source is None or _NOT_ROUND_TRIP.search(source) else source
        )
        self.pos = _Positions(
            module, text, self.parent
        )  # like LibCST's PositionProvider, on demand
        self._qcache: dict[int, set[str]] = {}
        self._binders: dict[str, set[int | None]] | None = (
            None  # name -> scopes that bind it
        )
        self._chains: dict[
            int, list[int | None]
        ] = {}  # scope node -> _scope_chain of its nodes
        self.kids: dict[int, list[cst.CSTNode]] = {}
        self._order: dict[int, int] = {}  # node -> position in a pre-order walk
        self._bytype: dict[
            type, list[cst.CSTNode]
        ] = {}  # analysed nodes by exact type, in pre-order
        self._index: dict[type, tuple[list[int], list[cst.CSTNode]]] = {}
        self._skipped_lines = skipped_lines(
            text
        )  # `# ddpify: skip` / `off` ... `on` comments
        # compiled code (a triton kernel, extension sources) is left as it is, like skipped lines
        self._skipped_lines |= compiled_lines(text)
        self._rank_tests: RankTests | None = None

        self.calls: list[cst.Call] = []
        self.functions: dict[str, list[cst.FunctionDef]] = {}
        self.classes: dict[str, cst.ClassDef] = {}
        self.fors: list[cst.For] = []
        self.whiles: list[cst.While] = []
        self.assigns: list[cst.CSTNode] = []
        self._param_cache: dict[int, list[str]] = {}
        self._values_by_scope: (
            dict[tuple[int, str], list[cst.BaseExpression]] | None
        ) = None
        self.attributes: list[cst.Attribute] = []
        self.withs: list[cst.With] = []
        self.ifs: list[cst.If] = []
        self._collect()

        self.local_rank_flag = self._local_rank_flag()  # the script's own --local_rank
        self.apex_api = self._find_api(
            APEX_APIS
        )  # first use of apex (amp, optimizers, SyncBN, DDP)
        self.apex_amp = self._uses_apex_amp()
        # what distributes it: a process group, a DDP wrapper, a framework, the launcher's rank for the device
        self.distributed_api = self._find_api(
            DISTRIBUTED_APIS
        ) or self._launcher_device(self.local_rank_flag)
        self.legacy_api = self.apex_api or self.local_rank_flag
        self.optimizers: dict[str, cst.Call] = {}
        self.optimizer_calls: list[cst.Call] = []  # every optimizer construction
        self.schedulers: set[str] = set()
        self.models: list[str] = []
        self.model_aliases: dict[
            str, set[str]
        ] = {}  # model -> its factory's own names for it
        self._find_optimizers_and_models()
        self._follow_factories()
        self.manual_updates = (
            self._find_manual_updates()
        )  # no optimizer: p.data.add_(p.grad, ...)
        self.models += [
            n
            for n in dict.fromkeys(n for _, n in self.manual_updates)
            if n not in self.models
        ]
        self.dataparallel_calls = [
            c
            for c in self.calls
            if self.is_call(
                c,
                "torch.nn.DataParallel",
                "torch.nn.parallel.DataParallel",
                "torch.nn.parallel.data_parallel.DataParallel",
            )
        ]
        self.functional_dp_calls = [
            c
            for c in self.calls
            if self.is_call(
                c,
                "torch.nn.parallel.data_parallel",
                "torch.nn.parallel.data_parallel.data_parallel",
            )
        ]
        for c in self.dataparallel_calls:
            pos, _ = call_args(c)
            name = dotted(pos[0].value) if pos else None
            if name and name not in self.models:
                self.models.append(name)
        self.model_bindings = self._propagate(self.models)
        self.forward_functions = self._functions_matching(self._is_forward_call)
        self.collective_functions = self._functions_matching(self._is_collective_call)
        self.steps = self._program_steps()
        if (
            self._hand_to_classes()
        ):  # the model is a trainer's self.model: find its forwards again
            self.model_bindings = self._propagate(self.models)
            self.forward_functions = self._functions_matching(self._is_forward_call)
            self.steps = self._program_steps()
        self.loaders = [
            ld for ld in self._find_loaders() if not self.unused_in_project(ld.call)
        ]
        self.main_guard = self._find_main_guard()
        self.existing_amp = any(
            self.is_call(
                c,
                "torch.autocast",
                "torch.cuda.amp.autocast",
                "torch.amp.autocast",
                "torch.cpu.amp.autocast",
                "torch.cuda.amp.GradScaler",
                "torch.amp.GradScaler",
                "torch.GradScaler",
            )
            for c in self.calls
        )

    def hand_guarded(self, node: cst.CSTNode) -> bool:
        """node sits under the script's own rank-0 test (`if dist.get_rank() == 0:`,
        `if is_main_process():`; analysis/rank_tests.py): it runs on one rank already."""
        if self._rank_tests is None:
            self._rank_tests = RankTests(self.pos.source)
        if not self._rank_tests.lines:
            return False
        return self.pos.start(node).line in self._rank_tests.lines

    def _program_steps(self):
        """The training steps this program runs: in a project, a step in code of an imported
        module that nothing runs (an inference script importing the model class from the
        training script) is not one."""
        steps = self._find_steps()
        if self.several_files():
            steps = [s for s in steps if not self.unused_in_project(s.stmt)]
        return steps
