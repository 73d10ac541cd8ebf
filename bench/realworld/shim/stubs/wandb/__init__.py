"""No-op stand-in for wandb in the real-world corpus harness (no network, no account)."""


class _Any:
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return _Any()

    def __getattr__(self, name):
        return _Any()

    def __getitem__(self, key):
        return _Any()

    def __setitem__(self, key, value):
        pass


config = _Any()
run = None


def init(*a, **k):
    return _Any()


def log(*a, **k):
    pass


def finish(*a, **k):
    pass


def watch(*a, **k):
    pass


Image = Histogram = Table = _Any
