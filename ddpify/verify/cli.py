"""`ddpify verify`: run the original and the distributed script, and prove the conversion with figures.

Exit status: 0 every check passed, 1 a check failed, 2 the script could not be run at all.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import click

from ddpify.verify import report
from ddpify.verify.checks import (
    FAIL,
    Check,
    Context,
    Sources,
    check_optimized,
    run_checks,
    verdict,
)
from ddpify.verify.plan import (
    AUTO_TIMEOUT_FIRST,
    Length,
    Plan,
    auto_timeout,
    gpu_ids,
    needs_gpu_hint,
    plan_processes,
)
from ddpify.verify.prepare import (
    CannotRun,
    Prepared,
    convert_single,
    prepare,
    torch_missing,
)
from ddpify.verify.runner import RunResult, launch
from ddpify.verify.workspace import remove_new, snapshot, written_files

SCHEMA = 1  # of the --json document; raised when a key changes meaning


@dataclass
class VerifyOutcome:
    exit_code: int
    checks: list[Check] = field(default_factory=list)
    document: dict = field(default_factory=dict)


def _progress_printer(
    note: Callable[[str], None], label: str, timeout_of: Callable[[], float]
):
    def progress(
        result: RunResult, stalled_for: float, steps: dict[int, int], final: bool
    ) -> None:
        if final:
            return
        if len(steps) == 1:
            reached = f"step {steps[0]}"
        elif len(set(steps.values())) == 1:
            reached = f"step {next(iter(steps.values()))} on all {len(steps)} ranks"
        else:
            reached = "steps " + ", ".join(
                f"rank {r}: {s}" for r, s in sorted(steps.items())
            )
        left = max(0.0, timeout_of() - stalled_for)
        note(
            f"  {label}: {int(time.monotonic() - t0[0])} s, {reached}; a hang is declared after {left:.0f} s more without progress"
        )

    t0 = [time.monotonic()]
    return progress


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _removal_note(writes: list[dict], files: list[str], folders: list[str]) -> str:
    """What the baseline wrote and what of it was removed: the count agrees with the saved row's."""
    wrote = written_files(writes)
    if not files and not folders:
        return f"  baseline: wrote {_plural(wrote, 'file')}, {'it was' if wrote == 1 else 'all were'} there before it: nothing removed"
    removed = f"removed {'it' if len(files) == 1 == wrote else _plural(len(files), 'new file')}"
    if folders:
        removed += f" and {_plural(len(folders), 'new folder')}"
    kept = wrote - len(files)
    if kept > 0 and files:
        removed += f" ({kept} already there before it, kept)"
    return f"  baseline: wrote {_plural(wrote, 'file')}; {removed}, so the candidate starts from the same files"


