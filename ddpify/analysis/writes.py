"""Side effects on the file system: which calls write a file (and which path), which read one,
which prepare data (download, extract). One table of writers serves every concern: rank0.py
guards the writes, checkpoints.py puts a barrier before what reads them back.

A call writes to the file system when it is
- `open(path, mode)` with a mode that writes ("w", "a", "x", "+"), or `Path.open("w")`;
- a known writer in WRITERS (by qualified name) or WRITE_METHODS (by method name, where the
  method name alone is not enough: with an argument that looks like a path);
- a writer the user declares in pyproject.toml: `[tool.ddpify] writers = ["mylib.dump_results"]`.
"""

from __future__ import annotations

import re

import libcst as cst
import ddpify.match as m

from ddpify.analysis.tree import call_args, code, dotted, text_of

WRITE_MODE = re.compile(r"[wax+]")
# a file mode that writes, as libraries spell it: "w", "wb", "a", "r+", "w+", "w-", "x", "w:gz"
OPENER_MODE = re.compile(r"(?:[wax][bt]?\+?|r\+[bt]?|r[bt]\+|w-)(?::\w*)?")
MEMORY_BUFFERS = ("io.BytesIO", "io.StringIO")

# qualified name -> (positional index, keyword) of the path it writes; None: no single path
WRITERS: dict[str, tuple[int, str] | None] = {
    "torch.save": (1, "f"),
    "numpy.save": (0, "file"),
    "numpy.savez": (0, "file"),
    "numpy.savez_compressed": (0, "file"),
    "numpy.savetxt": (0, "fname"),
    "torchvision.utils.save_image": (1, "fp"),
    # into a file object: open() names the path
    "json.dump": None,
    "pickle.dump": None,
    "yaml.dump": None,
    "yaml.safe_dump": None,
    "torch.jit.save": (1, "f"),
    "matplotlib.pyplot.savefig": (0, "fname"),
    "shutil.copy": (1, "dst"),
    "shutil.copyfile": (1, "dst"),
    "shutil.copy2": (1, "dst"),
    "shutil.copytree": (1, "dst"),
    "shutil.move": (1, "dst"),
    "shutil.rmtree": (0, "path"),
    "shutil.unpack_archive": (1, "extract_dir"),
    "shutil.make_archive": (0, "base_name"),
    "os.remove": (0, "path"),
    "os.unlink": (0, "path"),
    "os.rename": (1, "dst"),
    "os.replace": (1, "dst"),
    "os.rmdir": (0, "path"),
    "cv2.imwrite": (0, "filename"),
    "imageio.imwrite": (0, "uri"),
    "imageio.v2.imwrite": (0, "uri"),
    "imageio.v3.imwrite": (0, "uri"),
    "skimage.io.imsave": (0, "fname"),
    "scipy.io.savemat": (0, "file_name"),
    "joblib.dump": (1, "filename"),
    "urllib.request.urlretrieve": (1, "filename"),
    "torchvision.datasets.utils.download_url": (1, "root"),
    "torchvision.datasets.utils.download_and_extract_archive": (1, "download_root"),
    "torchvision.datasets.utils.extract_archive": (1, "to_path"),
    "torch.hub.download_url_to_file": (1, "dst"),
}
# method name -> (positional index, keyword) of the path; "self": the receiver is the path
WRITE_METHODS: dict[str, tuple[int, str] | str] = {
    "to_csv": (0, "path_or_buf"),
    "to_json": (0, "path_or_buf"),
    "to_parquet": (0, "path"),
    "to_pickle": (0, "path"),
    "to_feather": (0, "path"),
    "to_excel": (0, "excel_writer"),
    "to_hdf": (0, "path_or_buf"),
    "savefig": (0, "fname"),
    "write_text": "self",
    "write_bytes": "self",
    "extractall": (0, "path"),
    "save_pretrained": (0, "save_directory"),
    "imwrite": (0, "filename"),
}
# method names too common to count without an argument that looks like a path: img.save("x.png")
PATH_METHODS: dict[str, tuple[int, str]] = {
    "save": (0, "fp"),
    "extract": (1, "path"),
    "save_image": (1, "fp"),
    "dump": (1, "fp"),
}
# keywords that hand a method its path, whatever the library calls its first argument
PATH_KEYWORDS = ("filename", "fname", "path", "file", "fp", "f", "uri")
# every rank builds these; rank 0 alone should write (their file argument becomes os.devnull elsewhere)
FILE_HANDLERS = {
    "logging.FileHandler": (0, "filename"),
    "logging.handlers.RotatingFileHandler": (0, "filename"),
    "logging.handlers.TimedRotatingFileHandler": (0, "filename"),
    "logging.basicConfig": (99, "filename"),
}

