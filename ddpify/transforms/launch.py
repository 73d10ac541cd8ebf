"""Launch: ranks from torchrun's environment, process-group set-up at the entry point and
tear-down at its end, and the imports everything else needs. Runs last: it emits the set-up
code the other concerns asked for (ctx.helpers). No --local-rank flag is added: torchrun passes
none, and a new argument would change the script's --help and `vars(args)`; a script that had
the flag is a legacy one (legacy.py reads it from LOCAL_RANK)."""

from __future__ import annotations

import libcst as cst
import ddpify.match as m

from ddpify.analysis import dotted
from ddpify.transforms.base import IMPORTS, Context, Transform
from ddpify.rules import declare

# The codes this module raises (the registry: ddpify/rules.py).
declare(
    "DDP001",
    "process-group-setup",
    "process-group set-up added: ranks from torchrun's environment, set_device and init_process_group(device_id=...)",
    fix=True,
    check="ranks",
)
declare(
    "DDP003",
    "process-group-teardown",
    "process group destroyed when training ends",
    fix=True,
    check="ranks",
)
declare(
    "DDP156",
    "first-step-sync-check",
    "each optimizer's first step checks that every rank has the same gradients, and stops the run if not (a forward that runs no DDP hook)",
    fix=True,
    check="params-in-sync",
)
declare(
    "DDP120",
    "cpu-program",
    "the script never names a device: it stays a CPU program (gloo, no device_ids), also on a GPU machine",
    fix=True,
    check="devices",
)