def run_verify(
    script: str,
    script_args: list[str] | tuple[str, ...] = (),
    *,
    nproc: int | None = None,
    steps: int | None = None,
    backend: str = "auto",
    timeout: float | None = None,
    nnodes: int = 1,
    epochs: int | None = None,
    show_output: bool = False,
    json_path: str | None = None,
    baseline: bool = True,
    convert: bool = True,
    options=None,
    keep: bool = False,
    min_scaling: float | None = None,
    converter: Callable | None = None,
    echo: Callable[[str], None] = click.echo,
    colour: bool = False,
    compare_plain: bool = False,
    share_gpus: bool | None = None,
    to_end: bool = False,
    html_path: str | None = None,
    max_batches: int | None = None,
    max_time: float | None = None,
    plain_run: bool | None = None,
    other_scripts: bool = True,
) -> VerifyOutcome:
    """compare_plain (with options.optimize): also run the plain conversion (no --optimize) as
    N processes, and check that the optimised one trains the same (the optimize-parity check).
    share_gpus: None lets the ranks share the GPUs when there are fewer than processes.
    steps, epochs, to_end: K steps, E whole epochs, or the script's end; none of them: two passes
    over each rank's shard, each DataLoader pass capped at max_batches and the run at max_time.
    plain_run: also run a converted script as a plain `python` process, a world of one (None: when
    it was converted). other_scripts: run the project's other entry scripts that import a changed
    module with --help (or their dry-run flag).
    html_path: also write the report as one HTML page (ddpify/verify/html.py)."""
    from ddpify import Options

    script_path = Path(script).resolve()
    token = uuid.uuid4().hex
    run_dir = Path(tempfile.mkdtemp(prefix="ddpify-verify-"))
    length = Length.choose(steps, epochs, to_end, max_batches, max_time)
    steps, epochs = length.steps, length.epochs
    doc: dict = {
        "schema": SCHEMA,
        "script": str(script),
        "script_args": list(script_args),
        "steps": None if to_end else steps,
        "epochs": epochs,
        "to_end": to_end,
        "default_length": length.auto,
        "max_batches": length.max_batches,
        "max_time": length.max_time,
        "nnodes": nnodes,
        "timeout": timeout if timeout is not None else "auto",
        "run_token": token,
    }

    def note(msg: str) -> None:
        echo(msg, err=True) if echo is click.echo else echo(msg)

    runs: list[RunResult] = []
    prep: Prepared | None = None
    sources: Sources | None = None

    def finish(outcome: VerifyOutcome) -> VerifyOutcome:
        outcome.document = doc
        doc["exit_code"] = outcome.exit_code
        doc["checks"] = [c.to_dict() for c in outcome.checks]
        if show_output:
            for run in runs:
                echo(report.script_output(run))
        # Every path the document names must exist once verify is done (or say that it is gone).
        doc["run_dir"] = str(run_dir) if keep else None
        if prep is not None and prep.converted:
            doc["ran"] = prep.exec_path if keep else None
            doc["converted_copy"] = (
                f"kept in {run_dir}"
                if keep
                else "removed with verify's run folder (--keep keeps it)"
            )
        if json_path == "-":
            sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
            sys.stdout.flush()
        elif json_path:
            Path(json_path).write_text(json.dumps(doc, indent=2, default=str) + "\n")
        if (
            html_path
        ):  # before the run folder goes: a FAIL's lines may be in the converted copy
            from ddpify.verify import html

            Path(html_path).write_text(
                html.page(doc, runs, outcome.checks, sources), encoding="utf-8"
            )
            note(f"HTML report written to {html_path}")
        if keep:
            note(f"run directory kept: {run_dir}")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
        return outcome

    try:
        missing = torch_missing()
        if missing:
            raise CannotRun(missing)
        prep = prepare(script_path, options or Options(), run_dir, convert, converter)
        doc.update(conversion=prep.status, ran=prep.exec_path)
        plain_path = None
        if compare_plain and convert:
            plain, _ = convert_single(
                script_path,
                script_path.read_text(),
                replace(options or Options(), optimize=()),
                converter,
            )
            if (
                plain is None
                or not prep.converted
                or plain == Path(prep.exec_path).read_text()
            ):
                raise CannotRun(
                    "--optimize changed nothing in this script: there is no optimised conversion to compare"
                )
            plain_path = str(run_dir / f"{script_path.stem}.plain.py")
            Path(plain_path).write_text(plain)
        plan = plan_processes(nproc, backend, nnodes, share_gpus)
        doc.update(nproc=plan.nproc, backend=plan.backend, shared_gpus=plan.shared)
    except (CannotRun, OSError) as exc:
        echo(f"ddpify verify: {exc}")
        doc["error"] = str(exc)
        if str(exc).startswith("converter failure"):
            doc["error_kind"] = "converter"
        elif str(exc).startswith("torch is not installed"):
            doc["error_kind"] = "no-torch"
        return finish(VerifyOutcome(2))

    sources = Sources(prep.copies, prep.roots, prep.user_root)
    if prep.converted:
        what = "converted to a temporary copy" + (
            " (the whole project)" if prep.roots else ""
        )
    elif prep.status == "--no-convert":
        what = "run as it is (--no-convert)"
    else:
        what = f"run as it is ({prep.status})"
    echo(
        f"ddpify verify {report.short_path(str(script_path))}: {what}, {plan.describe(nnodes)}, {length.describe()}"
    )
    if plan.shared:
        note(
            "  the ranks share the GPU"
            + ("s" if plan.shared > 1 else "")
            + ": placement, precision and synchronisation are checked; throughput figures mean nothing"
        )
    world = plan.nproc * nnodes
    args = list(script_args)
    current_timeout = [timeout if timeout is not None else AUTO_TIMEOUT_FIRST]
    base_run: RunResult | None = None
    if baseline:
        base_run, early = _run_baseline(
            script_path, args, steps, epochs, prep, plan, run_dir, token, current_timeout, note, echo, length.env(),
        )  # fmt: skip
        runs.append(base_run)
        doc["baseline"] = report.run_summary(base_run)
        if early is not None:
            return finish(VerifyOutcome(early))
        if (base_run.records.get(0) or {}).get("status") not in ("stopped", "finished"):
            base_run = None  # crashed as DDP will: the candidate shows it rank by rank
        if timeout is None:
            current_timeout[0] = auto_timeout(base_run)
    doc["timeout_s"] = current_timeout[0]

    extra = {"DDPIFY_VERIFY_USER_ROOT": prep.user_root, **length.env()}
    if prep.roots:
        copy_root, user_root = next(iter(prep.roots.items()))
        extra.update(
            DDPIFY_VERIFY_USER_ROOT=copy_root, DDPIFY_VERIFY_ORIGINAL_ROOT=user_root
        )
    single = None
    if plain_run if plain_run is not None else prep.converted:
        single = _run_single(
            script_path, args, steps, epochs, prep, plan, run_dir, token, current_timeout, note, extra,
        )  # fmt: skip
        runs.append(single)
        doc["single"] = report.run_summary(single, sources.rewrite)
    how = (
        f"{nnodes} torchrun agents (c10d rendezvous on 127.0.0.1), {plan.nproc} processes each"
        if nnodes > 1
        else f"torchrun, {plan.nproc} processes"
    )
    note(
        f"  candidate: {how} (hang after {current_timeout[0]:g} s without progress) ..."
    )
    node_gpus = (
        gpu_ids() if nnodes > 1 and not plan.hide_gpus and not plan.shared else None
    )
    cand = launch(
        "candidate", prep.exec_path, prep.main_file, args, plan.nproc, steps, current_timeout[0], run_dir / "candidate", token,
        plan.hide_gpus, nnodes=nnodes, epochs=epochs, progress=_progress_printer(note, "candidate", lambda: current_timeout[0]),
        node_gpus=node_gpus, extra_env=extra,
    )  # fmt: skip
    runs.append(cand)
    doc["candidate"] = report.run_summary(cand, sources.rewrite)
    reached = sorted({cand.heartbeats.get(r, (0,))[0] for r in range(world)})
    note(
        f"  candidate: done in {cand.wall_s:.1f} s, step {'/'.join(map(str, reached))} reached"
    )
    others = []
    if other_scripts and prep.roots:
        from ddpify.verify.others import run_other_scripts

        others = run_other_scripts(prep, note)
        doc["other_scripts"] = others

    ctx = Context(
        cand, base_run, world, steps, prep.exec_path, timeout=current_timeout[0], min_scaling=min_scaling, nnodes=nnodes,
        epochs=epochs, sources=sources, shared_gpus=plan.shared, to_end=to_end, length=length, single=single,
        others=others, on_cpu=plan.hide_gpus or not plan.gpus, converted=prep.converted, args=args,
    )  # fmt: skip
    checks = run_checks(ctx)
    if plain_path is not None and not cand.hang:
        note(f"  plain conversion (no --optimize): {how}, to compare its losses ...")
        ref = launch(
            "plain", plain_path, str(script_path), args, plan.nproc, steps, current_timeout[0], run_dir / "plain", token,
            plan.hide_gpus, nnodes=nnodes, epochs=epochs, progress=_progress_printer(note, "plain", lambda: current_timeout[0]),
            node_gpus=node_gpus, extra_env=extra,
        )  # fmt: skip
        runs.append(ref)
        doc["plain"] = report.run_summary(ref, sources.rewrite)
        checks.append(check_optimized(cand, ref, world))
    failed = [c for c in checks if c.status == FAIL]
    # Without a baseline, a script that dies before its first step on every rank could not be run at all.
    never_ran = any(
        (rec or {}).get("status") in ("crashed", "exited")
        for rec in cand.records.values()
    ) and not any(cand.heartbeats.get(r, (0,))[0] for r in range(world))
    if failed and not baseline and never_ran and {c.name for c in failed} == {"ranks"}:
        echo("the script could not be run:")
        echo(report.crash_report(cand, sources.rewrite))
        errors = " ".join(
            (rec or {}).get("error") or "" for rec in cand.records.values()
        )
        hint = needs_gpu_hint(errors, plan)
        if hint:
            echo(hint)
        return finish(VerifyOutcome(2, checks))
    echo("")
    echo(report.table(checks, colour=colour))
    if failed:
        echo(report.failures(checks))
    code = 1 if failed else 0
    doc["verdict"] = verdict(ctx, checks)
    echo(f"\n{doc['verdict']}")
    echo(
        f"{len(checks) - len(failed)}/{len(checks)} checks without failure; exit {code}"
    )
    return finish(VerifyOutcome(code, checks))