# archives and compressed files opened for writing: (path, mode) arguments; the path becomes
# os.devnull on other ranks (the code around them runs unchanged)
FILE_OPENERS = {
    "tarfile.open": ((0, "name"), (1, "mode")),
    "zipfile.ZipFile": ((0, "file"), (1, "mode")),
    "gzip.open": ((0, "filename"), (1, "mode")),
    "bz2.open": ((0, "filename"), (1, "mode")),
    "lzma.open": ((0, "filename"), (1, "mode")),
}

READERS: dict[str, tuple[int, str]] = {
    "torch.load": (0, "f"),
    "numpy.load": (0, "file"),
    "numpy.loadtxt": (0, "fname"),
    "numpy.genfromtxt": (0, "fname"),
    "pandas.read_csv": (0, "filepath_or_buffer"),
    "pandas.read_json": (0, "path_or_buf"),
    "pandas.read_parquet": (0, "path"),
    "pandas.read_pickle": (0, "filepath_or_buffer"),
    "os.listdir": (0, "path"),
    "glob.glob": (0, "pathname"),
    "tarfile.open": (0, "name"),
    "zipfile.ZipFile": (0, "file"),
    "PIL.Image.open": (0, "fp"),
    "cv2.imread": (0, "filename"),
}
READ_METHODS = {"read_text", "read_bytes", "iterdir", "glob", "rglob"}
# functions that fetch data from the network (and write it)
DOWNLOADERS = tuple(q for q in WRITERS if "download" in q or "urlretrieve" in q) + (
    "requests.get",
    "urllib.request.urlopen",
    "gdown.download",
    "huggingface_hub.hf_hub_download",
    "huggingface_hub.snapshot_download",
    "wget.download",
)
EXTRACTORS = (
    "shutil.unpack_archive",
    "torchvision.datasets.utils.extract_archive",
    "torchvision.datasets.utils.download_and_extract_archive",
)
EXISTS = re.compile(r"\b(exists|isfile|isdir|is_file|is_dir|listdir|glob)\b")
PATHISH = re.compile(
    r"(path|file|dir|root|out|ckpt|checkpoint|folder|dest|dst|name)", re.I
)
PATH_LITERAL = re.compile(r"[/\\]|\.\w{1,5}$")


def _arg(call: cst.Call, where: tuple[int, str]) -> cst.BaseExpression | None:
    pos, kw = call_args(call)
    i, name = where
    if name in kw:
        return kw[name].value
    return pos[i].value if len(pos) > i else None


def looks_like_path(node: cst.BaseExpression | None) -> bool:
    """A string with a directory or an extension, an f-string, os.path.join(...), Path(...), p / "x",
    or a name that says so (ckpt_path, args.out_dir)."""
    if node is None:
        return False
    if isinstance(node, cst.SimpleString):
        return bool(PATH_LITERAL.search(text_of(node) or ""))
    if isinstance(node, (cst.FormattedString, cst.ConcatenatedString)):
        return True
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
        return True
    if isinstance(node, cst.Call):
        name = dotted(node.func) or (
            node.func.attr.value if isinstance(node.func, cst.Attribute) else ""
        )
        return name.endswith(
            ("path.join", "Path", "joinpath", "with_suffix", "with_name", "format")
        )
    name = dotted(node)
    return bool(name) and bool(PATHISH.search(name.rsplit(".", 1)[-1]))


def _open_mode(call: cst.Call) -> str | None:
    """The mode of open(path, mode) / path.open(mode); "r" where none is given; None when it is
    not a literal, or the call is not an open."""
    pos, kw = call_args(call)
    if m.matches(call.func, m.Name("open")) or (
        isinstance(call.func, cst.Attribute)
        and dotted(call.func) in ("io.open", "codecs.open")
    ):
        mode = (
            pos[1].value
            if len(pos) > 1
            else (kw["mode"].value if "mode" in kw else None)
        )
    elif (
        isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "open"
        and looks_like_path(call.func.value)
    ):
        mode = pos[0].value if pos else (kw["mode"].value if "mode" in kw else None)
    else:
        return None
    if mode is None:
        return "r"
    return text_of(mode)


