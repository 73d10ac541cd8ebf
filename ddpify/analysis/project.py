"""Project: which local modules an entry script imports. Top-level `import a.b`, `from a import b`
and relative imports are resolved against the entry's directory and the project root (the nearest
folder above it with .git, pyproject.toml, setup.py or setup.cfg), followed transitively; nothing
outside the root and nothing in a virtual environment or site-packages is followed. Imports inside
functions are not followed: they are listed (`lazy`) so that a refusal can name them.

Reads text with the standard library's ast (fast; no rewriting happens here).
"""

from __future__ import annotations

import ast
import os
import re
import stat
from dataclasses import dataclass, field

import libcst as cst

import ddpify.match as m
from ddpify.analysis.tree import _inside

ROOT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")
NOT_LOCAL = ("site-packages", "dist-packages", "__pypackages__", "node_modules")


@dataclass
class LocalImport:
    line: int  # first line of the top-level import statement (1-based)
    end: int  # its last line
    path: str  # the local file it reaches first (a package's __init__.py before its submodule)
    paths: list[str]  # every local file it imports, in import order
    modules: list[str] = field(
        default_factory=list
    )  # names it binds to a local module (`import utils`)
    module_files: list[str] = field(
        default_factory=list
    )  # the file each of those names is


@dataclass
class ModuleFile:
    path: str  # absolute, real path
    text: str
    tree: ast.Module
    imports: list[LocalImport] = field(default_factory=list)
    lazy: list[tuple[int, str]] = field(
        default_factory=list
    )  # (line, local file) imported inside a function
    main_guard: tuple[int, int] | None = None  # lines of `if __name__ == "__main__":`

    @property
    def deps(self) -> list[str]:
        return [p for imp in self.imports for p in imp.paths]


def project_root(entry: str) -> str:
    """The nearest folder above the entry with a project marker (else the entry's folder); a
    PYTHONPATH folder above the entry widens it (`PYTHONPATH=. python projects/x/train.py`)."""
    here = os.path.dirname(os.path.realpath(entry))
    marked = _marked_root(here)
    for p in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        real = os.path.realpath(p) if p else ""
        if (
            real
            and os.path.isdir(real)
            and os.path.commonpath([real, marked]) == real
            and real != os.sep
        ):
            marked = real
    return marked


def package_parent(here: str) -> str:
    """The folder above the outermost package holding `here` (where `python -m pkg.mod` runs,
    so `from pkg.sub import x` resolves there); `here` itself outside a package."""
    d = here
    while os.path.isfile(os.path.join(d, "__init__.py")) and os.path.dirname(d) != d:
        d = os.path.dirname(d)
    return d


