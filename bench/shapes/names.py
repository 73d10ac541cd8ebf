"""Random identifiers: nothing a rule could key on."""

from __future__ import annotations

import builtins
import keyword
import random

_ONSETS = [
    "b",
    "c",
    "d",
    "f",
    "g",
    "h",
    "j",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "w",
    "z",
    "br",
    "cr",
    "dr",
    "fl",
    "gr",
    "kl",
    "pl",
    "pr",
    "sk",
    "sl",
    "sn",
    "st",
    "tr",
    "qu",
    "th",
    "sh",
]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io"]
_CODAS = ["", "", "n", "r", "l", "m", "x", "st", "nd", "rk", "s", "t"]

# Names the generated scripts import or that Python gives a meaning.
RESERVED = (
    set(keyword.kwlist)
    | set(dir(builtins))
    | {
        "torch",
        "nn",
        "F",
        "np",
        "os",
        "sys",
        "json",
        "time",
        "random",
        "pickle",
        "csv",
        "logging",
        "math",
        "itertools",
        "functools",
        "copy",
        "dataclass",
        "dataclasses",
        "field",
        "Path",
        "pathlib",
        "argparse",
        "DataLoader",
        "Dataset",
        "IterableDataset",
        "TensorDataset",
        "Subset",
        "random_split",
        "main",
        "self",
        "cls",
        "test",
        "tests",
        "site",
        "sitecustomize",
        "setup",
        "train",
        "numpy",
        "io",
        "re",
        "typing",
        "abc",
        "string",
        "types",
        "enum",
        "code",
        "signal",
        "select",
        "socket",
        "array",
        "queue",
        "heapq",
        "bisect",
        "token",
        "parser",
        "ast",
        "dis",
        "nis",
        "grp",
        "pwd",
        "pty",
        "tty",
        "uu",
        "wave",
        "cmd",
        "imp",
        "this",
        "antigravity",
        "turtle",
        "shelve",
        "glob",
        "fnmatch",
        "shutil",
        "tempfile",
        "platform",
        "locale",
        "errno",
        "stat",
        "struct",
        "zlib",
        "gzip",
        "bz2",
        "lzma",
        "zipfile",
        "tarfile",
        "uuid",
        "hashlib",
        "hmac",
        "secrets",
        "base64",
        "binascii",
        "codecs",
        "html",
        "http",
        "email",
        "mailbox",
        "mimetypes",
        "wsgiref",
        "xml",
        "curses",
        "ctypes",
        "asyncio",
        "threading",
        "multiprocessing",
        "concurrent",
        "subprocess",
        "sched",
        "contextvars",
        "weakref",
        "gc",
        "inspect",
        "trace",
        "traceback",
        "pdb",
        "timeit",
        "operator",
        "warnings",
        "contextlib",
        "atexit",
        "numbers",
        "decimal",
        "fractions",
        "statistics",
        "datetime",
        "calendar",
        "collections",
        "pprint",
        "reprlib",
        "graphlib",
        "textwrap",
        "difflib",
        "unicodedata",
        "readline",
        "rlcompleter",
        "builtins",
        "importlib",
        "pkgutil",
        "modulefinder",
        "runpy",
        "zipimport",
        "venv",
        "ensurepip",
        "distutils",
        "lib2to3",
        "idlelib",
        "tkinter",
        "unittest",
        "doctest",
        "pydoc",
        "sqlite3",
        "dbm",
        "ssl",
        "select",
        "selectors",
        "mmap",
        "codeop",
        "symtable",
        "tabnanny",
        "pyclbr",
        "py_compile",
        "compileall",
        "filecmp",
        "fileinput",
        "linecache",
        "netrc",
        "plistlib",
        "configparser",
        "getopt",
        "getpass",
        "optparse",
        "posix",
        "resource",
        "syslog",
        "termios",
        "fcntl",
        "pipes",
        "crypt",
        "spwd",
        "nturl2path",
        "opcode",
        "ddpify",
        "tqdm",
        "wandb",
        "tensorboard",
        "yaml",
        "hydra",
        "fire",
        "click",
        "typer",
        "apex",
        "accelerate",
        "lightning",
        "setuptools",
        "pip",
        "pkg_resources",
        "sklearn",
        "scipy",
        "pandas",
        "matplotlib",
        "PIL",
        "cv2",
        "torchvision",
        "libcst",
        "hypothesis",
        "pytest",
        "ruff",
        "black",
        "mypy",
        "sre",
        "nt",
    }
)


class Names:
    """Fresh, unique identifiers from one random stream."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def _word(self, syllables: int) -> str:
        r = self.rng
        return "".join(
            r.choice(_ONSETS) + r.choice(_VOWELS) for _ in range(syllables - 1)
        ) + (r.choice(_ONSETS) + r.choice(_VOWELS) + r.choice(_CODAS))

    def var(self, parts: int | None = None) -> str:
        """snake_case."""
        while True:
            n = parts or self.rng.choice([1, 1, 2])
            name = "_".join(self._word(self.rng.choice([1, 2, 2, 3])) for _ in range(n))
            if name not in RESERVED and name not in self.used and len(name) > 2:
                self.used.add(name)
                return name

    def cls(self) -> str:
        """CamelCase."""
        while True:
            name = "".join(
                self._word(self.rng.choice([1, 2])).capitalize()
                for _ in range(self.rng.choice([1, 2]))
            )
            if name not in RESERVED and name not in self.used and len(name) > 2:
                self.used.add(name)
                return name

    def const(self) -> str:
        return self.var().upper()

    def module(self) -> str:
        return self.var(1)

    def file(self, ext: str) -> str:
        return f"{self.var(1)}.{ext}"