RANKS = """\
# ddpify: torchrun sets these; a plain `python` run is rank 0 of 1.
LOCAL_RANK = int({os}.environ.get("LOCAL_RANK", 0))  # picks this process's GPU
RANK = int({os}.environ.get("RANK", 0))  # global rank: rank 0 alone writes
WORLD_SIZE = int({os}.environ.get("WORLD_SIZE", 1))
# with more processes than GPUs (verify on one GPU), they share them
LOCAL_DEVICE = {torch}.device("cuda", LOCAL_RANK % {torch}.cuda.device_count()) if {torch}.cuda.is_available() else {torch}.device("cpu")
"""
AMP = {
    "auto": """\
# ddpify: bf16 autocast where the GPU has it, else fp16 with loss scaling;
# full precision on CPU.
AMP_DTYPE = ({torch}.bfloat16 if {torch}.cuda.is_bf16_supported() else {torch}.float16) if {torch}.cuda.is_available() else None
""",
    "bf16": """\
# ddpify: bf16 autocast on GPUs (no loss scaling needed); full precision on CPU.
AMP_DTYPE = {torch}.bfloat16 if {torch}.cuda.is_available() else None
""",
    "fp16": """\
# ddpify: fp16 autocast with loss scaling on GPUs; full precision on CPU.
AMP_DTYPE = {torch}.float16 if {torch}.cuda.is_available() else None
""",
}
SCALER = """\
# one scaler for every optimizer
SCALER = {torch}.amp.GradScaler("cuda", enabled=AMP_DTYPE == {torch}.float16)
"""
# A script that never names a device (ctx.cpu_only) stays on the CPU: gloo whatever the machine,
# nothing that touches CUDA (no set_device, device_id or device_ids), so a GPU machine runs it too.
RANKS_CPU = """\
# ddpify: torchrun sets these; a plain `python` run is rank 0 of 1.
LOCAL_RANK = int({os}.environ.get("LOCAL_RANK", 0))  # this process's index on its machine
RANK = int({os}.environ.get("RANK", 0))  # global rank: rank 0 alone writes
WORLD_SIZE = int({os}.environ.get("WORLD_SIZE", 1))
# ddpify: the script never names a device, so it trains on the CPU, one process a rank.
LOCAL_DEVICE = {torch}.device("cpu")
"""
SETUP_CPU = '''\


def ddp_setup():
    """Join torchrun's process group over gloo; alone, form a group of one."""
    # gloo: the script trains on the CPU, also on a GPU machine
    if "MASTER_ADDR" in {os}.environ:
        {dist}.init_process_group("gloo")
    else:
        {dist}.init_process_group("gloo", store={dist}.HashStore(), rank=0, world_size=1)
    # gloo's worker threads may still free finished work (which needs the GIL) as
    # Python exits: a pause at exit, before finalization, lets them, or a rank can
    # abort (SIGABRT)
    import atexit
    import time

    atexit.register(time.sleep, 0.2)
'''
SETUP = '''\


def ddp_setup():
    """Join torchrun's process group (gloo, NCCL for CUDA); alone, a group of one."""
    backend, device_id = "gloo", None
    if {torch}.cuda.is_available():
        {torch}.cuda.set_device(LOCAL_DEVICE)
        # CUDA tensors go through NCCL, CPU ones through gloo: the script may keep its
        # model on the CPU
        backend, device_id = "cpu:gloo,cuda:nccl", LOCAL_DEVICE
        if int({os}.environ.get("LOCAL_WORLD_SIZE", 1)) > {torch}.cuda.device_count():
            # processes share a GPU: NCCL refuses that
            backend, device_id = "gloo", None
    if "MASTER_ADDR" in {os}.environ:
        {dist}.init_process_group(backend, device_id=device_id)
    else:
        {dist}.init_process_group(backend, store={dist}.HashStore(), rank=0, world_size=1, device_id=device_id)
    # gloo's worker threads may still free finished work (which needs the GIL) as
    # Python exits: a pause at exit, before finalization, lets them, or a rank can
    # abort (SIGABRT)
    import atexit
    import time

    atexit.register(time.sleep, 0.2)
'''
# Ends ddp_setup()'s body (SETUP, SETUP_CPU): ranks other than 0 print nothing, whatever writes
# to stdout (print, sys.stdout.write bars in helper modules, logging handlers, C code), as one
# rule at run time rather than a guard per call; stderr stays, so every rank's errors show.
QUIET_STDOUT = """\
    # only rank 0 writes to stdout; every rank keeps stderr for its errors
    if RANK != 0:
        import sys

        sys.stdout.flush()
        {os}.dup2({os}.open({os}.devnull, {os}.O_WRONLY), 1)
"""
# Ends ddp_setup()'s body where a model is made distributed: what the source cannot show (a
# forward that runs no DDP hook) shows at the first step, when every rank's gradients must agree.
SYNC_HOOK = """\
    if WORLD_SIZE > 1:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        # each optimizer's first step stops if the ranks' gradients differ
        register_optimizer_step_pre_hook(ddp_check_sync)
"""
SYNC_CHECK = '''\


def ddp_check_sync(optimizer, args, kwargs):
    """At an optimizer's first step, stop unless every rank has the same gradients."""
    # DDP averages what its forward hooks saw: a forward that runs none (a method or a
    # part of the model no module call reaches) would train copies that drift apart
    if getattr(optimizer, "ddp_checked", False):
        return
    optimizer.ddp_checked = True
    params = [p for group in optimizer.param_groups for p in group["params"]]
    # two figures a parameter: a sum alone can agree by chance (a softmax bias's is 0)
    grads = [p.grad.double() if p.grad is not None else {torch}.zeros(1) for p in params]
    sums = [float(x) for g in grads for x in (g.sum(), g.norm())]
    high = {torch}.tensor(sums, dtype={torch}.float64, device=LOCAL_DEVICE)
    low = -high
    {dist}.all_reduce(high, op={dist}.ReduceOp.MAX)
    {dist}.all_reduce(low, op={dist}.ReduceOp.MAX)
    differ = ((high + low).abs() > 1e-6 * (high.abs() + 1e-12)).tolist()
    apart = sorted({{i // 2 for i, d in enumerate(differ) if d}})
    if apart:
        shapes = ", ".join(str(tuple(params[i].shape)) for i in apart[:4])
        raise RuntimeError(
            f"ddpify: {{len(apart)}} of the {{len(params)}} parameters this optimizer "
            f"steps (shapes {{shapes}}) have different gradients on different ranks "
            "at its first step: their training forward runs none of DDP's hooks, so "
            "each rank would train its own copy"
        )
'''
DECIDES = '''\


# ddpify: a CPU tensor, sent over gloo, so a shared decision never waits for the GPU;
# kept for the whole run, so no gloo thread frees it (that needs the GIL: an abort at
# exit).
DECISION = {torch}.zeros(1, dtype={torch}.long)


def rank0_decides(flag):
    """Every rank follows rank 0's decision, so no rank leaves a loop alone."""
    DECISION.fill_(int(bool(flag)))
    {dist}.broadcast(DECISION, src=0)
    return bool(DECISION.item())
'''

