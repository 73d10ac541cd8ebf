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
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import click

from ddpify.verify import report
from ddpify.verify.checks import FAIL, Check, Context, check_optimized, run_checks
from ddpify.verify.runner import RunResult, launch


@dataclass
class VerifyOutcome:
    exit_code: int
    checks: list[Check] = field(default_factory=list)
    document: dict = field(default_factory=dict)


class CannotRun(Exception):
    """The script could not be run at all (exit status 2)."""


def _convert(script: Path, source: str, options, converter: Callable | None) -> tuple[str | None, str]:
    """(converted source or None to run the file as it is, conversion status)."""
    if converter is None:
        from ddpify import convert_source as converter
    from ddpify import ConversionError

    try:
        result = converter(source, options, path=str(script))
    except NotImplementedError:
        raise CannotRun(
            "the converter is not available in this build; run an already-distributed script with --no-convert"
        ) from None
    except ConversionError as exc:
        raise CannotRun(exc.format(str(script))) from None
    except Exception as exc:  # a converter bug: say so instead of a bare traceback
        where = traceback.extract_tb(exc.__traceback__)[-1]
        raise CannotRun(
            f"the converter failed on {script}: {type(exc).__name__}: {exc} "
            f"(at {os.path.basename(where.filename)}:{where.lineno}; please report it)"
        ) from None
    if result.status == "not-training":
        raise CannotRun(f"{script}: not a training script (no optimizer step found): nothing to verify")
    if result.status == "refused":
        why = "; ".join(f.format(str(script)) for f in result.blocking)
        raise CannotRun(f"ddpify refused to convert {script} (blocking findings: fix them by hand or suppress one with `# ddpify: ignore[CODE]` on its line): {why}")
    if result.status == "already-distributed" or not result.changed:
        return None, result.status
    try:
        compile(result.source, str(script), "exec", dont_inherit=True)
    except SyntaxError as exc:
        lines = result.source.splitlines()
        # Not exc.text: Python reads that line from the original file, which has the same name.
        code = (lines[exc.lineno - 1] if exc.lineno and exc.lineno <= len(lines) else "").strip()
        raise CannotRun(
            f"converter failure: the converted script does not compile ({exc.msg}, line {exc.lineno}"
            + (f": `{code}`" if code else "")
            + f"); {script} itself is untouched. Please report it (ddpify --diff shows the conversion)"
        ) from None
    return result.source, result.status


