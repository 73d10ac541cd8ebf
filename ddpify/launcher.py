"""`ddpify launch`: the command lines that start a converted script on one or many nodes.

Multi-node runs use torchrun's c10d rendezvous: every node runs the same command, and the
rendezvous numbers the nodes itself, so no per-node value (node rank, $SLURM_NODEID) has to be
written into the command. Only the head node's address and a port must be agreed on.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import click

DEFAULT_PORT = 29500
HEAD_PLACEHOLDER = "$HEAD_NODE_ADDR"
# torchrun's --nproc_per_node keywords that make sense for a GPU launch.
NPROC_KEYWORDS = ("gpu", "auto")

_SHELL_VAR = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})")


def _command(script_path: str, script_args: list[str] | tuple[str, ...]) -> str:
    return " ".join(shlex.quote(a) for a in [script_path, *script_args])


def single_node_command(
    script_path: str, script_args: list[str], nproc: str = "gpu"
) -> str:
    """The line that runs a converted script on every GPU of one machine."""
    return f"torchrun --standalone --nproc_per_node={nproc} {_command(script_path, script_args)}"


def rdzv_id(script_path: str) -> str:
    """A rendezvous id every node derives the same way from the script name."""
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", Path(script_path).stem).strip("-")
    return f"ddpify-{stem or 'job'}"


def _endpoint(head: str, port: int) -> str:
    """HOST:PORT as one shell word; a $VARIABLE head stays expandable, anything else is literal."""
    if _SHELL_VAR.fullmatch(head):
        name = head[1:].strip("{}")
        return f'"${{{name}}}:{port}"'
    if ":" in head and not head.startswith("["):
        head = f"[{head}]"  # IPv6 literal
    return shlex.quote(f"{head}:{port}")


def multi_node_lines(
    script_path: str,
    script_args: list[str] | tuple[str, ...],
    nodes: int,
    nproc: str,
    port: int = DEFAULT_PORT,
    head: str = HEAD_PLACEHOLDER,
) -> str:
    """A shell snippet to run on each node: the same torchrun line everywhere."""
    per_node = "all GPUs" if nproc in NPROC_KEYWORDS else f"{nproc} GPUs"
    lines = [
        f"# ddpify launch: {nodes} nodes x {per_node} per node.",
        f"# Run this same command on each of the {nodes} nodes; torchrun's c10d rendezvous numbers",
        "# the nodes, so none needs a node rank. The head is any one of the nodes: every node must",
        f"# reach it at port {port}, which must be free there.",
    ]
    if _SHELL_VAR.fullmatch(head):
        name = head[1:].strip("{}")
        lines.append(f': "${{{name}:?set {name} to the head node address}}"')
    lines.append(
        f"torchrun --nnodes={nodes} --nproc_per_node={nproc}"
        f" --rdzv-backend=c10d --rdzv-endpoint={_endpoint(head, port)}"
        f" --rdzv-id={rdzv_id(script_path)} {_command(script_path, script_args)}"
    )
    return "\n".join(lines) + "\n"


# Binding port 0 lets the kernel pick a port that is free on this host at job start.
_FREE_PORT = "python3 -c 'import socket; s = socket.socket(); s.bind((\"\", 0)); print(s.getsockname()[1])'"


def slurm_script(
    script_path: str,
    script_args: list[str] | tuple[str, ...],
    nodes: int,
    gpus_per_node: int,
    port: int | None = None,
) -> str:
    """A batch script for sbatch: one torchrun per node through srun, rendezvous on the first node."""
    job = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(script_path).stem) or "ddpify"
    port_line = (
        f"HEAD_NODE_PORT={port}"
        if port is not None
        else f"HEAD_NODE_PORT=$({_FREE_PORT})"
    )
    return f"""#!/bin/bash
#SBATCH --job-name={job}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={gpus_per_node}
# Written by `ddpify launch --slurm`. Submit with: sbatch THIS_FILE
# srun starts one torchrun per node; each torchrun starts {gpus_per_node} processes, one per GPU.
# No pipefail: `head -n 1` may close the pipe early on a long node list.
set -eu

# sbatch runs this script on the first node of the allocation: that node hosts the rendezvous.
HEAD_NODE_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
{port_line}
echo "ddpify: rendezvous at $HEAD_NODE_ADDR:$HEAD_NODE_PORT for $SLURM_NNODES nodes" >&2

