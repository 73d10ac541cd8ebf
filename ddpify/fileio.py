"""The bytes <-> text layer: read a user's file, hand text to the converter, write it back safely.

What survives a rewrite byte for byte: the declared encoding (PEP 263) and a UTF-8 BOM, the
newline style (CRLF, CR, LF; lines the converter adds take the file's dominant newline), the
absence of a final newline, and the file's mode bits. Writes are atomic: a hidden temporary file in
the same directory is written, fsynced, given the original mode and moved over the target with
os.replace, so a reader (or a crash) sees the old or the new content, never a mix. A writer killed
mid-write leaves its hidden temporary behind; the next run on that directory removes temporaries
whose writer process is gone (clean_stale_temps).
"""

from __future__ import annotations

import codecs
import difflib
import io
import os
import re
import stat
import tokenize
from collections.abc import Callable
from dataclasses import dataclass

TEMP_SUFFIX = ".ddpify-tmp"
# .<name>.<pid>.<random>.ddpify-tmp: hidden, never *.py, and names the writer so a later run can
# tell a live writer's file from one left by a killed writer.
_TEMP_RE = re.compile(
    r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[^.]+" + re.escape(TEMP_SUFFIX) + r"$"
)

# Markers that make a file "generated" (left alone), searched in its first lines like other tools.
GENERATED_MARKER = "@generated"
GENERATED_LINES = 10

_CHUNK = 64 * 1024
# Test hook: called after each chunk written to the temporary file (lets a test kill the writer
# mid-write). None in normal use.
_after_chunk: Callable[[int], None] | None = None


