"""Finding codes: what ddpify changed ([*]) or could not change, with the manual fix.

Severity: a *blocking* finding means the output would not be a correct DDP program (a model
not wrapped, training data not sharded, ...): ddpify then leaves the file untouched and exits 2,
unless the finding is suppressed (`# ddpify: ignore[CODE]` on its line, `ignore` in
[tool.ddpify], `--ignore CODE`) or `--partial` asks for the partial conversion. Every other
finding is a *note*: it never blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddpify import rules


def __getattr__(name: str):
    """CODES (code -> message) and BLOCKING (codes blocking by default), derived from the rule
    registry (ddpify/rules.py), where each code is declared by the module that raises it."""
    if name == "CODES":
        return {c: r.message for c, r in sorted(rules.load_all().items())}
    if name == "BLOCKING":
        return frozenset(c for c, r in rules.load_all().items() if r.blocking)
    raise AttributeError(name)


SEVERITIES = ("blocking", "note")


@dataclass(frozen=True, order=True)
class Finding:
    line: int
    col: int  # 1-based, like ruff
    code: str
    message: str
    fixed: bool = False  # True: ddpify changed the code ([*])
    severity: str = field(
        default="", compare=False
    )  # "blocking" | "note"; "" = the code's default

    def __post_init__(self) -> None:
        if not self.severity:
            object.__setattr__(
                self, "severity", rules.default_severity(self.code, self.fixed)
            )
        elif self.severity not in SEVERITIES:
            raise ValueError(
                f"severity must be one of {SEVERITIES}, not {self.severity!r}"
            )

    @property
    def blocking(self) -> bool:
        return self.severity == "blocking"

    def format(self, path: str) -> str:
        mark = " [*]" if self.fixed else " [blocking]" if self.blocking else ""
        return f"{path}:{self.line}:{self.col}: {self.code}{mark} {self.message}"

    def to_dict(self) -> dict:
        return {
            "line": self.line,
            "col": self.col,
            "code": self.code,
            "severity": self.severity,
            "fixed": self.fixed,
            "message": self.message,
        }