def _run_baseline(script_path: Path, args: list[str], steps: int, epochs: int | None, prep: Prepared, plan: Plan,
                  run_dir: Path, token: str, current_timeout: list[float], note, echo,
                  length_env: dict[str, str]) -> tuple[RunResult, int | None]:  # fmt: skip
    """The original as one process; then what it wrote is removed. (its run, an exit status when
    verify cannot go on)."""
    note(
        f"  baseline: the original as one process (hang after {current_timeout[0]:g} s without progress) ..."
    )
    env_threads = "OMP_NUM_THREADS" not in os.environ and plan.nproc > 1
    if env_threads:
        os.environ["OMP_NUM_THREADS"] = (
            "1"  # torchrun gives each rank one thread; same for the baseline
        )
    roots = sorted(
        {
            Path.cwd().resolve(),
            script_path.parent,
            *(Path(r) for r in prep.roots.values()),
        }
    )
    before = snapshot(roots)
    base_run = None
    try:
        base_run = launch(
            "baseline", str(script_path), str(script_path), args, 1, steps, current_timeout[0], run_dir / "baseline",
            token, plan.hide_gpus, epochs=epochs, progress=_progress_printer(note, "baseline", lambda: current_timeout[0]),
            extra_env={"DDPIFY_VERIFY_USER_ROOT": next(iter(prep.roots.values()), prep.user_root), **length_env},
        )  # fmt: skip
    finally:
        if env_threads:
            del os.environ["OMP_NUM_THREADS"]
        writes = (base_run.records.get(0) or {}).get("writes", []) if base_run else []
        files, folders = remove_new(before, roots, writes)
        if writes:
            note(_removal_note(writes, files, folders))
    rec = base_run.records.get(0) or {}
    if base_run.hang:
        echo(
            f"the script made no progress for {current_timeout[0]:g} s as one process: it cannot be verified"
        )
        echo("\n".join(base_run.hang["stacks"].get(0, "").splitlines()[:30]))
        return base_run, 2
    if rec.get("status") not in ("stopped", "finished") and rec.get("unused_params"):
        # A DDP error the one-process run hits too (the script is already distributed): the
        # candidate shows it rank by rank, with the parameters named.
        note(
            "  baseline: crashed the same way DDP will: parameters without a gradient (see ranks)"
        )
        return base_run, None
    if rec.get("status") not in ("stopped", "finished"):
        echo("the script could not run as one process:")
        echo(report.crash_report(base_run))
        hint = needs_gpu_hint(
            f"{rec.get('error') or ''} {rec.get('traceback') or ''} {base_run.outputs.get(0, '')[-2000:]}",
            plan,
        )
        if hint:
            echo(hint)
        return base_run, 2
    if not rec.get("steps"):
        echo(
            "the script ran as one process but took no optimizer step or backward pass: nothing to verify"
        )
        return base_run, 2
    note(f"  baseline: {_plural(rec['steps'], 'step')} in {base_run.wall_s:.1f} s")
    return base_run, None


