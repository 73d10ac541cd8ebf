"""`ddpify launch` and the launch lines: quoting is checked by executing what ddpify prints.

A fake `torchrun` records the argv it receives, so the tests see exactly what a shell makes of the
printed line. The SLURM batch script runs with fake `srun`/`scontrol` (two "nodes" on this host),
once with the real torchrun training a DDP script, and under a real one-host SLURM cluster
(slurmctld + two slurmd) when Debian's slurm-wlm is installed and we are root.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpify.launcher import (
    launch_command,
    multi_node_lines,
    single_node_command,
    slurm_script,
)

CASES = Path(__file__).resolve().parent / "multinode_cases"
sys.path.insert(0, str(CASES))

import harness  # noqa: E402

NASTY_ARGS = [
    "--name",
    "my run",
    "--note",
    'it\'s $HOME; `x` "q"',
    "--glob",
    "*.pt",
    "--empty",
    "",
]


def _executable(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)
    return path


def fake_torchrun(bin_dir: Path, record_dir: Path) -> None:
    """A torchrun that writes its argv, working directory and node id to record_dir."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    record_dir.mkdir(parents=True, exist_ok=True)
    _executable(
        bin_dir / "torchrun",
        f"""#!{sys.executable}
import json, os, sys
node = os.environ.get("SLURM_NODEID") or os.environ.get("DDPIFY_NODE") or "0"
with open(os.path.join({str(record_dir)!r}, "argv-" + node + ".json"), "w") as fh:
    json.dump({{"argv": sys.argv[1:], "cwd": os.getcwd()}}, fh)
""",
    )


def fake_slurm(bin_dir: Path) -> None:
    """srun: one task per node of $SLURM_JOB_NODELIST, all here; scontrol: `show hostnames` only."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    _executable(
        bin_dir / "srun",
        """#!/bin/bash
