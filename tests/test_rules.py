"""The rule registry (ddpify/rules.py): each code declared once, by the module that raises it;
docs/rules.md's tables, `--explain` and the findings' default severities all come from it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddpify import rules
from ddpify.findings import BLOCKING, CODES, Finding

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ddpify"
# a code is raised by name ("DDP020") or through its rule (DDP030.at(node, ...))
CODE = re.compile(r"\"(DDP\d{3})\"|\b(DDP\d{3})\.at\(")
DECLARE = re.compile(r"^(?:DDP\d{3} = )?declare\(\s*\"(DDP\d{3})\"", re.M)


def sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in PACKAGE.rglob("*.py")}


def test_each_code_is_declared_exactly_once():
    seen: dict[str, list[str]] = {}
    for path, text in sources().items():
        for code in DECLARE.findall(text):
            seen.setdefault(code, []).append(path)
    twice = {c: p for c, p in seen.items() if len(p) > 1}
    assert not twice
    assert set(seen) == set(rules.load_all())


def test_declaring_a_code_again_elsewhere_is_an_error():
    rules.load_all()
    with pytest.raises(ValueError, match="declared twice"):
        rules.declare(
            "DDP020", "again", "a second declaration"
        )  # this module is not sampler.py
    assert rules.REGISTRY["DDP020"].module == "ddpify.transforms.sampler"


def test_every_code_raised_is_declared_and_every_declared_code_is_raised():
    registry = rules.load_all()
    raised: set[str] = set()
    for text in sources().values():
        body = DECLARE.sub(
            "", text
        )  # the declarations themselves do not count as raising
        raised |= {a or b for a, b in CODE.findall(body)}
    assert raised - set(registry) == set(), "raised but never declared"
    assert {c for c, r in registry.items() if r.tool == "convert"} - raised == set(), (
        "declared but never raised"
    )


def test_a_declared_code_is_raised_by_its_own_module_or_one_that_imports_it():
    text = sources()
    for code, rule in rules.load_all().items():
        own = rule.module.replace(".", "/") + ".py"
        assert own in text, rule.module

        def raises(t: str) -> bool:
            body = DECLARE.sub("", t)
            return f'"{code}"' in body or f"{code}.at(" in body

        assert raises(text[own]) or any(raises(t) for t in text.values())


def test_every_fix_names_a_verify_check_that_exists():
    from ddpify.verify.checks import CHECK_NAMES

    for rule in rules.load_all().values():
        if rule.fix and rule.tool == "convert":
            assert rule.check in CHECK_NAMES, (rule.code, rule.check)
        elif rule.check is not None:
            assert rule.check in CHECK_NAMES, (rule.code, rule.check)


def test_findings_take_their_default_severity_from_the_registry():
    registry = rules.load_all()
    assert BLOCKING == {c for c, r in registry.items() if r.severity == "blocking"}
    assert CODES == {c: r.message for c, r in registry.items()}
    assert Finding(1, 1, "DDP024", "no loader").blocking
    assert not Finding(
        1, 1, "DDP024", "no loader", fixed=True
    ).blocking  # what ddpify fixed never blocks
    assert not Finding(1, 1, "DDP026", "batch").blocking
    assert not Finding(
        1, 1, "DDP024", "said", severity="note"
    ).blocking  # one call site may say otherwise


def test_rules_page_table_is_the_registry():
    page = (ROOT / "docs" / "rules.md").read_text()
    block = page.split("<!-- rules:begin -->\n", 1)[1].split("\n<!-- rules:end -->", 1)[
        0
    ]
    assert block == rules.table("convert"), "run: python tools/rules_table.py"
    lint = page.split("<!-- lint-rules:begin -->\n", 1)[1].split(
        "\n<!-- lint-rules:end -->", 1
    )[0]
    assert lint == rules.table("lint"), "run: python tools/rules_table.py"
    assert (
        rules.table().count("\n") == block.count("\n") + lint.count("\n") - 1
    )  # every code in one of the two


def test_titles_are_kebab_case_and_unique():
    titles = [r.title for r in rules.load_all().values()]
    assert len(titles) == len(set(titles))
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", t) for t in titles)


@pytest.mark.runs
def test_explain_prints_the_rule():
    out = subprocess.run(
        [sys.executable, "-m", "ddpify", "--explain", "ddp024"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("DDP024 (no-training-loader)")
    assert "Severity: blocking" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "ddpify", "--explain", "DDP999"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "no such code" in bad.stderr


@pytest.mark.runs
def test_explain_all_is_the_table():
    out = subprocess.run(
        [sys.executable, "-m", "ddpify", "--explain", "all"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and out.stdout.strip() == rules.table()


def _example_codes(d: Path) -> set[str]:
    return {
        ln.split()[1]
        for ln in (d / "expected.txt").read_text().splitlines()
        if ln.strip()
    }


def test_every_code_has_a_minimal_example_that_raises_it():
    for code, rule in rules.load_all().items():
        d = rule.example
        if (
            rule.tool == "gate"
        ):  # a converted program that breaks the invariant, fed to the gate
            assert (d / "output.py").exists() or (d / "output").is_dir(), (
                f"{code}: no example in {d}"
            )
            from ddpify.gate import example_findings

            assert (
                example_findings(d) == (d / "expected.txt").read_text().splitlines()
            ), f"{code}: tools/regen_fixtures.py {code}"
            assert code in _example_codes(d), f"{code}: its example does not raise it"
            continue
        assert (d / "input.py").exists() or (d / "input").is_dir(), (
            f"{code}: no example in {d}"
        )
        assert (d / "expected.txt").exists(), (
            f"{code}: regenerate with tools/regen_fixtures.py {code}"
        )
        assert code in _example_codes(d), f"{code}: its example does not raise it"
        if (d / "input.py").exists():
            assert 8 <= len((d / "input.py").read_text().splitlines()) <= 40, (
                f"{code}: an example is a minimal script"
            )


def test_a_blocking_example_is_refused_and_a_fixing_one_is_fixed():
    for code, rule in rules.load_all().items():
        lines = [
            ln
            for ln in (rule.example / "expected.txt").read_text().splitlines()
            if f" {code} " in ln + " "
        ]
        if rule.tool != "convert" or not lines:
            continue
        if rule.blocking and not rule.fix:
            assert any("[blocking]" in ln for ln in lines), code
        if rule.fix and not rule.blocking:
            assert any("[*]" in ln for ln in lines), code
