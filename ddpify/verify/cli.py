"""`ddpify verify`: run the original and the distributed script, and prove the conversion with figures.

Exit status: 0 every check passed, 1 a check failed, 2 the script could not be run at all.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import click

from ddpify.verify import report
from ddpify.verify.checks import FAIL, Check, Context, run_checks
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
        raise CannotRun(f"ddpify refused to convert {script} (blocking findings: fix them, or pass --partial): {why}")
    if result.status == "already-distributed" or not result.changed:
        return None, result.status
    return result.source, result.status


def _visible_gpus() -> int:
    # No NVIDIA device node, or every GPU hidden: skip importing torch in this process just to learn it.
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "" or not any(
        os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")
    ):
        return 0
    import torch

    return torch.cuda.device_count()


def _plan_processes(nproc: int | None, backend: str) -> tuple[int, str, bool]:
    """(process count, backend the run will use, hide GPUs)."""
    gpus = _visible_gpus()
    if backend == "auto":
        backend = "nccl" if gpus else "gloo"
    if backend == "nccl":
        if not gpus:
            raise CannotRun("--backend nccl needs a GPU, and none is visible")
        nproc = nproc or gpus
        if nproc > gpus:
            raise CannotRun(f"--nproc {nproc} with nccl needs {nproc} GPUs; {gpus} visible")
        return nproc, "nccl", False
    return nproc or 2, "gloo", True


def run_verify(
    script: str,
    script_args: list[str] | tuple[str, ...] = (),
    *,
    nproc: int | None = None,
    steps: int = 20,
    backend: str = "auto",
    timeout: float = 300.0,
    json_path: str | None = None,
    baseline: bool = True,
    convert: bool = True,
    options=None,
    keep: bool = False,
    min_scaling: float | None = None,
    converter: Callable | None = None,
    echo: Callable[[str], None] = click.echo,
    colour: bool = False,
) -> VerifyOutcome:
    script_path = Path(script).resolve()
    token = uuid.uuid4().hex
    run_dir = Path(tempfile.mkdtemp(prefix="ddpify-verify-"))
    doc: dict = {
        "script": str(script),
        "script_args": list(script_args),
        "steps": steps,
        "timeout": timeout,
        "run_token": token,
    }

    def note(msg: str) -> None:
        echo(msg, err=True) if echo is click.echo else echo(msg)

    def finish(outcome: VerifyOutcome) -> VerifyOutcome:
        outcome.document = doc
        doc["exit_code"] = outcome.exit_code
        doc["checks"] = [c.to_dict() for c in outcome.checks]
        if json_path:
            Path(json_path).write_text(json.dumps(doc, indent=2, default=str) + "\n")
        if keep:
            note(f"run directory kept: {run_dir}")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
        return outcome

    try:
        source = script_path.read_text()
        converted, status = (None, "--no-convert")
        if convert:
            from ddpify import Options

            converted, status = _convert(script_path, source, options or Options(), converter)
        exec_path = str(script_path)
        if converted is not None:
            exec_path = str(run_dir / f"{script_path.stem}.ddp.py")
            Path(exec_path).write_text(converted)
        doc.update(conversion=status, ran=exec_path)
        nproc, backend, hide_gpus = _plan_processes(nproc, backend)
        doc.update(nproc=nproc, backend=backend)
    except (CannotRun, OSError) as exc:
        echo(f"ddpify verify: {exc}")
        doc["error"] = str(exc)
        return finish(VerifyOutcome(2))

    if converted is not None:
        what = "converted to a temporary copy"
    elif status == "--no-convert":
        what = "run as it is (--no-convert)"
    else:
        what = f"run as it is ({status})"
    echo(f"ddpify verify {report.short_path(str(script_path))}: {what}, {nproc} processes, {backend}, K={steps}")
    args = list(script_args)
    base_run: RunResult | None = None
    if baseline:
        note("  baseline: the original as one process ...")
        env_threads = "OMP_NUM_THREADS" not in os.environ and nproc > 1
        if env_threads:
            os.environ["OMP_NUM_THREADS"] = "1"  # torchrun gives each rank one thread; same for the baseline
        try:
            base_run = launch(
                "baseline", str(script_path), str(script_path), args, 1, steps, timeout, run_dir / "baseline", token, hide_gpus
            )
        finally:
            if env_threads:
                del os.environ["OMP_NUM_THREADS"]
        doc["baseline"] = report.run_summary(base_run)
        rec = base_run.records.get(0) or {}
        if base_run.hang:
            echo(f"the script made no progress for {timeout:g} s as one process: it cannot be verified")
            echo("\n".join(base_run.hang["stacks"].get(0, "").splitlines()[:30]))
            return finish(VerifyOutcome(2))
        if rec.get("status") not in ("stopped", "finished"):
            echo("the script could not run as one process:")
            echo(report.crash_report(base_run))
            return finish(VerifyOutcome(2))
        if not rec.get("steps"):
            echo("the script ran as one process but took no optimizer step or backward pass: nothing to verify")
            return finish(VerifyOutcome(2))
        note(f"  baseline: {rec['steps']} steps in {base_run.wall_s:.1f} s")

    note(f"  candidate: torchrun, {nproc} processes ...")
    cand = launch("candidate", exec_path, str(script_path), args, nproc, steps, timeout, run_dir / "candidate", token, hide_gpus)
    doc["candidate"] = report.run_summary(cand)
    note(f"  candidate: done in {cand.wall_s:.1f} s")

    ctx = Context(cand, base_run, nproc, steps, exec_path, timeout=timeout, min_scaling=min_scaling)
    checks = run_checks(ctx)
    failed = [c for c in checks if c.status == FAIL]
    # Without a baseline, a script that dies before its first step on every rank could not be run at all.
    never_ran = any((rec or {}).get("status") in ("crashed", "exited") for rec in cand.records.values()) and not any(
        cand.heartbeats.get(r, (0,))[0] for r in range(nproc)
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


@click.command("verify", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--nproc", type=click.IntRange(1), default=None, help="Processes (default: every visible GPU, or 2 with gloo).")
@click.option("--steps", type=click.IntRange(1), default=20, show_default=True, help="Optimizer steps before both runs stop.")
@click.option("--backend", type=click.Choice(["auto", "nccl", "gloo"]), default="auto", show_default=True)
@click.option("--timeout", type=click.FloatRange(min=1), default=300.0, show_default=True, help="Seconds without progress before a rank counts as hung.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Also write the report as JSON.")
@click.option("--no-baseline", is_flag=True, help="Skip the one-process run of the original.")
@click.option("--no-convert", is_flag=True, help="Run SCRIPT as it is (it is already distributed).")
@click.option("--amp", type=click.Choice(["auto", "bf16", "fp16", "none", "apex"]), default="auto", show_default=True)
@click.option("--sync-bn/--no-sync-bn", default=False, show_default=True)
@click.option("--shard-eval/--no-shard-eval", default=False, show_default=True)
@click.option("--min-scaling", type=click.FloatRange(0, 1), default=None, help="Fail when scaling efficiency is below this.")
@click.option("--keep", is_flag=True, help="Keep the run directory (logs, per-rank records).")
def verify_command(script, script_args, nproc, steps, backend, timeout, json_path, no_baseline, no_convert, amp, sync_bn, shard_eval, min_scaling, keep):
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
    outcome = run_verify(
        script,
        script_args,
        nproc=nproc,
        steps=steps,
        backend=backend,
        timeout=timeout,
        json_path=json_path,
        baseline=not no_baseline,
        convert=not no_convert,
        options=Options(amp=amp, sync_bn=sync_bn, shard_eval=shard_eval, writers=writers),
        keep=keep,
        min_scaling=min_scaling,
        colour=sys.stdout.isatty(),
    )
    sys.exit(outcome.exit_code)
