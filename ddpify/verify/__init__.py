"""ddpify verify: run a script as one process and under torchrun, and check the DDP run with figures."""

from ddpify.verify.cli import VerifyOutcome, run_verify, verify_command

__all__ = ["VerifyOutcome", "run_verify", "verify_command"]