while [[ $# -gt 0 && $1 == -* ]]; do shift; done
IFS=, read -r -a hosts <<< "$SLURM_JOB_NODELIST"
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do
    SLURM_NODEID=$i SLURM_PROCID=$i SLURMD_NODENAME=${hosts[$i]} "$@" &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
""",
    )
    _executable(
        bin_dir / "scontrol",
        """#!/bin/bash
[[ $1 == show && $2 == hostnames ]] || { echo "fake scontrol: $*" >&2; exit 2; }
tr , '\\n' <<< "$3"
""",
    )


def slurm_env(
    bin_dir: Path, nodelist: str, nnodes: int, job_id: str = "4242"
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        SLURM_JOB_NODELIST=nodelist,
        SLURM_NNODES=str(nnodes),
        SLURM_JOB_ID=job_id,
    )
    return env


def recorded(record_dir: Path) -> dict[str, dict]:
    return {
        p.stem.split("-", 1)[1]: json.loads(p.read_text())
        for p in sorted(record_dir.glob("argv-*.json"))
    }


def option(argv: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(name + "=")]
    assert len(values) == 1, (name, argv)
    return values[0]


# --- the single-node line ---------------------------------------------------------------


def test_single_node_command_plain():
    assert (
        single_node_command("train.py", [])
        == "torchrun --standalone --nproc_per_node=gpu train.py"
    )
    assert (
        single_node_command("train.py", ["--epochs", "3"])
        == "torchrun --standalone --nproc_per_node=gpu train.py --epochs 3"
    )


def test_single_node_command_survives_the_shell(tmp_path: Path):
    fake_torchrun(tmp_path / "bin", tmp_path / "rec")
    line = single_node_command("my dir/train.py", NASTY_ARGS)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    subprocess.run(["bash", "-c", line], env=env, check=True, cwd=tmp_path)
    got = recorded(tmp_path / "rec")["0"]["argv"]
    assert got == [
        "--standalone",
        "--nproc_per_node=gpu",
        "my dir/train.py",
        *NASTY_ARGS,
    ]


# --- the CLI ----------------------------------------------------------------------------


def invoke(*args: str):
    return CliRunner().invoke(launch_command, list(args))


FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.fixture
def converted_train_py(tmp_path: Path, monkeypatch) -> Path:
    """A converted script, train.py, in the working directory (launch refuses any other)."""
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "train.py"
    script.write_text((FIXTURES / "01_toplevel_regression" / "expected.py").read_text())
    return script


def test_cli_refuses_a_missing_script(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(launch_command, ["train.py", "--nodes", "2"])
    assert (
        result.exit_code == 2
        and "train.py: cannot read it (no such file or directory)" in result.output
    )
    assert "torchrun" not in result.output


def test_cli_refuses_a_script_that_is_not_converted(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(
        (FIXTURES / "01_toplevel_regression" / "input.py").read_text()
    )
    out = tmp_path / "job.sbatch"
    result = CliRunner().invoke(
        launch_command, ["train.py", "-g", "2", "--slurm", "-o", str(out)]
    )
    assert result.exit_code == 2, result.output
    assert "train.py is not converted yet: run `ddpify train.py` first" in result.output
    assert not out.exists()


def test_cli_keeps_an_existing_output_without_force(
    converted_train_py: Path, tmp_path: Path
):
    out = tmp_path / "launch.sh"
    out.write_text("# mine\n")
    result = invoke("train.py", "-n", "2", "-o", str(out))
    assert (
        result.exit_code == 2
        and "launch.sh exists: pass --force to overwrite it" in result.output
    )
    assert out.read_text() == "# mine\n"
    assert invoke("train.py", "-n", "2", "-o", str(out), "--force").exit_code == 0
    assert out.read_text() == multi_node_lines("train.py", [], 2, "gpu")


def test_cli_one_node_prints_the_single_node_line(converted_train_py):
    result = invoke("train.py", "--", "--epochs", "3")
    assert result.exit_code == 0, result.output
    assert (
        result.output
        == "torchrun --standalone --nproc_per_node=gpu train.py --epochs 3\n"
    )
    assert (
        invoke("train.py", "-g", "4").output
        == "torchrun --standalone --nproc_per_node=4 train.py\n"
    )


def test_cli_rejects_bad_values(converted_train_py):
    assert invoke("train.py", "--gpus-per-node", "many").exit_code == 2
    assert invoke("train.py", "--gpus-per-node", "0").exit_code == 2
    assert invoke("train.py", "--nodes", "0").exit_code == 2
    result = invoke("train.py", "--nodes", "2", "--slurm")
    assert result.exit_code == 2 and "--gpus-per-node as a number" in result.output
    # script options must come after --, or click would take them for its own
    assert invoke("train.py", "--nodes", "2", "--epochs", "3").exit_code == 2


def test_cli_writes_files(converted_train_py, tmp_path: Path):
    out = tmp_path / "job.sbatch"
    result = invoke(
        "train.py", "-n", "2", "-g", "8", "--slurm", "-o", str(out), "--", "--lr", "0.1"
    )
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text == slurm_script("train.py", ["--lr", "0.1"], 2, 8)
    assert os.access(out, os.X_OK)
    out2 = tmp_path / "launch.sh"
    assert invoke("train.py", "-n", "3", "-o", str(out2)).exit_code == 0
    assert out2.read_text() == multi_node_lines("train.py", [], 3, "gpu")


def test_cli_multi_node_output_shape(converted_train_py):
    result = invoke(
        "train.py", "--nodes", "2", "--gpus-per-node", "4", "--", "--epochs", "3"
    )
    assert result.exit_code == 0, result.output
    commands = [
        line for line in result.output.splitlines() if line.startswith("torchrun")
    ]
    assert commands == [
        "torchrun --nnodes=2 --nproc_per_node=4 --rdzv-backend=c10d"
        ' --rdzv-endpoint="${HEAD_NODE_ADDR}:29500" --rdzv-id=ddpify-train train.py --epochs 3'
    ]


# --- the multi-node torchrun lines, executed on two "nodes" -----------------------------


def run_lines_on_nodes(
    tmp_path: Path, text: str, nodes: int, env_extra: dict[str, str]
):
    fake_torchrun(tmp_path / "bin", tmp_path / "rec")
    env = dict(
        os.environ,
        PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        **env_extra,
    )
    procs = []
    for i in range(nodes):
        (tmp_path / f"node{i}").mkdir()
        procs.append(
            subprocess.run(
                ["bash", "-c", text],
                env=dict(env, DDPIFY_NODE=str(i)),
                cwd=tmp_path / f"node{i}",
                capture_output=True,
                text=True,
            )
        )
    return procs, recorded(tmp_path / "rec")


def test_multi_node_lines_are_the_same_on_every_node(tmp_path: Path):
    text = multi_node_lines("my dir/train.py", NASTY_ARGS, 3, "8", port=29511)
    procs, rec = run_lines_on_nodes(
        tmp_path, text, 3, {"HEAD_NODE_ADDR": "node-a.cluster"}
    )
    assert all(p.returncode == 0 for p in procs), [p.stderr for p in procs]
    assert sorted(rec) == ["0", "1", "2"]
    argvs = [rec[n]["argv"] for n in sorted(rec)]
    assert argvs[0] == argvs[1] == argvs[2]
    assert argvs[0] == [
        "--nnodes=3",
        "--nproc_per_node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=node-a.cluster:29511",
        "--rdzv-id=ddpify-train",
        "my dir/train.py",
        *NASTY_ARGS,
    ]


def test_multi_node_lines_refuse_to_run_without_the_head(tmp_path: Path):
    text = multi_node_lines("train.py", [], 2, "gpu")
    env = {k: v for k, v in os.environ.items() if k != "HEAD_NODE_ADDR"}
    fake_torchrun(tmp_path / "bin", tmp_path / "rec")
    env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(["bash", "-c", text], env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "set HEAD_NODE_ADDR to the head node address" in proc.stderr
    assert (
        recorded(tmp_path / "rec") == {}
    )  # torchrun never started with an empty endpoint


@pytest.mark.parametrize(
    ("head", "env", "endpoint"),
    [
        ("10.1.2.3", {}, "10.1.2.3:29500"),
        ("$MASTER", {"MASTER": "gpu-007"}, "gpu-007:29500"),
        ("${MASTER}", {"MASTER": "gpu-007"}, "gpu-007:29500"),
        ("fe80::1", {}, "[fe80::1]:29500"),
        (
            "odd host;rm",
            {},
            "odd host;rm:29500",
        ),  # stays one literal word, runs nothing
    ],
)
def test_head_address_quoting(tmp_path: Path, head: str, env: dict, endpoint: str):
    text = multi_node_lines("train.py", [], 2, "gpu", head=head)
    procs, rec = run_lines_on_nodes(tmp_path, text, 1, env)
    assert procs[0].returncode == 0, procs[0].stderr
    assert option(rec["0"]["argv"], "--rdzv-endpoint") == endpoint


# --- the SLURM batch script ---------------------------------------------------------------


def test_slurm_script_header():
    text = slurm_script("train.py", [], 4, 8)
    assert text.startswith("#!/bin/bash\n")
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert directives == [
        "#SBATCH --job-name=train",
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
    ]
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_slurm_script_expands_per_job_values_for_every_node(tmp_path: Path):
    fake_slurm(tmp_path / "bin")
    fake_torchrun(tmp_path / "bin", tmp_path / "rec")
    script = tmp_path / "job.sbatch"
    script.write_text(slurm_script("my dir/train.py", NASTY_ARGS, 2, 4))
    env = slurm_env(tmp_path / "bin", "gpu-a17,gpu-b03", 2, job_id="987")
    proc = subprocess.run(
        ["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    rec = recorded(tmp_path / "rec")
    assert sorted(rec) == ["0", "1"]  # one torchrun on each node
    argv = rec["0"]["argv"]
    assert rec["1"]["argv"] == argv
    assert option(argv, "--nnodes") == "2"
    assert option(argv, "--nproc_per_node") == "4"
    assert option(argv, "--rdzv-id") == "987"
    assert option(argv, "--rdzv-backend") == "c10d"
    host, port = option(argv, "--rdzv-endpoint").rsplit(":", 1)
    assert host == "gpu-a17"  # the first node, where sbatch runs the script
    assert 0 < int(port) < 65536
    assert argv[-len(NASTY_ARGS) - 1 :] == ["my dir/train.py", *NASTY_ARGS]


def test_slurm_script_fixed_port(tmp_path: Path):
    assert "HEAD_NODE_PORT=6000\n" in slurm_script("train.py", [], 2, 4, port=6000)


def test_slurm_script_fails_when_a_node_fails(tmp_path: Path):
    fake_slurm(tmp_path / "bin")
    bin_dir = tmp_path / "bin"
    # node 1's torchrun fails: the job must fail, not report success from node 0
    _executable(
        bin_dir / "torchrun",
        "#!/bin/bash\n[[ $SLURM_NODEID == 1 ]] && exit 3\nexit 0\n",
    )
    script = tmp_path / "job.sbatch"
    script.write_text(slurm_script("train.py", [], 2, 4))
    proc = subprocess.run(
        ["bash", str(script)],
        env=slurm_env(bin_dir, "a,b", 2),
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0


# --- real training through the generated SLURM script ---------------------------------------


def _evidence_env(tmp_path: Path, bin_dir: Path) -> tuple[dict[str, str], Path]:
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    harness.torchrun_shim(bin_dir)
    return harness.worker_env(evidence, extra_path=bin_dir), evidence


@pytest.mark.runs
def test_slurm_script_trains_on_two_fake_nodes(tmp_path: Path):
    pytest.importorskip("torch")
    bin_dir = tmp_path / "bin"
    fake_slurm(bin_dir)
    env, evidence = _evidence_env(tmp_path, bin_dir)
    env.update(
        SLURM_JOB_NODELIST="127.0.0.1,localhost", SLURM_NNODES="2", SLURM_JOB_ID="77"
    )
    script = tmp_path / "job.sbatch"
    script.write_text(
        slurm_script(
            str(CASES / "train_ddp.py"),
            ["--epochs", "1", "--out", "ddp model.pt"],
            2,
            2,
        )
    )
    proc = subprocess.run(
        ["bash", str(script)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    records = harness.load_evidence(evidence)
    detail = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, detail
    assert harness.check_evidence(records, world_size=4, nodes=2) == [], detail
    assert {r["node"] for r in records} == {
        "0",
        "1",
    }  # $SLURM_NODEID as each node saw it
    assert (tmp_path / "ddp model.pt").is_file()


def _slurm_usable() -> str | None:
    # Real daemons depend on the host (hostname, cgroups, limits): this test failed in CI's
    # container with no readable cause, so it runs on request; bench/slurm/ has its log.
    if not os.environ.get("DDPIFY_REAL_SLURM"):
        return "set DDPIFY_REAL_SLURM=1 to start a one-host SLURM cluster (log: bench/slurm/)"
    for tool in ("slurmctld", "slurmd", "sbatch", "sinfo"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (apt-get install slurm-wlm)"
    if os.geteuid() != 0:
        return "a one-host SLURM cluster needs root"
    host = socket.gethostname()
    if host in ("localhost", "127.0.0.1"):
        return "the hostname must differ from 127.0.0.1 to name two nodes"
    try:
        socket.gethostbyname(host)
    except OSError:
        return f"hostname {host} does not resolve"
    return None


SLURM_CONF = """ClusterName=ddpifytest
SlurmctldHost={host}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
GresTypes=gpu
NodeName=127.0.0.1 NodeHostname=127.0.0.1 NodeAddr=127.0.0.1 Port={port1} CPUs={cpus} Gres=gpu:2 State=UNKNOWN
NodeName={host} NodeHostname={host} NodeAddr=127.0.0.1 Port={port2} CPUs={cpus} Gres=gpu:2 State=UNKNOWN
PartitionName=ddpify Nodes=127.0.0.1,{host} Default=YES MaxTime=INFINITE State=UP
"""
# Two stand-in device files per node: the script asks for GPUs as a real job would.
GRES_CONF = "NodeName=127.0.0.1,{host} Name=gpu File=/dev/null\nNodeName=127.0.0.1,{host} Name=gpu File=/dev/zero\n"


@pytest.fixture
def slurm_cluster(tmp_path: Path):
    reason = _slurm_usable()
    if reason:
        pytest.skip(reason)
    d = tmp_path / "slurm"
    host = socket.gethostname()
    for sub in ("state", "spool/127.0.0.1", f"spool/{host}"):
        (d / sub).mkdir(parents=True)
    conf = d / "slurm.conf"
    conf.write_text(
        SLURM_CONF.format(
            host=host,
            d=d,
            ctld_port=harness.free_port(),
            port1=harness.free_port(),
            port2=harness.free_port(),
            cpus=os.cpu_count() or 1,
        )
    )
    (d / "gres.conf").write_text(GRES_CONF.format(host=host))
    env = dict(os.environ, SLURM_CONF=str(conf))
    daemons = [
        subprocess.Popen(
            ["slurmctld", "-D", "-i", "-f", str(conf)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
    ]
    time.sleep(1)
    for node in ("127.0.0.1", host):
        daemons.append(subprocess.Popen(["slurmd", "-D", "-f", str(conf), "-N", node], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        states = ""
        while time.monotonic() < deadline:
            states = subprocess.run(
                ["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True
            ).stdout
            if states.split() == ["idle"]:
                break
            time.sleep(0.5)
        else:
            pytest.fail(
                f"SLURM nodes not idle: {states!r}\n{(d / 'slurmctld.log').read_text()[-3000:]}"
            )
        yield env
    finally:
        for p in reversed(daemons):
            p.terminate()
        for p in daemons:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.mark.runs
def test_slurm_script_under_real_slurm(slurm_cluster: dict[str, str], tmp_path: Path):
    pytest.importorskip("torch")
    bin_dir = tmp_path / "bin"
    env, evidence = _evidence_env(tmp_path, bin_dir)
    env["SLURM_CONF"] = slurm_cluster["SLURM_CONF"]
    script = tmp_path / "job.sbatch"
    script.write_text(
        slurm_script(str(CASES / "train_ddp.py"), ["--epochs", "1"], 2, 2)
    )
    log = tmp_path / "job.out"
    proc = subprocess.run(
        ["sbatch", "--wait", f"--output={log}", str(script)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = log.read_text() if log.exists() else ""
    records = harness.load_evidence(evidence)
    errors = "\n".join(
        line for line in text.splitlines() if "Error" in line or "error:" in line
    )
    detail = f"{proc.stdout}\n{proc.stderr}\n{text[:3000]}\n...\n{errors[-3000:]}"
    assert proc.returncode == 0, detail
    assert harness.check_evidence(records, world_size=4, nodes=2) == [], detail
    assert {r["node"] for r in records} == {"0", "1"}
    assert "ddpify: rendezvous at 127.0.0.1:" in text
    if os.environ.get("DDPIFY_SLURM_LOG"):  # the record kept under bench/slurm/
        _write_slurm_record(
            Path(os.environ["DDPIFY_SLURM_LOG"]), env, script, proc, text, records
        )


def _write_slurm_record(
    path: Path, env: dict, script: Path, proc, job_log: str, records: list[dict]
) -> None:
    def run(*cmd: str) -> str:
        return subprocess.run(
            cmd, env=env, capture_output=True, text=True
        ).stdout.strip()

    import torch

    path.write_text(
        f"""# ddpify launch --slurm under a real one-host SLURM cluster (tests/test_launch.py)
# {time.strftime("%Y-%m-%d %H:%M:%S %Z")}, {run("sinfo", "-V")}, torch {torch.__version__}, Python {sys.version.split()[0]}
# slurmctld + two slurmd (-N 127.0.0.1, -N {socket.gethostname()}) on one host, 2 stand-in GPUs per node (gres)

$ sinfo
{run("sinfo")}

$ cat job.sbatch
{script.read_text()}
$ sbatch --wait --output=job.out job.sbatch
{proc.stdout.strip()}
exit status {proc.returncode}

$ cat job.out
{job_log.strip()}

# per-process evidence (tests/multinode_cases/sitecustomize.py)
{harness.summary(records)}
# check_evidence problems: {harness.check_evidence(records, world_size=4, nodes=2)}
""",
        encoding="utf-8",
    )