class FileError(Exception):
    """A file that cannot be read, decoded or written; line/col are 1-based where known."""

    def __init__(self, message: str, line: int = 0, col: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.col = col

    def format(self, path: str) -> str:
        where = f"{path}:{self.line}:{self.col}" if self.line else path
        return f"{where}: error: {self.message}"


@dataclass(frozen=True)
class SourceFile:
    data: (
        bytes  # the original bytes, for "unchanged" checks and the stdin echo on error
    )
    text: str  # decoded text with newlines as "\n" when the file's newlines are uniform
    encoding: str  # codec name; "utf-8-sig" when the file starts with a UTF-8 BOM
    newline: str  # the dominant newline: "\n", "\r\n" or "\r"
    uniform: (
        bool  # every newline in the file is `newline` (text was translated to "\n")
    )


def _line_col(data: bytes, offset: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, offset) + 1
    start = data.rfind(b"\n", 0, offset) + 1
    return line, offset - start + 1


def dominant_newline(text: str) -> tuple[str, bool]:
    crlf = text.count("\r\n")
    lf = text.count("\n") - crlf
    cr = text.count("\r") - crlf
    counts = {"\n": lf, "\r\n": crlf, "\r": cr}
    # Ties go to "\n" (the order of the dict); a file without newlines is "\n".
    newline = max(counts, key=lambda k: counts[k])
    uniform = sum(1 for v in counts.values() if v) <= 1
    return newline, uniform


def decode_source(data: bytes) -> SourceFile:
    """Decode Python source the way the interpreter would, or raise FileError."""
    if data.startswith(
        (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
    ):  # UTF-32 BOMs start alike
        raise FileError(
            "UTF-16/UTF-32 encoded file: Python source must be UTF-8 or declare an ASCII-based encoding"
        )
    nul = data.find(b"\0")
    if nul >= 0:
        line, col = _line_col(data, nul)
        raise FileError(
            "binary file (contains NUL bytes), not Python source", line, col
        )
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        msg = str(exc)
        if "invalid or missing encoding declaration" in msg:
            encoding = "utf-8"  # undecodable first lines: report the exact byte below
        else:
            first_two = data.splitlines()[:2]
            line = next(
                (
                    i + 1
                    for i, ln in enumerate(first_two)
                    if re.search(rb"coding[:=]", ln)
                ),
                1,
            )
            raise FileError(
                f"bad encoding declaration: {msg.split(':', 1)[0]}", line, 1
            ) from None
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        line, col = _line_col(data, exc.start)
        bad = data[exc.start : exc.start + 1].hex()
        name = "UTF-8" if encoding in ("utf-8", "utf-8-sig") else encoding
        hint = ' (declare the encoding with a coding line, e.g. "# -*- coding: latin-1 -*-", PEP 263)'
        raise FileError(
            f"not valid {name}: byte 0x{bad}{hint if name == 'UTF-8' else ''}",
            line,
            col,
        ) from None
    newline, uniform = dominant_newline(text)
    if uniform and newline != "\n":
        text = text.replace(newline, "\n")
    return SourceFile(data, text, encoding, newline, uniform)


def encode_source(src: SourceFile, text: str) -> bytes:
    """Encode converted text like the original: same codec (BOM included) and newlines."""
    if src.uniform:
        if src.newline != "\n":
            text = text.replace("\n", src.newline)
    else:
        text = _restore_mixed_newlines(src, text)
    try:
        return text.encode(src.encoding)
    except UnicodeEncodeError as exc:
        raise FileError(
            f"the converted code cannot be encoded in the file's encoding ({src.encoding}): {exc.reason}"
        ) from None


def _split_lines(text: str) -> list[str]:
    return [line for line in re.split(r"(?<=\n)|(?<=\r)(?!\n)", text) if line]


def _restore_mixed_newlines(src: SourceFile, text: str) -> str:
    """A mixed-newline file reached the converter as is: lines it kept are kept byte for byte
    (whatever their newline), lines it added take the file's dominant newline."""
    before = _split_lines(src.text)
    after = _split_lines(text)
    out: list[str] = []
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    for op, _, _, j1, j2 in matcher.get_opcodes():
        for line in after[j1:j2]:
            if op != "equal" and line.endswith("\n") and not line.endswith("\r\n"):
                line = line[:-1] + src.newline
            out.append(line)
    return "".join(out)


def is_generated(text: str) -> bool:
    """True when the file says it is generated (@generated in its first lines)."""
    head = text.split("\n", GENERATED_LINES)[:GENERATED_LINES]
    return any(GENERATED_MARKER in line for line in head)


def read_bytes(path: str) -> bytes:
    """Read a regular file, with one-line errors for everything that is not one."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise FileError(
                f"broken symbolic link (points to {os.readlink(path)!r})"
            ) from None
        raise FileError("no such file or directory") from None
    except OSError as exc:
        raise FileError(_strerror(exc)) from None
    if stat.S_ISDIR(st.st_mode):
        raise FileError("is a directory")
    if not stat.S_ISREG(st.st_mode):
        # Never open FIFOs or devices: reading one can block forever.
        raise FileError("not a regular file")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise FileError(_strerror(exc)) from None


def _strerror(exc: OSError) -> str:
    if isinstance(exc, PermissionError):
        return "permission denied (cannot read the file)"
    return (exc.strerror or str(exc)).lower()


def file_signature(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def check_writable(path: str) -> None:
    """Refuse to replace read-only files (os.replace would silently succeed on them)."""
    target = os.path.realpath(path)
    st = os.stat(target)
    if not (st.st_mode & 0o222) or not os.access(target, os.W_OK):
        raise FileError("file is read-only: not rewritten")
    if not os.access(os.path.dirname(target) or ".", os.W_OK | os.X_OK):
        raise FileError("cannot write to the file's directory: not rewritten")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def clean_stale_temps(directory: str) -> list[str]:
    """Remove temporaries left by ddpify writers that were killed; returns the removed paths."""
    removed = []
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return removed
    for name in names:
        m = _TEMP_RE.match(name)
        if not m or _pid_alive(int(m.group("pid"))):
            continue
        full = os.path.join(directory, name)
        try:
            os.unlink(full)
            removed.append(full)
        except OSError:
            pass
    return removed


def write_atomic(
    path: str, data: bytes, expected: tuple[int, int, int] | None = None
) -> None:
    """Replace the file at `path` (a symlink's target) with `data`, atomically.

    `expected` is file_signature() taken when the file was read: if the file changed since, it is
    left alone (someone else wrote it while we converted).
    """
    target = os.path.realpath(path)
    directory = os.path.dirname(target)
    st = os.stat(target)
    import tempfile  # only a write needs it (not --check, not --diff)

    fd, tmp = tempfile.mkstemp(
        prefix=f".{os.path.basename(target)}.{os.getpid()}.",
        suffix=TEMP_SUFFIX,
        dir=directory,
    )
    try:
        with os.fdopen(fd, "wb") as f:
            view = memoryview(data)
            for start in range(0, len(data), _CHUNK):
                f.write(view[start : start + _CHUNK])
                if _after_chunk is not None:
                    _after_chunk(start + _CHUNK)
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), stat.S_IMODE(st.st_mode))
            if (st.st_uid, st.st_gid) != (os.getuid(), os.getgid()):
                try:
                    os.fchown(f.fileno(), st.st_uid, st.st_gid)
                except OSError:
                    pass  # only root may give files away; the mode bits are kept regardless
        if expected is not None and file_signature(target) != expected:
            raise FileError(
                "the file changed while it was being converted: not rewritten"
            )
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename is already done
    finally:
        os.close(dfd)