SHARD = '''\


class RankShard({torch}.utils.data.IterableDataset):
    """This rank's share of a stream (and of its DataLoader worker's): one item in each
    round of WORLD_SIZE x workers; a last, incomplete round is dropped, so every rank
    yields as many items (and batches) as the others and none waits at a collective for
    a batch that never comes."""

    def __init__(self, stream, split_workers=True):
        self.stream = stream
        # False: the stream splits its workers itself
        self.split_workers = split_workers

    def __iter__(self):
        info = {torch}.utils.data.get_worker_info() if self.split_workers else None
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        size, mine, group = WORLD_SIZE * workers, RANK * workers + worker, []
        for item in self.stream:
            group.append(item)
            if len(group) == size:
                yield group[mine]
                group = []

    def __len__(self):
        return len(self.stream) // WORLD_SIZE

    def __getattr__(self, name):  # the stream's own attributes stay reachable
        if name.startswith("__") or name == "stream":
            raise AttributeError(name)
        return getattr(self.stream, name)
'''

SAMPLER_WRAPPER = '''\


class DistributedSamplerWrapper({torch}.utils.data.Sampler):
    """This rank's share of what a sampler yields (indices, or a batch sampler's
    batches): every WORLD_SIZE-th item from RANK on, a last incomplete round dropped,
    so every rank gets as many. The sampler draws from random state of its own, the
    same on every rank for an epoch (seed + epoch), so every rank sees the same
    sequence; set_epoch(epoch) draws another, and reaches the sampler too."""

    def __init__(self, sampler, rounds=64):
        self.sampler = sampler
        self.rounds = rounds  # items drawn ahead, in rounds of WORLD_SIZE
        self.epoch = 0
        # rank 0's draw (the script's seed decides it), the same on every rank; here,
        # where every rank builds the loader, so that a pass one rank makes alone (a
        # batch peeked at for a log) needs no other rank
        seed = {torch}.randint(2**62, (1,), dtype={torch}.long)
        if {dist}.is_initialized() and WORLD_SIZE > 1:
            {dist}.broadcast(seed, src=0)
        self.seed = int(seed)

    def __iter__(self):
        import random
        import sys

        np, seed = sys.modules.get("numpy"), self.seed + self.epoch
        state = (
            {torch}.Generator().manual_seed(seed).get_state(),
            random.Random(seed).getstate(),
            np and np.random.RandomState(seed % 2**32).get_state(),
        )
        items, size = None, self.rounds * WORLD_SIZE
        while True:
            # the sampler draws from its own state, whatever the training draws in
            # between on each rank
            state = self.swap(state)
            try:
                items = iter(self.sampler) if items is None else items
                chunk = [x for _, x in zip(range(size), items)]
            finally:
                state = self.swap(state)
            yield from chunk[RANK : len(chunk) - len(chunk) % WORLD_SIZE : WORLD_SIZE]
            if len(chunk) < size:
                return

    @staticmethod
    def swap(state):
        """Install state (torch, random, numpy) as the global one; return theirs."""
        import random
        import sys

        np = sys.modules.get("numpy")
        old = ({torch}.get_rng_state(), random.getstate(), np and np.random.get_state())
        {torch}.set_rng_state(state[0])
        random.setstate(state[1])
        if np is not None and state[2] is not None:
            np.random.set_state(state[2])
        return old

    def __len__(self):
        return len(self.sampler) // WORLD_SIZE

    def set_epoch(self, epoch):
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __getattr__(self, name):  # the sampler's own attributes stay reachable
        if name.startswith("__") or name == "sampler":
            raise AttributeError(name)
        return getattr(self.sampler, name)
'''


RANK_SHARE = '''\


def rank_share(batches):
    """This rank's contiguous share of pre-made batches (a range of offsets, a list, a
    tensor's rows): len // WORLD_SIZE of them on every rank, so every rank runs as many
    steps."""
    if not hasattr(batches, "__getitem__"):
        batches = list(batches)
    n = len(batches) // WORLD_SIZE
    return batches[RANK * n : (RANK + 1) * n]
'''

RANK_BATCHES = '''\


def rank_batches(batches):
    """This rank's batches of an iterator the script made: every WORLD_SIZE-th from RANK
    on; a last incomplete round is dropped, so every rank runs as many steps."""
    # one round at a time, drawn from random state of its own, the same on every rank
    return iter(DistributedSamplerWrapper(batches, rounds=1))
'''

RANK_ROWS = '''\


def rank_rows(index):
    """This rank's rows of a full-batch index (a boolean mask becomes its positions):
    every WORLD_SIZE-th from RANK on, so the ranks' mean gradients average to the whole
    batch's."""
    if isinstance(index, {torch}.Tensor) and index.dtype == {torch}.bool:
        index = index.nonzero().squeeze(1)
    return index[RANK::WORLD_SIZE]
'''