def _project_copy(script: Path, options, into: Path) -> tuple[str | None, str] | None:
    """Project mode (the script imports local modules): convert the project and copy every file of
    it under `into`, as laid out under the project root; (the copied entry, status). None for a
    single script."""
    from ddpify.project import convert_project, is_project

    if not is_project(str(script)):
        return None
    result = convert_project(str(script), options)
    if result.status == "not-training":
        raise CannotRun(f"{script}: not a training script (no optimizer step found in it or its local modules): nothing to verify")
    if result.blocking:
        why = "; ".join(f.format(os.path.relpath(r.path, result.root)) for r in result.files for f in r.findings if f.blocking)
        raise CannotRun(f"ddpify refused to convert the project of {script} (blocking findings): {why}")
    if not any(r.changed for r in result.files):
        return None, result.status
    for r in result.files:
        target = into / os.path.relpath(r.path, result.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(r.output)
    return str(into / os.path.relpath(result.entry, result.root)), result.status


def _visible_gpus() -> int:
    # No NVIDIA device node, or every GPU hidden: skip importing torch in this process just to learn it.
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "" or not any(
        os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")
    ):
        return 0
    import torch

    return torch.cuda.device_count()


def _plan_processes(nproc: int | None, backend: str, nnodes: int = 1) -> tuple[int, str, bool]:
    """(processes per node, backend the run will use, hide GPUs)."""
    gpus = _visible_gpus()
    if backend == "auto":
        backend = "nccl" if gpus else "gloo"
    if backend == "nccl":
        if not gpus:
            raise CannotRun("--backend nccl needs a GPU, and none is visible")
        nproc = nproc or max(1, gpus // nnodes)
        if nproc * nnodes > gpus:
            raise CannotRun(f"--nproc {nproc} x --nnodes {nnodes} with nccl needs {nproc * nnodes} GPUs; {gpus} visible")
        return nproc, "nccl", False
    return nproc or 2, "gloo", True


def _gpu_ids() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [g.strip() for g in visible.split(",") if g.strip()]
    return [str(i) for i in range(_visible_gpus())]


# --timeout auto: before anything is known, and the ceiling once the baseline was timed.
AUTO_TIMEOUT_FIRST = 120.0
AUTO_TIMEOUT_MIN = 30.0
AUTO_TIMEOUT_MAX = 300.0


def auto_timeout(base: RunResult | None) -> float:
    """Seconds without progress before a rank counts as hung, from how the one-process run went:
    ten times its longest pause between two progress marks (torch's import included), or three
    times its whole run, within [30, 300] s."""
    if base is None or not base.wall_s:
        return AUTO_TIMEOUT_FIRST
    guess = max(10 * base.max_gap, 3 * base.wall_s, AUTO_TIMEOUT_MIN)
    return float(min(AUTO_TIMEOUT_MAX, round(guess)))


_SNAPSHOT_LIMIT = 200_000  # paths: a data tree larger than this is not walked


def _snapshot(roots: list[Path]) -> set[str] | None:
    """Every path under roots (the working directory, the script's folder); None when too many."""
    seen: set[str] = set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            seen.add(dirpath)
            seen.update(os.path.join(dirpath, n) for n in dirnames + filenames)
            if len(seen) > _SNAPSHOT_LIMIT:
                return None
    return seen


def _remove_new(before: set[str], roots: list[Path], written: set[str]) -> list[str]:
    """Remove the files the baseline wrote that were not there before it (then the folders that
    appeared with them, once empty), so that the candidate starts from the same files as the
    baseline did: a cache or a prepared dataset the baseline left would let the candidate skip
    its own (and hide a race in it). Nothing the baseline did not write is touched."""
    after = _snapshot(roots) or set()
    new = sorted(after - before, key=len, reverse=True)
    removed = []
    for p in new:
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                os.rmdir(p)  # only emptied folders
            elif os.path.realpath(p) in written:
                os.remove(p)
            else:
                continue
            removed.append(p)
        except OSError:
            pass
    return removed


def _progress_printer(note: Callable[[str], None], label: str, timeout_of: Callable[[], float]):
    def progress(result: RunResult, stalled_for: float, steps: dict[int, int], final: bool) -> None:
        if final:
            return
        if len(steps) == 1:
            reached = f"step {steps[0]}"
        elif len(set(steps.values())) == 1:
            reached = f"step {next(iter(steps.values()))} on all {len(steps)} ranks"
        else:
            reached = "steps " + ", ".join(f"rank {r}: {s}" for r, s in sorted(steps.items()))
        left = max(0.0, timeout_of() - stalled_for)
        note(f"  {label}: {int(time.monotonic() - t0[0])} s, {reached}; a hang is declared after {left:.0f} s more without progress")

    t0 = [time.monotonic()]
    return progress


def run_verify(
    script: str,
    script_args: list[str] | tuple[str, ...] = (),
    *,
    nproc: int | None = None,
    steps: int = 20,
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
) -> VerifyOutcome:
    """compare_plain (with options.optimize): also run the plain conversion (no --optimize) as
    N processes, and check that the optimised one trains the same (the optimize-parity check)."""
    script_path = Path(script).resolve()
    token = uuid.uuid4().hex
    run_dir = Path(tempfile.mkdtemp(prefix="ddpify-verify-"))
    doc: dict = {
        "script": str(script),
        "script_args": list(script_args),
        "steps": steps,
        "epochs": epochs,
        "nnodes": nnodes,
        "timeout": timeout if timeout is not None else "auto",
        "run_token": token,
    }

    def note(msg: str) -> None:
        echo(msg, err=True) if echo is click.echo else echo(msg)

    runs: list[RunResult] = []

    def finish(outcome: VerifyOutcome) -> VerifyOutcome:
        outcome.document = doc
        doc["exit_code"] = outcome.exit_code
        doc["checks"] = [c.to_dict() for c in outcome.checks]
        if show_output:
            for run in runs:
                echo(report.script_output(run))
        if json_path == "-":
            sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
            sys.stdout.flush()
        elif json_path:
            Path(json_path).write_text(json.dumps(doc, indent=2, default=str) + "\n")
        if keep:
            note(f"run directory kept: {run_dir}")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
        return outcome

    try:
        source = script_path.read_text()
        converted, status = (None, "--no-convert")
        project = None
        main_file = str(script_path)
        if convert:
            from ddpify import Options

            project = converter is None and _project_copy(script_path, options or Options(), run_dir / "project")
            if project:
                converted, status = project
            else:
                converted, status = _convert(script_path, source, options or Options(), converter)
        exec_path = str(script_path)
        if convert and project and converted is not None:
            exec_path = converted  # the converted entry among its converted modules
            main_file = converted
        elif converted is not None:
            exec_path = str(run_dir / f"{script_path.stem}.ddp.py")
            Path(exec_path).write_text(converted)
        doc.update(conversion=status, ran=exec_path)
        plain_path = None
        if compare_plain and convert:
            from dataclasses import replace

            from ddpify import Options

            plain, _ = _convert(script_path, source, replace(options or Options(), optimize=()), converter)
            if plain is None or plain == converted:
                raise CannotRun("--optimize changed nothing in this script: there is no optimised conversion to compare")
            plain_path = str(run_dir / f"{script_path.stem}.plain.py")
            Path(plain_path).write_text(plain)
        nproc, backend, hide_gpus = _plan_processes(nproc, backend, nnodes)
        doc.update(nproc=nproc, backend=backend)
    except (CannotRun, OSError) as exc:
        echo(f"ddpify verify: {exc}")
        doc["error"] = str(exc)
        if str(exc).startswith("converter failure"):
            doc["error_kind"] = "converter"
        return finish(VerifyOutcome(2))

    if converted is not None:
        what = "converted to a temporary copy"
    elif status == "--no-convert":
        what = "run as it is (--no-convert)"
    else:
        what = f"run as it is ({status})"
    world = nproc * nnodes
    layout = f"{nnodes} nodes x {nproc} processes" if nnodes > 1 else f"{nproc} processes"
    length = f"{epochs} epoch{'s' if epochs > 1 else ''}" if epochs else f"K={steps}"
    echo(f"ddpify verify {report.short_path(str(script_path))}: {what}, {layout}, {backend}, {length}")
    args = list(script_args)
    base_run: RunResult | None = None
    current_timeout = [timeout if timeout is not None else AUTO_TIMEOUT_FIRST]
    if baseline:
        note(f"  baseline: the original as one process (hang after {current_timeout[0]:g} s without progress) ...")
        env_threads = "OMP_NUM_THREADS" not in os.environ and nproc > 1
        if env_threads:
            os.environ["OMP_NUM_THREADS"] = "1"  # torchrun gives each rank one thread; same for the baseline
        roots = sorted({Path.cwd().resolve(), script_path.resolve().parent})
        before = _snapshot(roots)
        try:
            base_run = launch(
                "baseline", str(script_path), str(script_path), args, 1, steps, current_timeout[0], run_dir / "baseline",
                token, hide_gpus, epochs=epochs, progress=_progress_printer(note, "baseline", lambda: current_timeout[0]),
            )  # fmt: skip
        finally:
            if env_threads:
                del os.environ["OMP_NUM_THREADS"]
            if before is not None:
                writes = ((base_run.records.get(0) or {}).get("writes", []) if base_run else [])
                removed = _remove_new(before, roots, {os.path.realpath(w["path"]) for w in writes})
                if removed:
                    note(f"  baseline: {len(removed)} files it wrote and their new folders removed, so the candidate starts from the same files")
        runs.append(base_run)
        doc["baseline"] = report.run_summary(base_run)
        rec = base_run.records.get(0) or {}
        if base_run.hang:
            echo(f"the script made no progress for {current_timeout[0]:g} s as one process: it cannot be verified")
            echo("\n".join(base_run.hang["stacks"].get(0, "").splitlines()[:30]))
            return finish(VerifyOutcome(2))
        if rec.get("status") not in ("stopped", "finished") and rec.get("unused_params"):
            # A DDP error the one-process run hits too (the script is already distributed): the
            # candidate shows it rank by rank, with the parameters named.
            note("  baseline: crashed the same way DDP will: parameters without a gradient (see ranks)")
            base_run = None
        elif rec.get("status") not in ("stopped", "finished"):
            echo("the script could not run as one process:")
            echo(report.crash_report(base_run))
            return finish(VerifyOutcome(2))
        elif not rec.get("steps"):
            echo("the script ran as one process but took no optimizer step or backward pass: nothing to verify")
            return finish(VerifyOutcome(2))
        else:
            note(f"  baseline: {rec['steps']} steps in {base_run.wall_s:.1f} s")
        if timeout is None:
            current_timeout[0] = auto_timeout(base_run)
    elif timeout is None:
        current_timeout[0] = AUTO_TIMEOUT_FIRST
    doc["timeout_s"] = current_timeout[0]

    how = f"{nnodes} torchrun agents (c10d rendezvous on 127.0.0.1), {nproc} processes each" if nnodes > 1 else f"torchrun, {nproc} processes"
    note(f"  candidate: {how} (hang after {current_timeout[0]:g} s without progress) ...")
    cand = launch(
        "candidate", exec_path, main_file, args, nproc, steps, current_timeout[0], run_dir / "candidate", token,
        hide_gpus, nnodes=nnodes, epochs=epochs, progress=_progress_printer(note, "candidate", lambda: current_timeout[0]),
        node_gpus=_gpu_ids() if nnodes > 1 and not hide_gpus else None,
    )  # fmt: skip
    runs.append(cand)
    doc["candidate"] = report.run_summary(cand)
    reached = sorted({cand.heartbeats.get(r, (0,))[0] for r in range(world)})
    note(f"  candidate: done in {cand.wall_s:.1f} s, step {'/'.join(map(str, reached))} reached")

    ctx = Context(
        cand, base_run, world, steps, exec_path, timeout=current_timeout[0], min_scaling=min_scaling, nnodes=nnodes, epochs=epochs
    )
    checks = run_checks(ctx)
    if plain_path is not None and not cand.hang:
        note(f"  plain conversion (no --optimize): {how}, to compare its losses ...")
        ref = launch(
            "plain", plain_path, str(script_path), args, nproc, steps, current_timeout[0], run_dir / "plain", token,
            hide_gpus, nnodes=nnodes, epochs=epochs, progress=_progress_printer(note, "plain", lambda: current_timeout[0]),
            node_gpus=_gpu_ids() if nnodes > 1 and not hide_gpus else None,
        )  # fmt: skip
        runs.append(ref)
        doc["plain"] = report.run_summary(ref)
        checks.append(check_optimized(cand, ref, world))
    failed = [c for c in checks if c.status == FAIL]
    # Without a baseline, a script that dies before its first step on every rank could not be run at all.
    never_ran = any((rec or {}).get("status") in ("crashed", "exited") for rec in cand.records.values()) and not any(
        cand.heartbeats.get(r, (0,))[0] for r in range(world)
    )
    if failed and not baseline and never_ran and {c.name for c in failed} == {"ranks"}:
        echo("the script could not be run:")
        echo(report.crash_report(cand))
        return finish(VerifyOutcome(2, checks))
    echo("")
    echo(report.table(checks, colour=colour))
    if failed:
        echo(report.failures(checks))
    code = 1 if failed else 0
    echo(f"\n{len(checks) - len(failed)}/{len(checks)} checks without failure; exit {code}")
    return finish(VerifyOutcome(code, checks))


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
@click.option("--nproc", type=click.IntRange(1), default=None, help="Processes (default: every visible GPU, or 2 with gloo).")
@click.option("--steps", type=click.IntRange(1), default=20, show_default=True, help="Optimizer steps before both runs stop.")
@click.option("--backend", type=click.Choice(["auto", "nccl", "gloo"]), default="auto", show_default=True)
@click.option("--epochs", type=click.IntRange(1), default=None, help="Run N whole training epochs (and the work at their end) instead of K steps.")
@click.option("--nnodes", type=click.IntRange(1), default=1, show_default=True, help="Run the candidate as this many torchrun agents (nodes) on this host, each in its own directory.")
@click.option("--timeout", type=str, default="auto", show_default=True, help="Seconds without progress before a rank counts as hung; auto: from the baseline's pace (30-300 s).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, allow_dash=True), default=None, help="Also write the report as JSON (- for stdout; the text report then goes to stderr).")
@click.option("--show-output", is_flag=True, help="Print the script's own output (baseline and every rank) after the report.")
@click.option("--no-baseline", is_flag=True, help="Skip the one-process run of the original.")
@click.option("--no-convert", is_flag=True, help="Run SCRIPT as it is (it is already distributed).")
@click.option("--amp", type=click.Choice(["auto", "bf16", "fp16", "none", "apex"]), default="auto", show_default=True)
@click.option("--sync-bn/--no-sync-bn", default=False, show_default=True)
@click.option("--shard-eval/--no-shard-eval", default=False, show_default=True)
@click.option("--optimize", is_flag=True, help="Verify the --optimize conversion, and check its losses against the plain conversion's (within bf16 noise).")
@click.option("--optimize-only", metavar="NAMES", default=None, help="As --optimize, with only these speed-ups (comma-separated).")
@click.option("--min-scaling", type=click.FloatRange(0, 1), default=None, help="Fail when scaling efficiency is below this.")
@click.option("--keep", is_flag=True, help="Keep the run directory (logs, per-rank records).")
def verify_command(script, script_args, nproc, steps, backend, epochs, nnodes, timeout, json_path, show_output, no_baseline, no_convert, amp, sync_bn, shard_eval, optimize, optimize_only, min_scaling, keep):
    """Run SCRIPT as one process and distributed under torchrun, and check the DDP conversion.

    Arguments after `--` go to the script:

    \b
        ddpify verify train.py --nproc 2 -- --epochs 1
    """
    from ddpify import Options
    from ddpify.config import ConfigError, config_for

    try:  # the writers a pyproject.toml declares: the conversion is the one `ddpify` makes
        writers = config_for(script).values.get("writers", ())
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if timeout == "auto":
        seconds = None
    else:
        try:
            seconds = float(timeout)
        except ValueError:
            raise click.BadParameter(f"{timeout!r} is neither a number of seconds nor auto", param_hint="--timeout") from None
        if seconds < 1:
            raise click.BadParameter("at least 1 second", param_hint="--timeout")
    from ddpify.options import parse_optimize

    try:
        speedups = parse_optimize(optimize_only) if optimize_only is not None else parse_optimize(optimize)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--optimize-only") from None
    if speedups and no_convert:
        raise click.UsageError("--optimize compares two conversions: it cannot go with --no-convert")
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
        echo=(lambda msg="", err=False: click.echo(msg, err=True)) if to_stdout else click.echo,
        baseline=not no_baseline,
        convert=not no_convert,
        options=Options(amp=amp, sync_bn=sync_bn, shard_eval=shard_eval, writers=writers, optimize=speedups),
        compare_plain=bool(speedups),
        keep=keep,
        min_scaling=min_scaling,
        colour=use_colour(sys.stderr if to_stdout else sys.stdout),
    )
    sys.exit(outcome.exit_code)