def _within(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:
        return False


def _marked_root(here: str) -> str:
    d = here
    for _ in range(6):
        if any(os.path.exists(os.path.join(d, mark)) for mark in ROOT_MARKERS):
            return d
        up = os.path.dirname(d)
        if up == d:
            break
        d = up
    return here


def _is_local(path: str, root: str) -> bool:
    real = os.path.realpath(path)
    if os.path.commonpath([real, root]) != root:
        return False
    rel = os.path.relpath(real, root).split(os.sep)
    return not any(
        part in NOT_LOCAL or part.startswith(".") for part in rel[:-1]
    ) and not any(
        os.path.isfile(os.path.join(root, *rel[:i], "pyvenv.cfg"))
        for i in range(len(rel))
    )


def _module_file(base: str, parts: list[str]) -> list[str]:
    """Files `import parts` runs below base: each package's __init__.py, then the module."""
    out: list[str] = []
    d = base
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        pkg = os.path.join(d, part)
        if os.path.isdir(pkg) and os.path.isfile(os.path.join(pkg, "__init__.py")):
            out.append(os.path.join(pkg, "__init__.py"))
            d = pkg
            continue
        if not last and os.path.isdir(
            pkg
        ):  # a folder without __init__.py: a namespace package
            d = pkg
            continue
        if last and os.path.isfile(pkg + ".py"):
            out.append(pkg + ".py")
            return out
        return []
    return out


def _resolve(node: ast.stmt, here: str, bases: list[str], root: str) -> list[str]:
    """Local files an import statement runs, or [] when it reaches none."""
    found: list[str] = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            for base in bases:
                files = _module_file(base, alias.name.split("."))
                if files:
                    found += files
                    break
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            pkg = os.path.dirname(here)
            for _ in range(node.level - 1):
                pkg = os.path.dirname(pkg)
            starts = [(pkg, (node.module or "").split(".") if node.module else [])]
        else:
            starts = [(base, (node.module or "").split(".")) for base in bases]
        for base, parts in starts:
            files = _module_file(base, parts) if parts else []
            if parts and not files:
                continue
            target = os.path.join(base, *parts)
            for alias in node.names:  # `from pkg import mod`: the submodule too
                sub = (
                    _module_file(target, [alias.name]) if os.path.isdir(target) else []
                )
                files += [f for f in sub if f not in files]
            if files:
                found += files
                break
    return [os.path.realpath(f) for f in found if _is_local(f, root)]


def _module_names(node: ast.stmt, files: list[str]) -> list[str]:
    """Names an import binds to a local module: `import utils`, `import pkg.mod` (pkg),
    `from pkg import mod`; not the classes and functions `from mod import f` binds."""
    return [name for name, _ in _module_bindings(node, files)]


def _module_bindings(node: ast.stmt, files: list[str]) -> list[tuple[str, str]]:
    """(name, local file it is) for each name an import binds to a local module: `import pkg.mod
    as m` binds m to pkg/mod.py, `import pkg.mod` binds pkg to pkg/__init__.py."""

    def named(end: str, last: bool) -> str:
        found = [
            f
            for f in files
            if (
                os.path.basename(os.path.dirname(f))
                if f.endswith("__init__.py")
                else os.path.basename(f)[:-3]
            )
            == end
        ]
        return (found[-1] if last else found[0]) if found else ""

    if isinstance(node, ast.Import):
        return [
            (a.asname, named(a.name.rsplit(".", 1)[-1], True))
            if a.asname
            else (a.name.split(".")[0], named(a.name.split(".")[0], False))
            for a in node.names
        ]
    ends = {
        os.path.basename(f)[:-3]
        if not f.endswith("__init__.py")
        else os.path.basename(os.path.dirname(f))
        for f in files
    }
    return [
        (a.asname or a.name, named(a.name, True))
        for a in node.names
        if a.name in ends
        and isinstance(node, ast.ImportFrom)
        and a.name != (node.module or "").rsplit(".", 1)[-1]
    ]


def _main_guard(tree: ast.Module) -> tuple[int, int] | None:
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            text = ast.unparse(node.test)
            if "__name__" in text and "__main__" in text:
                return node.lineno, node.end_lineno or node.lineno
    return None


def path_inserts(tree: ast.Module, path: str) -> list[str]:
    """Folders a module puts on sys.path at top level (`sys.path.insert(0, "lib")`,
    `sys.path.append(os.path.join(os.path.dirname(__file__), "utils"))`), where the value can be
    read from the source: later imports resolve there too. A relative folder is taken from the
    module's own folder (where scripts are run from)."""
    out: list[str] = []
    here = os.path.dirname(os.path.realpath(path))
    for node in tree.body:
        call = (
            node.value
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            else None
        )
        if (
            call is None
            or not isinstance(call.func, ast.Attribute)
            or call.func.attr not in ("insert", "append")
        ):
            continue
        if ast.unparse(call.func.value) != "sys.path" or not call.args:
            continue
        value = _path_value(call.args[-1], path)
        if value is not None:
            out.append(os.path.realpath(os.path.join(here, value)))
    return out


def _path_value(node: ast.expr, path: str) -> str | None:
    """The string a path expression of the source evaluates to, for the forms scripts use."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id == "__file__":
        return os.path.realpath(path)
    if isinstance(node, ast.Call):
        name = ast.unparse(node.func)
        args = [_path_value(a, path) for a in node.args]
        if any(a is None for a in args):
            return None
        if name in ("os.path.dirname", "dirname") and len(args) == 1:
            return os.path.dirname(args[0])
        if (
            name
            in (
                "os.path.abspath",
                "os.path.realpath",
                "abspath",
                "realpath",
                "str",
                "Path",
                "pathlib.Path",
                "os.fspath",
            )
            and len(args) == 1
        ):
            return args[0]
        if name in ("os.path.join", "join") and args:
            return os.path.join(*args)
        if (
            isinstance(node.func, ast.Attribute)
            and node.func.attr in ("resolve", "absolute")
            and not node.args
        ):
            return _path_value(node.func.value, path)
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        inner = _path_value(node.value, path)
        return os.path.dirname(inner) if inner is not None else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        left, right = _path_value(node.left, path), _path_value(node.right, path)
        return (
            os.path.join(left, right)
            if left is not None and right is not None
            else None
        )
    return None


def read_module(path: str, text: str, root: str, bases: list[str]) -> ModuleFile:
    tree = ast.parse(text, path)
    mod = ModuleFile(os.path.realpath(path), text, tree, main_guard=_main_guard(tree))
    for extra in path_inserts(tree, path):
        if (
            extra not in bases
            and os.path.isdir(extra)
            and _is_local(os.path.join(extra, "x.py"), root)
        ):
            bases.append(extra)
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            files = [f for f in _resolve(node, mod.path, bases, root) if f != mod.path]
            if files:
                bound = _module_bindings(node, files)
                mod.imports.append(
                    LocalImport(
                        node.lineno,
                        node.end_lineno or node.lineno,
                        files[0],
                        files,
                        [n for n, _ in bound],
                        [f for _, f in bound],
                    )
                )
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
            files = _resolve(node, mod.path, bases, root)
            if files:
                mod.lazy.append((node.lineno, files[-1]))
    return mod


def local_modules(entry: str, read=None) -> tuple[str, list[ModuleFile]]:
    """(root, files): the entry first, then every local module it reaches through top-level imports,
    each once, dependencies before the modules importing them."""
    here = os.path.dirname(os.path.realpath(entry))
    top = package_parent(here)
    root = project_root(entry)
    if _within(root, top) and root != top:  # the package starts above the marked root
        root = top
    bases = list(dict.fromkeys([here, root, top]))
    if read is None:

        def read(p: str) -> str:
            if not stat.S_ISREG(os.stat(p).st_mode):  # a FIFO would block the open
                raise OSError(f"{p}: not a regular file")
            with open(p, encoding="utf-8") as f:
                return f.read()

    seen: dict[str, ModuleFile] = {}
    order: list[str] = []

    def visit(path: str) -> None:
        if path in seen:
            return
        seen[path] = read_module(path, read(path), root, bases)
        for dep in seen[path].deps:
            visit(dep)
        order.append(path)

    first = os.path.realpath(entry)
    visit(first)
    return root, [seen[first]] + [seen[p] for p in order if p != first]


class ProjectMixin:
    """Which file of a merged project (ddpify/project.py) a node comes from: the modules sit
    between marker functions `__ddpify_begin_K__` / `__ddpify_end_K__`; the entry is file 0, and a
    single file is all file 0. A module-level name of one file is not visible in another."""

    def region_of(self, node) -> int:
        regions = self.__dict__.get("_regions")
        if regions is None:
            regions, current = {}, 0
            for stmt in self.module.body:
                name = getattr(getattr(stmt, "name", None), "value", "")
                if name.startswith("__ddpify_begin_"):
                    current = int(name[len("__ddpify_begin_") : -2])
                elif name.startswith("__ddpify_end_"):
                    current = 0
                regions[id(stmt)] = current
            self._regions = regions
            self._several = len(set(regions.values())) > 1
        if not self._several:
            return 0
        cur = node
        while cur is not None and id(cur) not in regions:
            cur = self.parent.get(cur)
        return regions.get(id(cur), 0) if cur is not None else 0

    def several_files(self) -> bool:
        self.region_of(self.module)
        return self._several

    def global_visible(self, name: str, where, origin=None) -> bool:
        """A plain module-level name is visible at `where` when the file there binds it; another
        name (a local of `origin`, a function) only within origin's own file."""
        if "." in name or not self.several_files():
            return True
        index = self.__dict__.get("_global_regions")
        if index is None:
            index = {}
            for s in self.module.body:
                for n in binds(s):
                    index.setdefault(n, set()).add(self.region_of(s))
            self._global_regions = index
        if name in index:
            return self.region_of(where) in index[name]
        return origin is not None and self.region_of(origin) == self.region_of(where)

    def unused_in_project(self, node) -> bool:
        """node is in a plain function of an imported module that nothing in the project calls
        (`utils.load_celebA` of a data set this program never loads), or in a class of one that
        nothing names (a training script's Trainer, when the entry only imports its model class):
        not this program's code."""
        fn = self.function_of(node)
        while fn is not None and self.function_of(fn) is not None:
            fn = self.function_of(fn)  # a closure runs when its function does
        if fn is None or self.region_of(fn) == 0:
            return False
        cls = self.class_of(fn)
        if cls is not None:
            while self.class_of(cls) is not None:
                cls = self.class_of(cls)
            if self._builds_by_name():
                return False  # getattr(module, config["type"])(...) may build any class
            name = cls.name.value
            return not any(
                n.value == name and n is not cls.name and not _inside(self, n, cls)
                for n in self.findall(self.module, m.Name(name))
            )
        name = fn.name.value
        return not self.callers(fn) and not any(
            n.value == name
            and n is not fn.name
            and not isinstance(self.parent.get(n), cst.Attribute)
            for n in self.findall(self.module, m.Name(name))
        )

    def _builds_by_name(self) -> bool:
        """The program picks classes by a name it computes: getattr(x, name) with a name that is
        not a literal, eval(...), globals()[...]."""
        found = self.__dict__.get("_by_name")
        if found is None:
            found = any(
                (
                    m.matches(c.func, m.Name("getattr"))
                    and len(c.args) > 1
                    and not isinstance(c.args[1].value, cst.SimpleString)
                )
                or m.matches(
                    c.func,
                    m.Name("eval")
                    | m.Name("globals")
                    | m.Name("locals")
                    | m.Name("vars"),
                )
                for c in self.calls
            )
            self._by_name = found
        return found

    def module_region(self, node) -> int | None:
        """The file (region) of the project a name bound to a local module names (`import
        data_loader.data_loaders as module_data`: module_data), where known; else None."""
        for q in self.qualified(node):
            mt = re.match(r"__ddpify_import_\d+_(\d+)__$", q)
            if mt:
                return int(mt.group(1))
        return None

    def _local_module(self, name: str) -> bool:
        """`utils.f`: utils names a local module of the project (its import's placeholder)."""
        head = name.split(".", 1)[0]
        return any(
            b.startswith("__ddpify_import_")
            for b in self.bindings.get(None, {}).get(head, [])
        )


def binds(stmt, inside: bool = False) -> set[str]:
    """Names a statement binds at its level (inside=True: also in the function it defines)."""
    out: set[str] = set()
    stack = [stmt]
    while stack:
        n = stack.pop()
        if isinstance(n, (cst.FunctionDef, cst.ClassDef)):
            out.add(n.name.value)
            if stmt is not n or not inside:
                continue
        if isinstance(n, cst.Param):
            out.add(n.name.value)
        if isinstance(n, cst.AssignTarget) or isinstance(n, (cst.AnnAssign, cst.For)):
            t = n.target
            out |= {
                x.value
                for x in (
                    [t]
                    if isinstance(t, cst.Name)
                    else [e.value for e in getattr(t, "elements", [])]
                )
                if isinstance(x, cst.Name)
            }
        if isinstance(n, cst.ImportAlias):
            nm = n.asname.name if n.asname else n.name
            while isinstance(nm, cst.Attribute):
                nm = nm.value
            if isinstance(nm, cst.Name):
                out.add(nm.value)
        stack.extend(n.children)
    return out