# The variables below are expanded here, once, and are the same on every node. Nothing
# node-specific such as $SLURM_NODEID is written into this line: expanded by this shell it
# would be the head's value on every node. c10d numbers the nodes itself.
srun --ntasks-per-node=1 --kill-on-bad-exit=1 --label \\
    torchrun \\
    --nnodes="$SLURM_NNODES" \\
    --nproc_per_node={gpus_per_node} \\
    --rdzv-id="$SLURM_JOB_ID" \\
    --rdzv-backend=c10d \\
    --rdzv-endpoint="$HEAD_NODE_ADDR:$HEAD_NODE_PORT" \\
    {_command(script_path, script_args)}
"""


def _check_script(script: str) -> None:
    """Refuse a script that is missing or not distributed yet: torchrun would start N copies of
    a single-process script, each training on all the data and writing the same files."""
    from ddpify.pipeline import convert_source

    try:
        with open(script, "rb") as f:
            data = f.read()
    except OSError as exc:
        click.echo(
            f"error: {script}: cannot read it ({(exc.strerror or str(exc)).lower()})",
            err=True,
        )
        sys.exit(2)
    try:
        result = convert_source(data.decode("utf-8", errors="replace"), path=script)
    except (
        Exception
    ):  # a file the converter cannot read: torchrun will say what is wrong with it
        return
    if result.status == "refused":
        click.echo(
            f"error: {script} is not distributed, and ddpify refuses to convert it (`ddpify {shlex.quote(script)}` "
            "says why): make it a DDP script first",
            err=True,
        )
        sys.exit(2)
    if result.changed:
        click.echo(
            f"error: {script} is not converted yet: run `ddpify {shlex.quote(script)}` first, then launch it "
            "(torchrun would start copies of a one-process script, each training on all the data)",
            err=True,
        )
        sys.exit(2)
    if result.status == "not-training":
        click.echo(
            f"warning: {script} has no training step ddpify can see; launching it as it is",
            err=True,
        )


class _NprocType(click.ParamType):
    name = "N|gpu"

    def convert(self, value, param, ctx):
        text = str(value).strip()
        if text in NPROC_KEYWORDS:
            return text
        if text.isdigit() and int(text) > 0:
            return str(int(text))
        self.fail(
            f"{value!r} is not a positive number of GPUs or one of {', '.join(NPROC_KEYWORDS)}",
            param,
            ctx,
        )


@click.command("launch", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("script", type=click.Path(dir_okay=False))
@click.option(
    "--nodes",
    "-n",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Number of machines.",
)
@click.option(
    "--gpus-per-node",
    "-g",
    type=_NprocType(),
    default="gpu",
    show_default=True,
    metavar="N|gpu",
    help="Processes (GPUs) per node: a number, or 'gpu' for all GPUs of each node.",
)
@click.option(
    "--slurm",
    is_flag=True,
    help="Write a SLURM batch script (one torchrun per node through srun).",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help=f"Rendezvous port on the head node [torchrun lines: {DEFAULT_PORT}; SLURM: a free port picked at job start].",
)
@click.option(
    "--head",
    default=HEAD_PLACEHOLDER,
    show_default=True,
    help="Head node address for the torchrun lines; a $VARIABLE is left for the shell to expand.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    help="Write to FILE instead of printing.",
)
@click.option("--force", is_flag=True, help="Overwrite the -o FILE if it exists.")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def launch_command(
    script: str,
    nodes: int,
    gpus_per_node: str,
    slurm: bool,
    port: int | None,
    head: str,
    output: str | None,
    force: bool,
    script_args: tuple[str, ...],
) -> None:
    """Print the command that runs SCRIPT on NODES machines (script arguments after --).

    \b
    ddpify launch train.py --nodes 2 --gpus-per-node 8 -- --epochs 10
    ddpify launch train.py --nodes 4 --gpus-per-node 8 --slurm -o train.sbatch
    """
    if output and os.path.exists(output) and not force:
        raise click.UsageError(f"{output} exists: pass --force to overwrite it")
    _check_script(script)
    if slurm:
        if not gpus_per_node.isdigit():
            raise click.UsageError(
                "--slurm needs --gpus-per-node as a number: SLURM allocates GPUs by count."
            )
        text = slurm_script(script, script_args, nodes, int(gpus_per_node), port)
    elif nodes == 1:
        text = single_node_command(script, list(script_args), gpus_per_node) + "\n"
    else:
        text = multi_node_lines(
            script, script_args, nodes, gpus_per_node, port or DEFAULT_PORT, head
        )
    if output:
        Path(output).write_text(text, encoding="utf-8")
        if slurm:
            Path(output).chmod(0o755)
            click.echo(
                f"wrote {output}; submit it with: sbatch {shlex.quote(output)}",
                err=True,
            )
        else:
            click.echo(
                f"wrote {output}; run it on every node with: bash {shlex.quote(output)}",
                err=True,
            )
    else:
        click.echo(text, nl=False)