def _run_single(script_path: Path, args: list[str], steps: int, epochs: int | None, prep: Prepared, plan: Plan,
                run_dir: Path, token: str, current_timeout: list[float], note, extra: dict[str, str]) -> RunResult:  # fmt: skip
    """The converted script as a plain `python` process, no launcher, a world of one, as its README
    promises it still runs; then what it wrote is removed, as the baseline's."""
    note(
        f"  one process: the converted script as plain python (hang after {current_timeout[0]:g} s without progress) ..."
    )
    roots = sorted(
        {
            Path.cwd().resolve(),
            script_path.parent,
            *(Path(r) for r in prep.roots.values()),
        }
    )
    before = snapshot(roots)
    run = None
    try:
        run = launch(
            "single", prep.exec_path, prep.main_file, args, 1, steps, current_timeout[0], run_dir / "single", token,
            plan.hide_gpus, epochs=epochs, progress=_progress_printer(note, "one process", lambda: current_timeout[0]),
            extra_env=extra,
        )  # fmt: skip
    finally:
        writes = (run.records.get(0) or {}).get("writes", []) if run else []
        remove_new(before, roots, writes)
    rec = run.records.get(0) or {}
    note(
        f"  one process: {rec.get('status') or 'no record'} after {_plural(rec.get('steps') or 0, 'step')} in {run.wall_s:.1f} s"
    )
    return run


