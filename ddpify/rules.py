"""The rule registry: every finding code, declared once, by the module that raises it.

A module declares its codes at import time with `declare(...)`: the code, a short kebab-case
title (like ruff's rule names), the severity of the finding when ddpify did not fix it, the
message, whether ddpify changes code for it (`fix`), and for a fix the `ddpify verify` check that
proves it at run time. Each code has one minimal example under fixtures/rules/<CODE>/ (input.py,
expected.py, expected.txt; options.json where the code needs an option). docs/rules.md's tables,
`ddpify --explain CODE` and the tests all read this registry.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
from dataclasses import dataclass
from pathlib import Path

SEVERITIES = ("blocking", "note")
TOOLS = (
    "convert",
    "lint",
    "gate",
)  # gate: raised by the invariant gate (ddpify/gate/) on a converted program
CODE_RE = re.compile(r"^DDP\d{3}$")
EXAMPLES = Path(__file__).resolve().parent.parent / "fixtures" / "rules"


@dataclass(frozen=True)
class Said:
    """One finding a rule makes at a node, its message filled from the rule's template."""

    node: object  # a LibCST node, or None: the file's first line
    code: str
    message: str
    fixed: bool
    severity: str = ""  # "" takes the rule's


@dataclass(frozen=True)
class Rule:
    code: str
    title: str  # kebab-case name: process-group-setup
    severity: str  # of a finding ddpify did not fix: "blocking" refuses the file, "note" never does
    message: str  # what the finding says, in general; each finding adds its specifics
    fix: bool  # ddpify changes the code for it ([*] in the output)
    check: str | None  # the verify check that proves the fix at run time
    module: str  # the module that declared (and raises) it
    tool: str = "convert"  # "lint": raised by `ddpify lint` on distributed scripts
    # the rule's messages: case -> (template with {fields}, whether ddpify fixed it)
    says: tuple[tuple[str, str, bool], ...] = ()

    @property
    def blocking(self) -> bool:
        return self.severity == "blocking"

    def at(self, node: object, case: str = "", **fields: object) -> Said:
        """The finding of case `case` ("" when the rule has one message) at `node`."""
        for name, template, fixed in self.says:
            if name == case:
                return Said(node, self.code, template.format(**fields), fixed)
        raise KeyError(f"{self.code} has no message {case!r}")

    @property
    def example(self) -> Path:
        return EXAMPLES / self.code


REGISTRY: dict[str, Rule] = {}


def declare(
    code: str,
    title: str,
    message: str,
    *,
    severity: str = "note",
    fix: bool = False,
    check: str | None = None,
    tool: str = "convert",
    says: dict[str, str | tuple[str, bool]] | str | None = None,
) -> Rule:
    """Declare a code; call it at the top of the module that raises the code. `says`: its
    messages, a template or {case: template}; a case is fixed when the rule is a fix, unless
    given as (template, fixed)."""
    module = sys._getframe(1).f_globals.get("__name__", "?")
    if not CODE_RE.match(code):
        raise ValueError(f"{code!r}: a code is DDP and three digits")
    if severity not in SEVERITIES or tool not in TOOLS:
        raise ValueError(f"{code}: severity {severity!r} / tool {tool!r}")
    if fix and not check and tool == "convert":
        raise ValueError(f"{code}: a fix names the verify check that proves it")
    cases = {"": says} if isinstance(says, str) else dict(says or {})
    rule = Rule(
        code,
        title,
        severity,
        message,
        fix,
        check,
        module,
        tool,
        tuple(
            (case, *(t if isinstance(t, tuple) else (t, fix)))
            for case, t in cases.items()
        ),
    )
    old = REGISTRY.get(code)
    if old is not None and old.module != module:
        raise ValueError(f"{code} is declared twice: in {old.module} and in {module}")
    REGISTRY[code] = rule
    return rule


_loaded = False


def load_all() -> dict[str, Rule]:
    """Import every module of the package that may declare a rule (the converter's and lint's);
    verify is left out: it needs torch and declares no code."""
    global _loaded
    if not _loaded:
        _loaded = True
        for info in pkgutil.walk_packages(
            [str(Path(__file__).resolve().parent)], "ddpify."
        ):
            if info.name.startswith(("ddpify.verify", "ddpify.__main__")):
                continue
            importlib.import_module(info.name)
    return REGISTRY