IN_FLOAT32 = '''\


def in_float32(op):
    """op in float32 with autocast off (BCE: autocast refuses it on GPUs)."""
    # its arguments (the model calls in them) still run under autocast

    def run(*args, **kwargs):
        def f32(v):
            return v.float() if isinstance(v, {torch}.Tensor) and v.is_floating_point() else v

        with {torch}.autocast(LOCAL_DEVICE.type, enabled=False):
            return op(*map(f32, args), **{{k: f32(v) for k, v in kwargs.items()}})

    return run
'''

NEXT_EPOCH = '''\


def next_epoch(loader):
    """A new pass over the loader: its distributed sampler's epoch goes up by one."""
    for attr in ("sampler", "batch_sampler"):  # a batch sampler of its own: the second
        sampler = getattr(loader, attr, None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(sampler.epoch + 1)
            return
'''

RANK0_VALUE = '''\


def rank0_value(read):
    """read() on rank 0, where the tracker exists (None elsewhere), and its value on
    every rank."""
    box = [read() if RANK == 0 else None]
    {dist}.broadcast_object_list(box, src=0)
    return box[0]
'''

RANK0_SEED = '''\


def rank0_seed():
    """Rank 0's fresh seed from the OS, on every rank: generators seeded alike."""
    # a CPU tensor over gloo: no wait for the GPU
    seed = {torch}.tensor([int.from_bytes({os}.urandom(8), "little") >> 2])
    {dist}.broadcast(seed, src=0)
    return int(seed.item())
'''


