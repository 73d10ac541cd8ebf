"""No-op stand-in for the unmaintained tensorboard_logger package (harness only)."""


def configure(*a, **k):
    pass


def log_value(*a, **k):
    pass