class Effects:
    """File-system effects of one module's calls, by the one table above plus the user's writers."""

    def __init__(self, a, user_writers: tuple[str, ...] = ()) -> None:
        self.a = a
        self.user = {w for w in user_writers}
        self._writing_functions: set[str] | None = None

    def open_mode(self, call: cst.Call) -> str | None:
        """The mode of open(path, mode) / path.open(mode) ("r" where none is given); None for
        other calls, a mode that is not a literal, and a module's open (tarfile.open, gzip.open)."""
        func = call.func
        if isinstance(func, cst.Attribute) and not m.matches(
            func.value, m.Name("io") | m.Name("codecs")
        ):
            head = (dotted(func.value) or "").split(".")[0]
            if any(
                w != "<value>"
                for names in self.a.bindings.values()
                for w in names.get(head, ())
            ):
                return (
                    None  # an imported module (or a name imported from one), not a Path
                )
        return _open_mode(call)

    def _user_writer(self, call: cst.Call) -> bool:
        if not self.user:
            return False
        name = dotted(call.func)
        return (
            bool(self.a.qualified(call.func) & self.user)
            or name in self.user
            or (
                name is not None
                and any(
                    u.rsplit(".", 1)[-1] == name.rsplit(".", 1)[-1] and "." in name
                    for u in self.user
                )
            )
        )

    def writer(self, call: cst.Call) -> str | None:
        """What the call is, when it writes to the file system (None otherwise). open() is
        apart (open_mode): the file object, not the call, is what later writes."""
        a = self.a
        func = call.func
        for q in a.qualified(func):
            if q in WRITERS:
                if self.to_memory(call, WRITERS[q]):
                    return None  # torch.save(obj, io.BytesIO()): every rank needs its own bytes
                return dotted(func) or q
        if self._user_writer(call):
            return dotted(func) or "writer"
        if isinstance(func, cst.Attribute):
            meth = func.attr.value
            where = WRITE_METHODS.get(meth)
            if where is not None:
                if where == "self" and not self._receiver_is_path(func.value):
                    return None
                if (
                    where != "self"
                    and meth != "extractall"
                    and _arg(call, where) is None
                ):  # type: ignore[arg-type]
                    return (
                        None  # df.to_csv() / to_json() without a path return a string
                    )
                return dotted(func) or meth
            where = PATH_METHODS.get(meth)
            if (
                where is not None
                and (
                    looks_like_path(_arg(call, where))
                    or any(  # anim.save(filename="run.gif"): the path by another keyword
                        x.keyword is not None
                        and x.keyword.value in PATH_KEYWORDS
                        and looks_like_path(x.value)
                        for x in call.args
                    )
                )
                and not any(
                    q.split(".")[0] in ("json", "pickle", "yaml", "torch")
                    for q in a.qualified(func)
                )
            ):
                return dotted(func) or meth
        return None

    def _receiver_is_path(self, node: cst.BaseExpression) -> bool:
        return looks_like_path(node) or isinstance(node, cst.Call)

    def to_memory(self, call: cst.Call, where: tuple[int, str] | None) -> bool:
        """The file argument is an in-memory buffer (io.BytesIO / io.StringIO), not a file."""
        a = self.a
        target = _arg(call, where) if where else None
        values = [target] if target is not None else []
        if isinstance(target, cst.Name):
            values = a._local_values(a.function_of(call), target.value)
        return bool(values) and all(
            isinstance(v, cst.Call) and a.is_call(v, *MEMORY_BUFFERS) for v in values
        )

    def file_handler(self, call: cst.Call) -> cst.BaseExpression | None:
        """logging.FileHandler(path) / basicConfig(filename=path) / tarfile.open(path, "w:gz"):
        the path argument of a file every rank would create."""
        for q in self.a.qualified(call.func):
            if q in FILE_HANDLERS:
                return _arg(call, FILE_HANDLERS[q])
            if q in FILE_OPENERS:
                path, mode = FILE_OPENERS[q]
                value = _arg(call, mode)
                if WRITE_MODE.search(text_of(value) or ""):
                    return _arg(call, path)
        return None

    def other_opener(self, call: cst.Call) -> bool:
        """Any other call given a path and a file mode that writes (h5py.File(p, "w"),
        np.memmap(p, mode="w+"), netCDF4.Dataset(p, "a")): it creates or changes a file on every
        rank, and whether os.devnull would do in its place is not known."""
        if (
            self.open_mode(call) is not None
            or self.writer(call) is not None
            or self.file_handler(call) is not None
        ):
            return False
        if not call.args or call.args[0].keyword is not None:
            return False
        name = dotted(call.func).rsplit(".", 1)[-1] if dotted(call.func) else ""
        if not any(
            arg.keyword is not None and arg.keyword.value == "mode" for arg in call.args
        ) and not looks_like_path(call.args[0].value):
            return False  # a `mode=` keyword says "file" by itself; a positional string needs a path-like first argument
        # a positional mode only for what opens files: a class (File, Dataset) or an *open function;
        # elsewhere a second string is data (z.writestr("a.txt", "x"))
        where = (
            (1, "mode") if name[:1].isupper() or name.endswith("open") else (99, "mode")
        )
        mode = _arg(call, where)
        return bool(OPENER_MODE.fullmatch(text_of(mode) or ""))

    def written_path(self, call: cst.Call) -> str | None:
        """The path (as code) a writing call writes, where the table knows it."""
        a = self.a
        mode = self.open_mode(call)
        if mode is not None:
            if not WRITE_MODE.search(mode):
                return None
            target = (
                call.args[0].value
                if m.matches(call.func, m.Name("open")) and call.args
                else getattr(call.func, "value", None)
            )
            return code(target) if target is not None else None
        for q in a.qualified(call.func):
            if q in WRITERS and WRITERS[q] is not None:
                node = _arg(call, WRITERS[q])
                return code(node) if node is not None else None
            if q in FILE_OPENERS and self.file_handler(call) is not None:
                return code(self.file_handler(call))
        if isinstance(call.func, cst.Attribute):
            where = WRITE_METHODS.get(call.func.attr.value)
            if where == "self":
                return code(call.func.value)
            if where is not None:
                node = _arg(call, where)  # type: ignore[arg-type]
                return code(node) if node is not None else None
        if self._user_writer(call):
            node = next((x.value for x in call.args if looks_like_path(x.value)), None)
            return code(node) if node is not None else None
        return None

    def read_path(self, call: cst.Call) -> str | None:
        """The path (as code) a reading call reads, where the table knows it."""
        a = self.a
        mode = self.open_mode(call)
        if mode is not None:
            if WRITE_MODE.search(mode):
                return None
            target = (
                call.args[0].value
                if m.matches(call.func, m.Name("open")) and call.args
                else getattr(call.func, "value", None)
            )
            return code(target) if target is not None else None
        for q in a.qualified(call.func):
            if q in READERS:
                node = _arg(call, READERS[q])
                return code(node) if node is not None else None
        if (
            isinstance(call.func, cst.Attribute)
            and call.func.attr.value in READ_METHODS
        ):
            return code(call.func.value)
        return None

    def downloads(self, call: cst.Call) -> bool:
        return self.a.is_call(call, *DOWNLOADERS)

    def extracts(self, call: cst.Call) -> bool:
        """tar.extractall(root), zipfile's extractall, shutil.unpack_archive, extract_archive."""
        return (
            isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "extractall"
        ) or self.a.is_call(call, *EXTRACTORS)

    def _writes(self, c: cst.Call) -> bool:
        if self.downloads(c) or self.writer(c) is not None or self.other_opener(c):
            return True
        mode = self.open_mode(c)
        return mode is not None and bool(WRITE_MODE.search(mode))

    def writing_functions(self) -> set[str]:
        """Names of the functions of this file that download, extract or write files, themselves
        or through the functions they call."""
        if self._writing_functions is None:
            self._writing_functions = self.a._functions_matching(self._writes)
        return self._writing_functions

    def prepares(self, node: cst.CSTNode) -> bool:
        """node downloads, extracts or writes files (data preparation), per the tables, itself
        or through a function of this file it calls."""
        writing = self.writing_functions()
        return any(
            self._writes(c) or self.a._calls_function_in(c, writing)
            for c in self.a.findall(node, m.Call())
        )


def same_file(written: str, read: str) -> bool:
    """The read reads what was written: the same path, or a path under the written one
    (extractall(root) ... open(os.path.join(root, "labels.csv")))."""
    if written == read:
        return True
    return (
        len(written) > 2
        and re.search(r"(?<![\w.])" + re.escape(written) + r"(?![\w(])", read)
        is not None
    )


def checks_existence(test: cst.BaseExpression) -> bool:
    """`if not os.path.exists(p):` and the like: each rank may see its own answer."""
    return bool(EXISTS.search(code(test)))