class LaunchTransform(Transform):
    name = "launch"

    def plan(self, ctx: Context) -> None:
        a = ctx.a
        names = {k: ctx.name(k) for k in ("os", "torch", "dist")}
        text = RANKS_CPU if ctx.cpu_only else RANKS
        if "amp" in ctx.helpers:
            text += AMP["auto" if ctx.opts.amp not in AMP else ctx.opts.amp]
            if "scaler" in ctx.helpers:
                text += SCALER
        text += SETUP_CPU if ctx.cpu_only else SETUP
        text += QUIET_STDOUT
        synced = bool(ctx.plans.wrap is not None and ctx.plans.wrap.wraps)
        if synced:
            text += SYNC_HOOK + SYNC_CHECK
            ctx.finding(
                prelude_end(ctx) or a.module.body[0],
                "DDP156",
                "each optimizer's first step checks that every rank has the same gradients (ddp_check_sync), and stops the run with an error if not: a training forward that runs none of DDP's hooks would otherwise train copies that drift apart",
                True,
            )
        if "rank0_decides" in ctx.helpers:
            text += DECIDES
        if "shard_stream" in ctx.helpers:
            text += SHARD
        if ctx.helpers & {"sampler_wrapper", "rank_batches"}:
            text += SAMPLER_WRAPPER
        if "rank_share" in ctx.helpers:
            text += RANK_SHARE
        if "rank_batches" in ctx.helpers:
            text += RANK_BATCHES
        if "rank_rows" in ctx.helpers:
            text += RANK_ROWS
        if "in_float32" in ctx.helpers:
            text += IN_FLOAT32
        if "rank0_seed" in ctx.helpers:
            text += RANK0_SEED
        if "next_epoch" in ctx.helpers:
            text += NEXT_EPOCH
        text += "".join(
            ctx.helper_texts
        )  # the concerns' own (wrapping.py: ddp_in_place)
        if "rank0_value" in ctx.helpers:
            text += RANK0_VALUE
        block = _statements(text.format(**names)) + ctx.setup_extra
        if ctx.preamble:
            block[0] = block[0].with_changes(
                leading_lines=[cst.EmptyLine(), *block[0].leading_lines]
            )
            block = [*ctx.preamble, *block]
        self._local_rank_flag(ctx)
        imports = [
            ctx.stmt(IMPORTS[k][0] + "\n")
            for k in IMPORTS
            if k in ctx.imports_needed and self._missing(ctx, k)
        ]
        first = block[0]
        block[0] = first.with_changes(
            leading_lines=[cst.EmptyLine(), *first.leading_lines]
        )
        anchor = prelude_end(ctx)
        if anchor is None:
            target = a.module.body[0]
            ctx.edits.before[target].extend(imports + block)
        else:
            ctx.edits.after[anchor].extend(imports + block)
        self._entry(ctx, anchor)
        ctx.finding(
            anchor or a.module.body[0],
            "DDP001",
            "process group set up from torchrun's LOCAL_RANK/RANK/WORLD_SIZE (ddp_setup)",
            True,
        )
        if ctx.cpu_only:
            ctx.finding(
                anchor or a.module.body[0],
                "DDP120",
                'the script never names a device, so it stays a CPU program: each rank is a CPU process (gloo, also on a GPU machine; torchrun gives each OMP_NUM_THREADS=1 unless set: share the cores, e.g. OMP_NUM_THREADS=cores/nproc); to train on GPUs, move the model and every batch with .to(device), device = torch.device("cuda"), and convert the original again',
                True,
            )

    def _missing(self, ctx: Context, key: str) -> bool:
        return IMPORTS[key][1] not in ctx._bound

    def _entry(self, ctx: Context, prelude: cst.BaseStatement | None) -> None:
        a = ctx.a
        dist = ctx.name("dist")
        guard = a.main_guard
        setup = ctx.stmt("ddp_setup()\n")
        destroy = ctx.stmt(f"{dist}.destroy_process_group()\n")
        console = ctx.console()
        if console and not self._module_level_work(ctx, guard):
            # a console script starts these functions after importing their module, without any
            # `__main__` block: the group lives inside each, and a block that calls one adds none
            for fn in console:
                self._inside(ctx, fn, setup, destroy)
            if guard is None or any(
                (dotted(c.func) or "").rsplit(".", 1)[-1]
                in {f.name.value for f in console}
                for c in ctx.a.findall(guard, m.Call())
            ):
                return
        if guard is not None and not self._module_level_work(ctx, guard):
            ctx.edits.prepend[guard].extend([setup, *ctx.after_setup])
            body = (
                list(guard.body.body)
                if isinstance(guard.body, cst.IndentedBlock)
                else []
            )
            last = body[-1] if body else None
            if last is not None and self._exits(last):
                self._exit_after_destroy(ctx, last, destroy)
            else:
                ctx.edits.append[guard].append(destroy)
            ctx.finding(
                guard, "DDP003", "process group destroyed when training ends", True
            )
            return
        if prelude is not None:
            ctx.edits.after[prelude].extend(
                [
                    setup.with_changes(
                        leading_lines=[cst.EmptyLine(), cst.EmptyLine()]
                    ),
                    *ctx.after_setup,
                ]
            )
        last = a.module.body[-1]
        if self._exits(last):
            self._exit_after_destroy(ctx, last, destroy)
        else:
            ctx.edits.after[last].append(
                destroy.with_changes(leading_lines=[cst.EmptyLine()])
                if not isinstance(last, cst.SimpleStatementLine)
                else destroy
            )
        ctx.finding(last, "DDP003", "process group destroyed when training ends", True)

    @staticmethod
    def _inside(ctx: Context, fn: cst.FunctionDef, setup, destroy) -> None:
        """ddp_setup() first in fn (after its docstring), the teardown before each return at its
        top level and at its end."""
        body = list(fn.body.body) if isinstance(fn.body, cst.IndentedBlock) else []
        if not body:
            return
        first = body[0]
        doc = (
            isinstance(first, cst.SimpleStatementLine)
            and isinstance(first.body[0], cst.Expr)
            and isinstance(
                first.body[0].value, (cst.SimpleString, cst.ConcatenatedString)
            )
        )
        if (
            doc
        ):  # after the docstring, before anything planned at the body's first statement
            ctx.edits.after[first].extend([setup, *ctx.after_setup])
        else:
            ctx.edits.prepend[fn].extend([setup, *ctx.after_setup])
        for stmt in body:
            if isinstance(stmt, cst.SimpleStatementLine) and isinstance(
                stmt.body[0], cst.Return
            ):
                ctx.edits.before[stmt].append(destroy)
        if not (
            isinstance(body[-1], cst.SimpleStatementLine)
            and isinstance(body[-1].body[0], cst.Return)
        ):
            ctx.edits.append[fn].append(destroy)
        what = (
            "which its decorator runs when the file is run as a script"
            if fn.name.value in ctx._run_by_decorator()
            else "which a console script of the project starts"
        )
        ctx.finding(
            fn,
            "DDP003",
            f"process group set up and destroyed inside `{fn.name.value}()`, {what}",
            True,
        )

    def _exit_after_destroy(
        self, ctx: Context, last: cst.SimpleStatementLine, destroy
    ) -> None:
        # sys.exit(main()): run main() first, then tear down, then exit with its status
        call = last.body[0].value
        arg = call.args[0].value if call.args else None
        if arg is None:
            ctx.edits.before[last].append(destroy)
            return
        ctx.edits.before[last].append(
            cst.SimpleStatementLine(
                [cst.Assign([cst.AssignTarget(cst.Name("exit_status"))], arg)]
            )
        )
        ctx.edits.before[last].append(destroy)
        ctx.edits.replace(arg, cst.Name("exit_status"))

    @staticmethod
    def _exits(stmt: cst.BaseStatement) -> bool:
        return (
            isinstance(stmt, cst.SimpleStatementLine)
            and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, cst.Call)
            and dotted(stmt.body[0].value.func)
            in ("sys.exit", "exit", "quit", "os._exit")
        )

    def _module_level_work(self, ctx: Context, guard: cst.If) -> bool:
        """True when code outside the main guard needs the process group at import time."""
        a = ctx.a
        anchors = _wrap_sites(ctx) + [ld.stmt for ld in getattr(ctx, "sharded", [])]
        anchors += [a.statement(c) for c in a.calls if a.is_call(c, "torch.load")]
        anchors += [s.stmt for s in a.steps]
        anchors += ctx.barrier_stmts + ctx.setup_before
        for s in anchors:
            if a.function_of(s) is None and not _inside(a, s, guard):
                return True
        return False

    @staticmethod
    def _local_rank_flag(ctx: Context) -> None:
        """A script's own --local_rank flag accepts both spellings, its default LOCAL_RANK (the
        legacy launcher); a fresh conversion adds no flag (torchrun sets LOCAL_RANK)."""
        if ctx.a.local_rank_flag is not None:
            from ddpify.transforms.legacy import fix_launch

            fix_launch(ctx)


