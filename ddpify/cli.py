"""ddpify's command line: `ddpify PATH...` rewrites files in place, like black and ruff.

Exit codes: 0 success or nothing to do; 1 a file would change (--check); 2 a file could not be read,
parsed or converted, or was refused because a blocking finding remains (the other files are
still processed). A subcommand (`ddpify verify ...`, `ddpify launch ...`) is dispatched to its own
command: add one to SUBCOMMANDS. The conversion's parts: which files (collect.py), one file
(process.py), a project (process_projects.py), what is printed (output.py).
"""

from __future__ import annotations

import importlib
import json
import os
import sys

import click

from ddpify import __version__, fileio, formatting, gitignore
from ddpify.collect import collect
from ddpify.config import find_config
from ddpify.options import (
    AMP_CHOICES,
    OPT_LEVELS,
    OPTIMIZATIONS,
    SCALE_LR_CHOICES,
    parse_optimize,
)
from ddpify.output import (
    json_document,
    print_report,
    review_results,
    summary,
    use_color,
)
from ddpify.report import FORMATS, REVIEW_FORMATS, render
from ddpify.process import Settings, run_jobs
from ddpify.process_projects import (
    display,
    loose_members,
    process_projects,
    split_projects,
)

# `ddpify NAME ...` runs the click command `attr` of `module` (imported only when used).
SUBCOMMANDS = {
    "verify": ("ddpify.verify.cli", "verify_command"),
    "launch": ("ddpify.launcher", "launch_command"),
    "lint": ("ddpify.lint.cli", "lint_command"),
}


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.command(
    context_settings=CONTEXT,
    epilog="Also: `ddpify verify --help`, `ddpify launch --help`.",
)
@click.argument("paths", nargs=-1, type=click.Path(dir_okay=True, allow_dash=True))
@click.option(
    "--check", is_flag=True, help="Write nothing; exit 1 if a file would change."
)
@click.option(
    "--diff", is_flag=True, help="Print a unified diff of the changes; write nothing."
)
@click.option(
    "--color/--no-color",
    default=None,
    help="Color the diff and the findings [default: on a terminal; NO_COLOR and FORCE_COLOR are honoured].",
)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Files converted in parallel (0: one per CPU).",
)
@click.option(
    "-q",
    "--quiet",
    is_flag=True,
    help="Print only errors and blocking findings (what needs a hand fix).",
)
@click.option(
    "--partial",
    is_flag=True,
    help="Write the conversion even when a blocking finding remains (still exits 2).",
)
@click.option(
    "--ignore",
    "ignore",
    multiple=True,
    metavar="CODES",
    help="Never report these codes (comma-separated; adds to [tool.ddpify] ignore).",
)
@click.option(
    "--output-format",
    type=click.Choice(FORMATS),
    default="text",
    show_default=True,
    help="json: one JSON document on stdout with every file's outcome and findings (severity, code, line, col); "
    "github: annotations (workflow commands); sarif: SARIF 2.1.0 (code scanning); rdjson: reviewdog "
    "diagnostics, the conversion as suggested changes; gitlab: a code quality report.",
)
@click.option("--json", "json_flag", is_flag=True, help="Same as --output-format json.")
@click.option(
    "--amp",
    type=click.Choice(AMP_CHOICES),
    default=None,
    help="Mixed precision to add [default: auto].",
)
@click.option(
    "--opt-level",
    type=click.Choice(OPT_LEVELS),
    default=None,
    help="apex opt_level (with --amp apex) [default: O1].",
)
@click.option(
    "--sync-bn/--no-sync-bn",
    default=None,
    help="Convert BatchNorm to SyncBatchNorm [default: no].",
)
@click.option(
    "--shard-eval/--no-shard-eval",
    default=None,
    help="Shard evaluation loaders too [default: no].",
)
@click.option(
    "--keep-global-batch/--no-keep-global-batch",
    default=None,
    help="Divide each training DataLoader's batch_size by WORLD_SIZE, so the global batch stays the single-GPU one "
    "(not a multiple: each rank takes batch_size // WORLD_SIZE, at least 1, and rank 0 says so) [default: no, batch_size per process].",
)
@click.option(
    "--scale-lr",
    type=click.Choice(SCALE_LR_CHOICES),
    default=None,
    help="linear: keep batch_size per process and multiply the optimizers' learning rates (lr=, param groups' \"lr\") "
    "by WORLD_SIZE, the linear scaling rule [default: lr unchanged]. Not with --keep-global-batch.",
)
@click.option(
    "--optimize",
    is_flag=True,
    default=None,
    help="Add verified-safe speed-ups, each only where a static check shows it safe, each with a finding (DDP130-DDP135).",
)
@click.option(
    "--optimize-only",
    metavar="NAMES",
    default=None,
    help=f"Only these speed-ups (comma-separated; implies --optimize): {', '.join(OPTIMIZATIONS)}.",
)
@click.option(
    "--writers",
    multiple=True,
    metavar="FUNC",
    help="A function that writes files (mylib.dump_results): rank 0 alone calls it; repeatable (overrides [tool.ddpify] writers).",
)
@click.option(
    "--line-length",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Wrap the lines ddpify writes at N columns [default: line-length of [tool.ruff] or [tool.black], else 88].",
)
@click.option(
    "--exclude",
    multiple=True,
    metavar="GLOB",
    help="Skip matching paths when recursing (adds to [tool.ddpify] exclude).",
)
@click.option(
    "--force-exclude",
    is_flag=True,
    help="Apply excludes to files named on the command line too.",
)
@click.option(
    "--stdin-filename",
    default=None,
    metavar="PATH",
    help="Name of the file read from stdin (messages, config lookup).",
)
@click.option(
    "--explain",
    metavar="CODE",
    default=None,
    help="Explain a finding code (DDP020, or `all` for the table) and exit.",
)
@click.version_option(__version__, prog_name="ddpify", message="%(prog)s %(version)s")
def convert_command(
    paths: tuple[str, ...],
    check: bool,
    diff: bool,
    color: bool | None,
    jobs: int,
    quiet: bool,
    amp: str | None,
    opt_level: str | None,
    sync_bn: bool | None,
    shard_eval: bool | None,
    keep_global_batch: bool | None,
    scale_lr: str | None,
    optimize: bool | None,
    optimize_only: str | None,
    writers: tuple[str, ...],
    exclude: tuple[str, ...],
    force_exclude: bool,
    stdin_filename: str | None,
    partial: bool,
    ignore: tuple[str, ...],
    output_format: str,
    json_flag: bool,
    explain: str | None,
    line_length: int | None,
) -> None:
    """Convert single-GPU PyTorch training scripts to DistributedDataParallel, in place.

    PATHS are files or directories (recursed into for *.py); `-` reads stdin and writes to stdout.
    Exit status: 0 success, 1 a file would change (--check), 2 a file could not be converted or
    was refused (a blocking finding remains: the output would not be a correct DDP program).
    """
    if explain is not None:
        _explain(explain)
    if json_flag:
        output_format = "json"
    if not paths:
        if (
            output_format in REVIEW_FORMATS
        ):  # an empty report: a CI step with no changed file still has one
            click.echo(render(output_format, [], "convert"), nl=False)
        sys.exit(0)
    find_config.cache_clear()
    gitignore.clear()
    formatting.clear_cache()
    settings = Settings(check=check, diff=diff)
    if output_format != "text" and settings.write and "-" in paths:
        what = "annotations" if output_format == "github" else "JSON"
        raise click.UsageError(
            f"--output-format {output_format} writes {what} to stdout: with `-`, add --check or --diff"
        )
    color_err = use_color(
        color, sys.stderr
    )  # findings go to stderr, the diff to stdout
    color = use_color(color, sys.stdout)
    codes = tuple(
        c.strip().upper() for raw in ignore for c in raw.split(",") if c.strip()
    )
    if keep_global_batch and scale_lr:
        raise click.UsageError(
            "--keep-global-batch and --scale-lr exclude each other: keep the global batch, or scale the learning rate to the larger one"
        )
    if optimize_only is not None:
        try:
            optimize = parse_optimize(optimize_only) or None
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--optimize-only") from None
    overrides = {
        "amp": amp,
        "opt_level": opt_level,
        "sync_bn": sync_bn,
        "shard_eval": shard_eval,
        "partial": partial or None,
        "ignore": codes or None,
        "writers": writers or None,
        "optimize": optimize,
        "line_length": line_length,
        "keep_global_batch": keep_global_batch,
        "scale_lr": scale_lr,
    }
    job_list, warns = collect(paths, exclude, force_exclude, stdin_filename, overrides)
    for w in warns:
        if not quiet:
            click.echo(w, err=True)
    if settings.write:
        # Temporaries left by a killed earlier run are removed before anything is written.
        for d in sorted(
            {
                os.path.dirname(os.path.realpath(j.path))
                for j in job_list
                if not j.stdin and not j.error
            }
        ):
            fileio.clean_stale_temps(d)

    every_job = job_list
    projects, job_list = split_projects(job_list, explicit=paths)
    project_reports = process_projects(projects, settings) if projects else []
    # the modules of an entry that trains nothing (an inference script importing the model class
    # from the training script) are files of their own again, converted one at a time
    loose = loose_members(every_job, project_reports)
    reports = run_jobs(job_list + loose, settings, jobs) + [
        r for r in project_reports if not any(r.path == display(j.path) for j in loose)
    ]
    reports.sort(key=lambda r: (not r.stdin, r.path))
    if output_format == "json":
        click.echo(json.dumps(json_document(reports, settings), indent=2))
    elif output_format in REVIEW_FORMATS:
        click.echo(render(output_format, review_results(reports), "convert"), nl=False)
    else:
        for report in reports:
            print_report(report, settings, quiet, color, color_err)
        if reports and not quiet:
            click.echo(summary(reports, settings), err=True)
    if any(r.outcome == "error" or r.blocked for r in reports):
        sys.exit(2)
    if check and any(r.outcome == "changed" for r in reports):
        sys.exit(1)
    sys.exit(0)


def _explain(code: str) -> None:
    """`ddpify --explain CODE`, like `ruff rule`: what the code means, with its example."""
    from ddpify import rules

    if code.lower() == "all":
        click.echo(rules.table())
        sys.exit(0)
    try:
        click.echo(rules.explain(code.strip()), nl=False)
    except KeyError:
        raise click.BadParameter(
            f"no such code {code!r} (`ddpify --explain all` lists them)",
            param_hint="--explain",
        ) from None
    sys.exit(0)


def main(argv: list[str] | None = None) -> None:
    """Entry point: `ddpify verify ...` and `ddpify launch ...` go to their commands, the rest converts."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in SUBCOMMANDS:
        module_name, attr = SUBCOMMANDS[args[0]]
        try:
            command = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            click.echo(f"error: `ddpify {args[0]}` is not available: {exc}", err=True)
            sys.exit(2)
        command.main(args[1:], prog_name=f"ddpify {args[0]}")
        return
    convert_command.main(args, prog_name="ddpify")


if __name__ == "__main__":
    main()
