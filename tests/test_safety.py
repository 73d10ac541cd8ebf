"""Handling users' files safely (issue 6): bad input, byte-exact round trips, atomic writes,
suppression comments, and the guarantee that the user's code is never run.
"""

from __future__ import annotations

import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import ddpify.pipeline as pipeline
from ddpify import fileio
from ddpify.cli import convert_command
from ddpify.findings import Finding
from ddpify.pipeline import Result

ROOT = Path(__file__).resolve().parents[1]

# A plain single-GPU training script (CPU-friendly) for the end-to-end tests with the real converter.
TRAIN_SCRIPT = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 2)

    def forward(self, x):
        return self.fc(x)


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dataset = TensorDataset(torch.randn(256, 10), torch.randint(0, 2, (256,)))
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(2):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")
    torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
"""

TRAIN = "import torch  # TRAIN\nmodel = torch.nn.Linear(2, 2)\n"


def fake_convert(source: str, options=None, path: str = "<stdin>") -> Result:
    """Adds a line after "# TRAIN" (with a bare "\\n", like LibCST templates can)."""
    if "# TRAIN" not in source:
        return Result(source, False, "not-training", [])
    extra = "# añadido ✓\n" if "UNENCODABLE" in source else ""
    new = source.replace(
        "# TRAIN", "# TRAIN\n" + extra + "import torch.distributed as dist", 1
    )
    return Result(
        new,
        True,
        "converted",
        [Finding(1, 1, "DDP001", "process-group setup added", True)],
    )


@pytest.fixture
def fake(monkeypatch, tmp_path):
    monkeypatch.setattr(pipeline, "convert_source", fake_convert)
    monkeypatch.chdir(tmp_path)


def invoke(*args: str, input=None):
    return CliRunner().invoke(
        convert_command, list(args), input=input, catch_exceptions=False
    )


# --------------------------------------------------------------------------- bad input


def test_bad_inputs_each_get_one_clear_line_and_stay_untouched(fake, tmp_path):
    files = {
        "syntax.py": b"def f(:\n    pass\n",
        "py2.py": b"import os\nprint 'hello'\n",
        "latin1.py": b"x = 1\n# caf\xe9\n",
        "binary.py": b"\x7fELF\x02\x01\x01\x00\x00\x00",
        "badcookie.py": b"# -*- coding: klingon -*-\nx = 1\n",
        "utf16.py": "x = 1\n".encode("utf-16"),
        "empty.py": b"",
        "comments.py": b"# nothing here\n\n# really\n",
        "good.py": TRAIN.encode(),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    os.symlink("nowhere.py", tmp_path / "dangling.py")
    (tmp_path / "nb.ipynb").write_text("{}")
    (tmp_path / "nopy").mkdir()
    res = invoke(*files, "dangling.py", "missing.py", "nb.ipynb", "nopy")
    assert res.exit_code == 2
    err = res.stderr.splitlines()
    wanted = {
        "syntax.py": "syntax.py:1:7: error: SyntaxError: invalid syntax",
        "py2.py": "py2.py:2:1: error: SyntaxError: Missing parentheses in call to 'print'. Did you mean print(...)? "
        "(Python 2 code? ddpify converts Python 3 only)",
        "latin1.py": 'latin1.py:2:6: error: not valid UTF-8: byte 0xe9 (declare the encoding with a coding line, e.g. "# -*- coding: latin-1 -*-", PEP 263)',
        "binary.py": "binary.py:1:8: error: binary file (contains NUL bytes), not Python source",
        "badcookie.py": "badcookie.py:1:1: error: bad encoding declaration",
        "utf16.py": "utf16.py: error: UTF-16/UTF-32 encoded file",
        "dangling.py": "dangling.py: error: broken symbolic link (points to 'nowhere.py')",
        "missing.py": "missing.py: error: no such file or directory",
        "nb.ipynb": "nb.ipynb: error: notebooks are not converted",
        "nopy": "nopy: warning: no Python files found",
    }
    for name, line in wanted.items():
        hits = [e for e in err if e.startswith(line)]
        assert len(hits) == 1, (name, err)
    # Empty and comment-only files are a quiet no-op, like black and ruff.
    assert not any(e.startswith(("empty.py", "comments.py")) for e in err)
    for name, data in files.items():
        if name != "good.py":
            assert (tmp_path / name).read_bytes() == data, name
    assert "import torch.distributed" in (tmp_path / "good.py").read_text()
    assert (
        err[-1]
        == "1 file converted, 2 files left unchanged, 9 files failed to convert."
    )


def test_empty_and_comment_only_files_exit_0(fake, tmp_path):
    (tmp_path / "empty.py").write_bytes(b"")
    (tmp_path / "comments.py").write_bytes(b"#!/usr/bin/env python\n# nothing\n")
    res = invoke("--check", "empty.py", "comments.py")
    assert res.exit_code == 0
    assert res.stderr == "2 files would be left unchanged.\n"


def test_unreadable_file(fake, tmp_path, monkeypatch):
    (tmp_path / "secret.py").write_text(TRAIN)
    (tmp_path / "good.py").write_text(TRAIN)
    real_open = open

    def guarded_open(path, *args, **kwargs):
        if str(path).endswith("secret.py"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    # Root reads anything, so the refusal is simulated where fileio opens the file.
    monkeypatch.setattr(fileio, "open", guarded_open, raising=False)
    res = invoke("secret.py", "good.py")
    assert res.exit_code == 2
    assert "secret.py: error: permission denied (cannot read the file)" in res.stderr
    assert "import torch.distributed" in (tmp_path / "good.py").read_text()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read a mode-000 file")
def test_unreadable_file_for_real(fake, tmp_path):
    p = tmp_path / "secret.py"
    p.write_text(TRAIN)
    p.chmod(0)
    res = invoke("secret.py")
    assert res.exit_code == 2 and "secret.py: error: permission denied" in res.stderr


def test_read_only_file_is_not_replaced(fake, tmp_path):
    p = tmp_path / "ro.py"
    p.write_text(TRAIN)
    p.chmod(0o444)
    res = invoke("ro.py")
    assert res.exit_code == 2
    assert "ro.py: error: file is read-only: not rewritten" in res.stderr
    assert p.read_text() == TRAIN and stat.S_IMODE(p.stat().st_mode) == 0o444
    # Reading it is fine: check and diff modes work.
    assert invoke("--check", "ro.py").exit_code == 1


def test_declared_encoding_is_decoded_and_kept(fake, tmp_path):
    data = "# -*- coding: latin-1 -*-\nimport torch  # TRAIN\n# café\n".encode(
        "latin-1"
    )
    (tmp_path / "l1.py").write_bytes(data)
    assert invoke("l1.py").exit_code == 0
    out = (tmp_path / "l1.py").read_bytes()
    assert (
        out
        == "# -*- coding: latin-1 -*-\nimport torch  # TRAIN\nimport torch.distributed as dist\n# café\n".encode(
            "latin-1"
        )
    )


def test_output_that_cannot_be_encoded_is_refused(fake, tmp_path):
    data = "# -*- coding: latin-1 -*-\nimport torch  # TRAIN UNENCODABLE\n".encode(
        "latin-1"
    )
    (tmp_path / "l1.py").write_bytes(data)
    res = invoke("l1.py")
    assert res.exit_code == 2
    assert (
        "l1.py: error: the converted code cannot be encoded in the file's encoding (iso-8859-1)"
        in res.stderr
    )
    assert (tmp_path / "l1.py").read_bytes() == data


# --------------------------------------------------------------------------- byte-exact round trips (mechanics)


@pytest.mark.parametrize(
    "name, before, after",
    [
        (
            "crlf",
            b"import torch  # TRAIN\r\nx = 1\r\n",
            b"import torch  # TRAIN\r\nimport torch.distributed as dist\r\nx = 1\r\n",
        ),
        (
            "bom",
            b"\xef\xbb\xbfimport torch  # TRAIN\nx = 1\n",
            b"\xef\xbb\xbfimport torch  # TRAIN\nimport torch.distributed as dist\nx = 1\n",
        ),
        (
            "no-final-newline",
            b"import torch  # TRAIN\nx = 1",
            b"import torch  # TRAIN\nimport torch.distributed as dist\nx = 1",
        ),
        (
            "cr",
            b"import torch  # TRAIN\rx = 1\r",
            b"import torch  # TRAIN\rimport torch.distributed as dist\rx = 1\r",
        ),
        # Mixed newlines: untouched lines keep theirs, new lines take the dominant one.
        (
            "mixed",
            b"import torch  # TRAIN\r\nx = 1\r\ny = 2\n",
            b"import torch  # TRAIN\r\nimport torch.distributed as dist\r\nx = 1\r\ny = 2\n",
        ),
        (
            "tabs",
            b"import torch  # TRAIN\nif x:\n\ty = 1\n",
            b"import torch  # TRAIN\nimport torch.distributed as dist\nif x:\n\ty = 1\n",
        ),
    ],
)
def test_bytes_survive_a_rewrite(fake, tmp_path, name, before, after):
    p = tmp_path / "t.py"
    p.write_bytes(before)
    p.chmod(0o751)
    res = invoke("t.py")
    assert res.exit_code == 0, res.stderr
    assert p.read_bytes() == after
    assert stat.S_IMODE(p.stat().st_mode) == 0o751
    assert [
        n for n in os.listdir(tmp_path) if n != "t.py"
    ] == []  # no temporary left behind


def test_symlink_target_is_rewritten_and_link_kept(fake, tmp_path):
    (tmp_path / "real.py").write_text(TRAIN)
    os.symlink("real.py", tmp_path / "link.py")
    assert invoke("link.py").exit_code == 0
    assert os.path.islink(tmp_path / "link.py")
    assert "import torch.distributed" in (tmp_path / "real.py").read_text()


def test_file_changed_during_conversion_is_not_overwritten(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "t.py"
    p.write_text(TRAIN)

    def racing_convert(source, options=None, path="<stdin>"):
        time.sleep(0.01)
        p.write_text(
            TRAIN + "# edited by the user meanwhile\n"
        )  # an editor saves mid-run
        return fake_convert(source, options, path)

    monkeypatch.setattr(pipeline, "convert_source", racing_convert)
    res = invoke("t.py")
    assert res.exit_code == 2
    assert (
        "t.py: error: the file changed while it was being converted: not rewritten"
        in res.stderr
    )
    assert p.read_text() == TRAIN + "# edited by the user meanwhile\n"


# --------------------------------------------------------------------------- atomic writes


WRITER = textwrap.dedent(
    """
    import sys, time
    from ddpify import fileio
    target, size, pause = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "pause"
    def hook(done):
        if pause:
            print("paused", flush=True)
            time.sleep(60)
    fileio._after_chunk = hook
    print("ready", flush=True)
    i = 0
    while True:
        fileio.write_atomic(target, (b"AB"[i % 2:i % 2 + 1] * size))
        i += 1
    """
)


def _writer(target: Path, size: int, pause: bool) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            WRITER,
            str(target),
            str(size),
            "pause" if pause else "run",
        ],
        stdout=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout.readline() == b"ready\n"
    return proc


@pytest.mark.runs
def test_writer_killed_mid_write_leaves_old_content_and_a_hidden_temp_cleaned_next_run(
    fake, tmp_path
):
    target = tmp_path / "train.py"
    old = TRAIN.encode()
    target.write_bytes(old)
    proc = _writer(target, 4 * 1024 * 1024, pause=True)
    assert proc.stdout.readline() == b"paused\n"  # first chunk written, second not yet
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert target.read_bytes() == old
    temps = [n for n in os.listdir(tmp_path) if n != "train.py"]
    assert (
        len(temps) == 1
        and temps[0].startswith(".train.py.")
        and temps[0].endswith(fileio.TEMP_SUFFIX)
    )
    assert (tmp_path / temps[0]).stat().st_size > 0  # it really was killed mid-write
    # Hidden and not *.py: never collected as input.
    res = invoke("--check", ".")
    assert res.exit_code == 1 and "would convert train.py" in res.stderr.splitlines()
    assert os.path.exists(
        tmp_path / temps[0]
    )  # check mode writes (and deletes) nothing
    # The next rewriting run removes the dead writer's temporary.
    assert invoke(".").exit_code == 0
    assert os.listdir(tmp_path) == ["train.py"]


def test_temp_of_a_live_writer_is_not_removed(tmp_path):
    live = tmp_path / f".train.py.{os.getpid()}.abc{fileio.TEMP_SUFFIX}"
    live.write_bytes(b"x")
    assert fileio.clean_stale_temps(str(tmp_path)) == []
    assert live.exists()


@pytest.mark.runs
def test_random_kills_never_leave_a_mix(tmp_path):
    target = tmp_path / "big.py"
    size = 1024 * 1024  # 16 chunks
    target.write_bytes(b"A" * size)
    rng = random.Random(0)
    for _ in range(5):
        proc = _writer(target, size, pause=False)
        time.sleep(rng.uniform(0.0, 0.15))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        data = target.read_bytes()
        assert data in (b"A" * size, b"B" * size)
    fileio.clean_stale_temps(str(tmp_path))
    assert os.listdir(tmp_path) == ["big.py"]


# --------------------------------------------------------------------------- end to end with the real converter


def _convert_text(text: str, tmp_path: Path, *flags: str) -> str:
    p = tmp_path / "e2e.py"
    p.write_bytes(text.encode())
    res = invoke(*flags, str(p))
    assert res.exit_code == 0, res.stderr
    return p.read_bytes().decode()


@pytest.fixture
def converted(tmp_path):
    out = _convert_text(TRAIN_SCRIPT, tmp_path)
    assert out != TRAIN_SCRIPT
    return out


def _tabify(text: str) -> str:
    lines = []
    for line in text.split("\n"):
        stripped = line.lstrip(" ")
        lines.append("\t" * ((len(line) - len(stripped)) // 4) + stripped)
    return "\n".join(lines)


@pytest.mark.parametrize(
    "variant",
    [
        ("crlf", lambda b: b.replace(b"\n", b"\r\n")),
        ("bom", lambda b: b"\xef\xbb\xbf" + b),
        ("no-final-newline", lambda b: b[:-1]),
        ("tabs", lambda b: _tabify(b.decode()).encode()),
        (
            "latin-1",
            lambda b: (
                "# -*- coding: latin-1 -*-\n# entraînement\n".encode("latin-1") + b
            ),
        ),
    ],
    ids=lambda v: v[0],
)
def test_real_conversion_keeps_file_format(tmp_path, converted, variant):
    _, apply = variant
    p = tmp_path / "v.py"
    p.write_bytes(apply(TRAIN_SCRIPT.encode("latin-1")))
    p.chmod(0o755)
    res = invoke(str(p))
    assert res.exit_code == 0, res.stderr
    assert p.read_bytes() == apply(converted.encode("latin-1"))
    assert stat.S_IMODE(p.stat().st_mode) == 0o755


@pytest.mark.runs
def test_never_runs_or_imports_the_users_code(tmp_path):
    marker = tmp_path / "EXECUTED"
    (tmp_path / "evil_helper.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\n"
    )
    script = (
        f"import evil_helper\nopen({str(marker)!r}, 'w').write('ran')\nraise SystemExit('executed')\n"
        + TRAIN_SCRIPT
    )
    (tmp_path / "train.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-m", "ddpify", "train.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "train.py").read_text() != script  # it was really converted
    assert not marker.exists()


def test_skip_comment_leaves_the_line_alone(tmp_path, converted):
    line = '        print(f"epoch {epoch} loss {loss.item():.4f}")'
    assert line not in converted.split(
        "\n"
    )  # without the marker the converter changes this line
    out = _convert_text(TRAIN_SCRIPT.replace(line, line + "  # ddpify: skip"), tmp_path)
    lines = out.split("\n")
    i = lines.index(line + "  # ddpify: skip")
    assert "RANK" not in lines[i - 1]  # not moved under a rank-0 guard


def test_off_on_block_is_left_alone(tmp_path, converted):
    block = '    torch.save(model.state_dict(), "model.pt")\n'
    assert "\n" + block not in converted
    fenced = "    # ddpify: off\n" + block + "    # ddpify: on\n"
    out = _convert_text(TRAIN_SCRIPT.replace(block, fenced), tmp_path)
    assert fenced in out
    assert out != TRAIN_SCRIPT.replace(block, fenced)  # the rest is still converted


def test_generated_file_is_left_alone_end_to_end(tmp_path):
    src = "# This file is @generated by a tool. Do not edit.\n" + TRAIN_SCRIPT
    p = tmp_path / "gen.py"
    p.write_text(src)
    res = invoke(str(p))
    assert res.exit_code == 0
    assert p.read_text() == src
    assert f"{p}: note: marked @generated: left unchanged" in res.stderr


def test_fifo_is_refused_without_blocking(fake, tmp_path):
    os.mkfifo(tmp_path / "pipe.py")
    (tmp_path / "good.py").write_text(TRAIN)
    res = invoke("pipe.py", "good.py")
    assert res.exit_code == 2
    assert "pipe.py: error: not a regular file" in res.stderr
    assert "import torch.distributed" in (tmp_path / "good.py").read_text()