def use_colour(stream, environ=os.environ) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set to anything (https://no-color.org)."""
    if environ.get("NO_COLOR"):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


@click.command("verify", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--nproc",
    type=click.IntRange(1),
    default=None,
    help="Processes (default: every visible GPU, or 2 with gloo).",
)
@click.option(
    "--steps",
    type=click.IntRange(1),
    default=None,
    help="Stop both runs after K optimizer steps. Default: two passes over each rank's shard (see --max-batches).",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "nccl", "gloo"]),
    default="auto",
    show_default=True,
)
@click.option(
    "--epochs",
    type=click.IntRange(1),
    default=None,
    help="Run N whole training epochs (and the work at their end) instead of K steps.",
)
@click.option(
    "--to-end",
    is_flag=True,
    help="Run the whole script, to its own end (evaluation, final save, teardown): no step limit. For small scripts.",
)
@click.option(
    "--max-batches",
    type=click.IntRange(1),
    default=None,
    help="Cap each DataLoader pass at this many batches (default run: 16).",
)
@click.option(
    "--max-time",
    type=click.FloatRange(1),
    default=None,
    help="Seconds a run trains before every rank stops at the same step (default run: 240).",
)
@click.option(
    "--one-process/--no-one-process",
    default=None,
    help="Also run the converted script as plain python, a world of one [default: when verify converted it].",
)
@click.option(
    "--other-scripts/--no-other-scripts",
    default=True,
    show_default=True,
    help="Run the project's other entry scripts that import a changed module, with --help or their dry-run flag.",
)
@click.option(
    "--nnodes",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Run the candidate as this many torchrun agents (nodes) on this host, each in its own directory.",
)
@click.option(
    "--share-gpus/--no-share-gpus",
    default=None,
    help="Let the processes share the GPUs there are (gloo for CUDA tensors). Default: on when there are fewer GPUs than processes.",
)
@click.option(
    "--timeout",
    type=str,
    default="auto",
    show_default=True,
    help="Seconds without progress before a rank counts as hung; auto: from the baseline's pace (30-300 s).",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, allow_dash=True),
    default=None,
    help="Also write the report as JSON (- for stdout; the text report then goes to stderr).",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the report as one self-contained HTML page (checks, loss curves, throughput, the lines of a failure).",
)
@click.option(
    "--show-output",
    is_flag=True,
    help="Print the script's own output (baseline and every rank) after the report.",
)
@click.option(
    "--no-baseline", is_flag=True, help="Skip the one-process run of the original."
)
@click.option(
    "--no-convert",
    is_flag=True,
    help="Run SCRIPT as it is (it is already distributed).",
)
@click.option(
    "--amp",
    type=click.Choice(["auto", "bf16", "fp16", "none", "apex"]),
    default="auto",
    show_default=True,
)
@click.option("--sync-bn/--no-sync-bn", default=False, show_default=True)
@click.option("--shard-eval/--no-shard-eval", default=False, show_default=True)
@click.option(
    "--keep-global-batch/--no-keep-global-batch",
    default=None,
    help="Convert with --keep-global-batch: batch_size / WORLD_SIZE on each rank [default: as [tool.ddpify] says, else no].",
)
@click.option(
    "--scale-lr",
    type=click.Choice(["linear"]),
    default=None,
    help="Convert with --scale-lr linear: learning rates x WORLD_SIZE [default: as [tool.ddpify] says, else none].",
)
@click.option(
    "--optimize",
    is_flag=True,
    help="Verify the --optimize conversion, and check its losses against the plain conversion's (within bf16 noise).",
)
@click.option(
    "--optimize-only",
    metavar="NAMES",
    default=None,
    help="As --optimize, with only these speed-ups (comma-separated).",
)
@click.option(
    "--min-scaling",
    type=click.FloatRange(0, 1),
    default=None,
    help="Fail when scaling efficiency is below this.",
)
@click.option(
    "--keep", is_flag=True, help="Keep the run directory (logs, per-rank records)."
)
def verify_command(
    script,
    script_args,
    nproc,
    steps,
    backend,
    epochs,
    to_end,
    max_batches,
    max_time,
    one_process,
    other_scripts,
    nnodes,
    share_gpus,
    timeout,
    json_path,
    html_path,
    show_output,
    no_baseline,
    no_convert,
    amp,
    sync_bn,
    shard_eval,
    keep_global_batch,
    scale_lr,
    optimize,
    optimize_only,
    min_scaling,
    keep,
):
    """Run SCRIPT as one process and distributed under torchrun, and check the DDP conversion.

    Arguments after `--` go to the script:

    \b
        ddpify verify train.py --nproc 2 -- --epochs 1
    """
    from ddpify import Options
    from ddpify.config import ConfigError, config_for

    try:  # the writers a pyproject.toml declares: the conversion is the one `ddpify` makes
        configured = config_for(script).values
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    writers = configured.get("writers", ())
    if keep_global_batch and scale_lr:
        raise click.UsageError("--keep-global-batch and --scale-lr exclude each other")
    if (
        not keep_global_batch and scale_lr is None
    ):  # the training dynamics the configuration asks for
        scale_lr = configured.get("scale_lr")
        keep_global_batch = (
            keep_global_batch is None
            and not scale_lr
            and configured.get("keep_global_batch", False)
        )
    if timeout == "auto":
        seconds = None
    else:
        try:
            seconds = float(timeout)
        except ValueError:
            raise click.BadParameter(
                f"{timeout!r} is neither a number of seconds nor auto",
                param_hint="--timeout",
            ) from None
        if seconds < 1:
            raise click.BadParameter("at least 1 second", param_hint="--timeout")
    from ddpify.options import parse_optimize

    try:
        speedups = (
            parse_optimize(optimize_only)
            if optimize_only is not None
            else parse_optimize(optimize)
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--optimize-only") from None
    if speedups and no_convert:
        raise click.UsageError(
            "--optimize compares two conversions: it cannot go with --no-convert"
        )
    if to_end and epochs:
        raise click.UsageError(
            "--to-end runs the whole script: it cannot go with --epochs"
        )
    if steps and (epochs or to_end):
        raise click.UsageError(
            "--steps stops at step K: it cannot go with --epochs or --to-end"
        )
    to_stdout = json_path == "-"
    outcome = run_verify(
        script,
        script_args,
        nproc=nproc,
        steps=steps,
        backend=backend,
        timeout=seconds,
        nnodes=nnodes,
        epochs=epochs,
        show_output=show_output,
        json_path=json_path,
        echo=(lambda msg="", err=False: click.echo(msg, err=True))
        if to_stdout
        else click.echo,
        baseline=not no_baseline,
        convert=not no_convert,
        options=Options(
            amp=amp,
            sync_bn=sync_bn,
            shard_eval=shard_eval,
            writers=writers,
            optimize=speedups,
            keep_global_batch=bool(keep_global_batch),
            scale_lr=scale_lr,
        ),
        compare_plain=bool(speedups),
        keep=keep,
        min_scaling=min_scaling,
        colour=use_colour(sys.stderr if to_stdout else sys.stdout),
        share_gpus=share_gpus,
        to_end=to_end,
        html_path=html_path,
        max_batches=max_batches,
        max_time=max_time,
        plain_run=one_process,
        other_scripts=other_scripts,
    )
    sys.exit(outcome.exit_code)
