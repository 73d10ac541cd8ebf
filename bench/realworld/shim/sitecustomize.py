"""Import shims for the real-world corpus harness only (never part of ddpify).

- RW_TV_NO_OPS=1 (CPU torch with torchvision's Python parts): torchvision's C ops are absent, so
  its fake/autograd registrations for them are replaced by empty modules; ops then raise on use.
- torchvision.datasets.utils.check_integrity ignores md5 sums, so the fake data sets that
  bench/realworld/fakedata.py writes count as present and nothing is downloaded.
- torch.utils.tensorboard gets a no-op SummaryWriter when the tensorboard package is missing.
- RW_FALLBACK_SITE: a folder appended to sys.path (after site-packages).
- `apex`: when NVIDIA apex is not installed (the CPU machine), shim/apex_standin/ stands in for it
  (amp.initialize returns its inputs, scale_loss yields the loss, FusedAdam is torch's AdamW,
  convert_syncbn_model is the identity), so that single-GPU apex scripts and their conversions run
  on the CPU. It is found last: a real apex (the GPU machine's) always wins.
- torchvision 0.15 removed make_grid/save_image's `range=` (renamed value_range in 0.10), which
  older scripts (pytorch-vqvae) still pass: accepted again as value_range.
- numpy 2 removed APIs that older corpus code still calls: `np.fromstring` on bytes (binary mode,
  now frombuffer), `np.bool8` (gym 0.25's env checker), `np.Inf` and `np.product`; all are given back.
- torch 2.x removed the `verbose` argument of the learning-rate schedulers, which older scripts
  still pass (`LambdaLR(..., verbose=True)`): accepted again and ignored.
- RW_WRITE_LOG: the per-process write log of shim/rw_recorder.py (the harness's own judgement of
  "only rank 0 writes" and of the files torch.save wrote).
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

_EMPTY = set()
if os.environ.get("RW_TV_NO_OPS"):
    _EMPTY = {"torchvision._meta_registrations", "torchvision._autograd_registrations"}


class _Empty(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        pass


class _Patched(importlib.abc.Loader):
    def __init__(self, inner, patch):
        self.inner, self.patch = inner, patch

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        self.patch(module)


def _no_md5(mod):
    def check_integrity(fpath, md5=None):
        return os.path.isfile(fpath)

    mod.check_integrity = check_integrity


def _old_imsave(mod):
    """scipy.misc.imsave, removed in SciPy 1.2 and still called by older GAN scripts: the old
    behaviour (float images scaled to 0-255) through imageio."""
    if hasattr(mod, "imsave"):
        return

    def imsave(path, arr):
        import imageio
        import numpy as np

        a = np.asarray(arr)
        if a.dtype != np.uint8:
            lo, hi = float(a.min()), float(a.max())
            a = ((a - lo) / ((hi - lo) or 1.0) * 255).round().astype(np.uint8)
        imageio.imwrite(path, a)

    mod.imsave = imsave


def _old_tsne(mod):
    """sklearn 1.7 renamed TSNE's n_iter to max_iter (and 1.8 removed it): older scripts still pass it."""
    import inspect

    cls = mod.TSNE
    if "n_iter" in inspect.signature(cls.__init__).parameters:
        return

    class TSNE(cls):
        def __init__(self, *args, n_iter=None, **kwargs):
            if n_iter is not None:
                kwargs.setdefault("max_iter", n_iter)
            super().__init__(*args, **kwargs)

        @classmethod
        def _get_param_names(cls_):
            return cls._get_param_names()

    TSNE.__name__ = TSNE.__qualname__ = "TSNE"
    mod.TSNE = TSNE


def _old_numpy(mod):
    if not hasattr(mod, "bool8"):
        mod.bool8 = mod.bool_
    if not hasattr(mod, "Inf"):  # held-back split: EarlyStopping's np.Inf, encoders' np.product
        mod.Inf = mod.inf
    if not hasattr(mod, "product"):
        mod.product = mod.prod
    if not hasattr(mod, "int"):  # held-back split 4: np.int in an N-shot episode loader (NumPy < 1.24)
        mod.int = int
    orig = mod.fromstring

    def fromstring(string, dtype=float, count=-1, *, sep="", like=None):
        if sep == "" and isinstance(string, (bytes, bytearray, memoryview)):
            return mod.frombuffer(string, dtype=dtype, count=count).copy()
        return orig(string, dtype=dtype, count=count, sep=sep)

    mod.fromstring = fromstring


