"""Machine-readable reports for code review, shared by `ddpify` (the converter) and `ddpify lint`.

Each CLI turns its own per-file reports into `FileResult`s; one module per format renders them:
github.py (workflow commands: annotations), sarif.py (SARIF 2.1.0: code scanning), rdjson.py
(reviewdog's diagnostics, the conversion as suggested changes), gitlab.py (GitLab's code quality
report). `text` and `json` stay with each CLI.
"""

from __future__ import annotations

from ddpify.report.common import (
    TOOL_NAME,
    FileError,
    FileResult,
    level,
    parse_error,
    rule_level,
)

# --output-format choices of both commands; the review formats are rendered here.
FORMATS = ("text", "json", "github", "sarif", "rdjson", "gitlab")
REVIEW_FORMATS = ("github", "sarif", "rdjson", "gitlab")
__all__ = [
    "FORMATS",
    "REVIEW_FORMATS",
    "TOOL_NAME",
    "FileError",
    "FileResult",
    "level",
    "parse_error",
    "render",
    "rule_level",
]


def render(fmt: str, results: list[FileResult], tool: str) -> str:
    """The document of a review format for `ddpify` (tool="convert") or `ddpify lint`."""
    if fmt == "github":
        from ddpify.report import github

        return github.render(results, tool)
    if fmt == "sarif":
        from ddpify.report import sarif

        return sarif.render(results, tool)
    if fmt == "rdjson":
        from ddpify.report import rdjson

        return rdjson.render(results, tool)
    if fmt == "gitlab":
        from ddpify.report import gitlab

        return gitlab.render(results, tool)
    raise ValueError(f"not a review format: {fmt!r}")