def _wrap_sites(ctx: Context) -> list[cst.BaseStatement]:
    """The statements the models are made distributed with."""
    return [w.site for w in ctx.plans.wrap.wraps] if ctx.plans.wrap is not None else []


# The set-up block's text is one of a few per option set: parsed once per text (a parse of it
# is most of this planner's time); each conversion gets statements of its own (edits and lists
# of statements go by identity), sharing the unchanging nodes inside.
_BLOCKS: dict[str, list[cst.BaseStatement]] = {}


def _statements(text: str) -> list[cst.BaseStatement]:
    got = _BLOCKS.get(text)
    if got is None:
        if len(_BLOCKS) >= 256:
            _BLOCKS.clear()
        # a leading statement keeps the block's first comment out of the module header
        got = _BLOCKS[text] = list(cst.parse_module("pass\n" + text).body)[1:]
    return [s.with_changes() for s in got]


def prelude_end(ctx: Context) -> cst.BaseStatement | None:
    """The last of the leading imports: the set-up block goes after it (None: before everything)."""
    a = ctx.a
    body = a.module.body
    last = None
    # the first top-level statement of the entry that needs the group (a wrap, a sharded loader,
    # a barrier, a training step): the set-up goes before it, whatever is imported later
    needs = (
        _wrap_sites(ctx)
        + [ld.stmt for ld in getattr(ctx, "sharded", [])]
        + ctx.barrier_stmts
    )
    needs += ctx.setup_before + [st.stmt for st in a.steps]
    top = {id(s): k for k, s in enumerate(body)}
    first = len(body)
    for node in needs:
        cur = node
        while cur is not None and id(cur) not in top:
            cur = a.parent.get(cur)
        if cur is not None and a.region_of(cur) == 0:
            first = min(first, top[id(cur)])
    for k, s in enumerate(body):
        # the first definition or loop ends the leading imports: an import after a training loop
        # is not where the group may be set up
        if (
            k >= first
            or isinstance(
                s, (cst.FunctionDef, cst.ClassDef, cst.For, cst.While, cst.With)
            )
            or s is a.main_guard
        ):
            break
        if isinstance(s, cst.SimpleStatementLine) and any(
            isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body
        ):
            last = s
    if last is None:
        for s in body:
            if isinstance(s, cst.SimpleStatementLine) and any(
                isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body
            ):
                last = s
    return last


def _inside(a, node, container) -> bool:
    cur = a.parent.get(node)
    while cur is not None:
        if cur is container:
            return True
        cur = a.parent.get(cur)
    return False