def _old_tv_utils(mod):
    import functools
    import inspect

    for name in ("make_grid", "save_image"):
        fn = getattr(mod, name, None)
        if fn is None or "range" in inspect.signature(fn).parameters:
            continue

        def wrap(fn):
            @functools.wraps(fn)
            def inner(*args, range=None, **kwargs):
                if range is not None:
                    kwargs.setdefault("value_range", range)
                return fn(*args, **kwargs)

            return inner

        setattr(mod, name, wrap(fn))


def _old_lr_verbose(mod):
    import functools
    import inspect

    bases = tuple(c for c in (getattr(mod, "LRScheduler", None), getattr(mod, "ReduceLROnPlateau", None)) if c)
    for cls in list(vars(mod).values()):
        if not (isinstance(cls, type) and issubclass(cls, bases)) or "__init__" not in vars(cls):
            continue
        init = cls.__init__
        params = inspect.signature(init).parameters
        if "verbose" in params or any(p.kind == p.VAR_KEYWORD for p in params.values()):
            continue
        npos = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params.values())

        def wrap(init, npos):
            @functools.wraps(init)
            def inner(self, *args, **kwargs):
                kwargs.pop("verbose", None)
                # a subclass written for torch 1.x passes verbose positionally, last (npos counts self)
                if len(args) >= npos and isinstance(args[-1], (bool, str)):
                    args = args[:-1]
                return init(self, *args, **kwargs)

            return inner

        cls.__init__ = wrap(init, npos)


class _NullWriter:
    def __init__(self, *a, **k):
        pass

    def __getattr__(self, name):
        return lambda *a, **k: None


def _tensorboard_stub(name):
    mod = types.ModuleType(name)
    mod.SummaryWriter = _NullWriter
    return mod


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in _EMPTY:
            return importlib.machinery.ModuleSpec(name, _Empty())
        if name == "torchvision.datasets.utils":
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None:
                spec.loader = _Patched(spec.loader, _no_md5)
            return spec
        if name == "scipy.misc":
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None:
                spec.loader = _Patched(spec.loader, _old_imsave)
            return spec
        if name == "sklearn.manifold":
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None:
                spec.loader = _Patched(spec.loader, _old_tsne)
            return spec
        if name == "torchvision.utils":
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None:
                spec.loader = _Patched(spec.loader, _old_tv_utils)
            return spec
        if name == "torch.optim.lr_scheduler":
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None:
                spec.loader = _Patched(spec.loader, _old_lr_verbose)
            return spec
        if name == "numpy":
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None:
                spec.loader = _Patched(spec.loader, _old_numpy)
            return spec
        if name == "torch.utils.tensorboard" and importlib.util.find_spec("tensorboard") is None:
            return importlib.util.spec_from_loader(name, _StubLoader(_tensorboard_stub))
        return None


class _StubLoader(importlib.abc.Loader):
    def __init__(self, make):
        self.make = make

    def create_module(self, spec):
        return self.make(spec.name)

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())

_APEX_STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "apex_standin")


class _ApexStandin(importlib.abc.MetaPathFinder):
    """Last on sys.meta_path: reached only when no installed apex was found."""

    def find_spec(self, name, path, target=None):
        if name == "apex" or name.startswith("apex."):
            return importlib.machinery.PathFinder.find_spec(name, path or [_APEX_STANDIN])
        return None


sys.meta_path.append(_ApexStandin())

if os.environ.get("RW_WRITE_LOG"):
    import rw_recorder

    rw_recorder.install()

# Pure-Python packages carried for an offline machine: after site-packages, so installed ones win.
if os.environ.get("RW_FALLBACK_SITE"):
    sys.path.append(os.environ["RW_FALLBACK_SITE"])
