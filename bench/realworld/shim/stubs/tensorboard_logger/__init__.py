"""No-op stand-in for the unmaintained tensorboard_logger package (harness only)."""


def configure(*a, **k):
    pass


def log_value(*a, **k):
    pass


class Logger:
    """tensorboard_logger.Logger(logdir=..., flush_secs=...): the object API, also a no-op."""

    def __init__(self, *a, **k):
        pass

    def log_value(self, *a, **k):
        pass
