"""What a conversion gives back: a Result, or a ConversionError. Apart from the pipeline so that
every path (the pipeline's concerns, legacy modernisation) can build one without importing it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ddpify.findings import Finding


class ConversionError(Exception):
    """The source could not be parsed or converted; line/col are 1-based where known."""

    def __init__(self, message: str, line: int = 0, col: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.col = col

    def format(self, path: str) -> str:
        where = f"{path}:{self.line}:{self.col}" if self.line else path
        return f"{where}: {self.message}"


@dataclass
class Result:
    source: str
    changed: bool
    # converted | refused | already-distributed | legacy | not-training | generated
    status: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def blocking(self) -> list[Finding]:
        return [f for f in self.findings if f.blocking]