def get(code: str) -> Rule | None:
    rule = REGISTRY.get(code)
    if rule is None and not _loaded:
        rule = load_all().get(code)
    return rule


def default_severity(code: str, fixed: bool) -> str:
    """A fixed finding never blocks; otherwise the code's declared severity."""
    if fixed:
        return "note"
    rule = get(code)
    return rule.severity if rule is not None else "note"


def table(tool: str | None = None) -> str:
    """The markdown table of docs/rules.md's converter codes (tool="convert"), of its `ddpify lint`
    codes (tool="lint": severity error or note, no fix), or of every code."""
    if tool == "lint":
        rows = ["| code | name | severity | meaning |", "|---|---|---|---|"]
        for code in sorted(load_all()):
            r = REGISTRY[code]
            if r.tool == "lint":
                rows.append(
                    f"| {r.code} | {r.title} | {lint_severity(r)} | {r.message} |"
                )
        return "\n".join(rows)
    rows = [
        "| code | name | severity | fix | verify check | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for code in sorted(load_all()):
        r = REGISTRY[code]
        if (
            tool is not None
            and r.tool != tool
            and not (tool == "convert" and r.tool == "gate")
        ):
            continue
        fix = "yes" if r.fix else ""
        rows.append(
            f"| {r.code} | {r.title} | {r.severity} | {fix} | {r.check or ''} | {r.message} |"
        )
    return "\n".join(rows)


def lint_severity(rule: Rule) -> str:
    """How `ddpify lint` names a rule's severity: a blocking rule is an error (exit 1)."""
    return "error" if rule.blocking else "note"


def explain(code: str) -> str:
    """`ddpify --explain CODE`: the rule, and its example with what ddpify makes of it."""
    rule = get(code.upper())
    if rule is None:
        raise KeyError(code)
    if rule.tool == "lint":
        severity = f"Severity: {lint_severity(rule)}" + (
            " (ddpify lint exits 1 while one remains, unless ignored)"
            if rule.blocking
            else ""
        )
    else:
        severity = f"Severity: {rule.severity}" + (
            " (the file is left unchanged and ddpify exits 2, unless ignored or --partial)"
            if rule.blocking
            else ""
        )
    out = [
        f"{rule.code} ({rule.title})",
        "",
        severity,
        f"Fix: {'ddpify changes the code' if rule.fix else 'none: the finding says what to do by hand'}",
    ]
    if rule.check:
        out.append(f"Proved at run time by: ddpify verify's `{rule.check}` check")
    out.append(
        f"Raised by: {rule.module}" + (" (ddpify lint)" if rule.tool == "lint" else "")
    )
    out += ["", rule.message]
    if rule.tool == "lint":
        from ddpify.lint.families import FAMILIES, family_of

        fam = family_of(rule.code)
        if fam is not None:
            what, codes = FAMILIES[fam]
            others = [c for c in codes if c != rule.code]
            out += [
                "",
                f"Family: {fam}: {what}"
                + (f" (also {', '.join(others)})" if others else ""),
            ]
    ex = rule.example
    examples = (
        ("input.py", "Example"),
        ("expected.py", "Becomes"),
        (
            "expected.txt",
            "Findings" if rule.tool == "convert" else "ddpify lint reports",
        ),
    )
    if (
        rule.tool == "gate"
    ):  # a converted program that breaks the invariant, as the gate reads it
        examples = (
            ("output.py", "A converted program that breaks it"),
            ("expected.txt", "The gate reports"),
        )
    for name, title in examples:
        f = ex / name
        if f.exists():
            text = f.read_text()
            if name == "expected.py" and text == (ex / "input.py").read_text():
                text = "(unchanged: the file is left as it is)\n"
            out += [
                "",
                f"{title}:",
                "",
                *("    " + ln if ln else "" for ln in text.splitlines()),
            ]
    return "\n".join(out) + "\n"
