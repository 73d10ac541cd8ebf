"""`ddpify verify --html`: the page is parsed (html.parser): one row per check, one polyline per run
(the one-process run and each rank), axis labels, the throughput bars, and a FAIL's lines with
their source; nothing is fetched and no script runs. The last test makes the page from a real run."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from ddpify.verify import html
from ddpify.verify.checks import FAIL, INFO, NA, PASS, Check, Sources
from ddpify.verify.runner import RunResult

VOID = {
    "meta",
    "br",
    "img",
    "input",
    "link",
    "hr",
    "col",
    "area",
    "base",
    "wbr",
    "source",
    "track",
    "embed",
    "param",
}
SVG_EMPTY = {"line", "polyline", "rect", "circle", "path"}


class Page(HTMLParser):
    """Elements with their attributes and text, and a check that tags nest."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[dict] = []
        self.stack: list[dict] = []
        self.feed(text)
        self.close()
        assert not self.stack, f"unclosed: {[e['tag'] for e in self.stack]}"

    def handle_starttag(self, tag, attrs):
        el = {
            "tag": tag,
            "attrs": dict(attrs),
            "text": "",
            "parents": [e["tag"] for e in self.stack],
            "classes": [
                c for e in self.stack for c in (e["attrs"].get("class") or "").split()
            ],
        }
        self.elements.append(el)
        if tag not in VOID:
            self.stack.append(el)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1]["tag"] == tag, (
            f"</{tag}> closes {self.stack[-1]['tag'] if self.stack else 'nothing'}"
        )
        self.stack.pop()

    def handle_data(self, data):
        for el in self.stack:
            el["text"] += data

    def find(self, tag: str, **attrs) -> list[dict]:
        return [
            e
            for e in self.elements
            if e["tag"] == tag and all(e["attrs"].get(k) == v for k, v in attrs.items())
        ]


def run(role: str, losses: dict[int, list[float]], world: int) -> RunResult:
    return RunResult(
        role,
        world,
        Path("/nonexistent"),
        records={r: {"losses": v, "status": "stopped"} for r, v in losses.items()},
    )


@pytest.fixture
def sample(tmp_path):
    (tmp_path / "train.py").write_text(
        "import torch\nmodel = torch.nn.Linear(2, 2)\ntorch.save(model.state_dict(), 'm.pt')\n"
    )
    checks = [
        Check("ranks", PASS, "2/2 started"),
        Check(
            "rank0-writes",
            FAIL,
            "ranks 0, 1 wrote m.pt",
            "torch.save at train.py:3 runs on every rank: guard it with `if RANK == 0:`",
            ["m.pt: rank 0, rank 1"],
        ),
        Check("saved", NA, "nothing saved <b>here</b>"),
        Check(
            "throughput",
            INFO,
            "baseline 100.0, candidate 150.0 samples/s on 2 ranks, scaling 75%",
            data={
                "candidate": 150.0,
                "baseline": 100.0,
                "unit": "samples/s",
                "scaling": 0.75,
            },
        ),
    ]
    runs = [
        run("baseline", {0: [2.0, 1.5, 1.2, 1.0]}, 1),
        run("candidate", {0: [2.1, 1.4, 1.1], 1: [1.9, 1.6, 1.0]}, 2),
    ]
    doc = {
        "script": str(tmp_path / "train.py"),
        "nproc": 2,
        "backend": "gloo",
        "steps": 3,
        "exit_code": 1,
        "conversion": "converted",
        "verdict": "FAIL: rank0-writes",
    }
    text = html.page(doc, runs, checks, Sources(user_root=str(tmp_path)))
    return Page(text), text


def test_checks_table(sample):
    page, _ = sample
    rows = page.find("tr", **{"class": "check"})
    assert [(r["attrs"]["data-check"], r["attrs"]["data-status"]) for r in rows] == [
        ("ranks", "PASS"),
        ("rank0-writes", "FAIL"),
        ("saved", "N/A"),
        ("throughput", "INFO"),
    ]
    assert "nothing saved <b>here</b>" in rows[2]["text"]  # escaped text, not markup
    assert not page.find("b")


def test_one_polyline_per_run_and_axis_labels(sample):
    page, _ = sample
    lines = page.find("polyline")
    assert [p["attrs"]["data-run"] for p in lines] == [
        "one process",
        "rank 0",
        "rank 1",
    ]
    counts = [len(p["attrs"]["points"].split()) for p in lines]
    assert counts == [4, 3, 3]
    for p in lines:
        assert "svg" in p["parents"]
        for xy in p["attrs"]["points"].split():
            x, y = map(float, xy.split(","))
            assert 0 <= x <= 960 and 0 <= y <= 380
    labels = [
        e["text"]
        for e in page.elements
        if e["tag"] == "text" and "axis-label" in e["attrs"].get("class", "")
    ]
    assert labels == ["backward pass", "loss"]


def test_the_loss_axis_reads_right(sample):
    page, _ = sample
    (base,) = [
        p for p in page.find("polyline") if p["attrs"]["data-run"] == "one process"
    ]
    ys = [float(xy.split(",")[1]) for xy in base["attrs"]["points"].split()]
    xs = [float(xy.split(",")[0]) for xy in base["attrs"]["points"].split()]
    assert (
        ys == sorted(ys) and ys[0] < ys[-1]
    )  # falling loss: higher on the page is a larger y value lower
    assert xs == sorted(xs) and xs[0] < xs[-1]


def test_a_fail_shows_its_lines(sample):
    page, _ = sample
    (failure,) = [
        e for e in page.find("section") if e["attrs"].get("class") == "failure"
    ]
    assert failure["attrs"]["data-check"] == "rank0-writes"
    rows = [e for e in page.find("tr", **{"class": "line"})]
    assert len(rows) == 1
    assert (
        "train.py:3" in rows[0]["text"]
        and "torch.save(model.state_dict(), 'm.pt')" in rows[0]["text"]
    )
    assert "m.pt: rank 0, rank 1" in failure["text"]


def test_throughput_bars(sample):
    page, _ = sample
    bars = page.find("rect")
    assert [b["attrs"]["data-bar"] for b in bars] == [
        "one process",
        "2 ranks",
        "2 × one process (ideal)",
    ]
    widths = [float(b["attrs"]["width"]) for b in bars]
    assert widths[0] < widths[1] < widths[2]


def test_self_contained(sample):
    page, text = sample
    assert not page.find("script") and not page.find("link") and not page.find("img")
    for el in page.elements:
        for key in ("src", "href"):
            assert key not in el["attrs"], el
    assert "http://www.w3.org/2000/svg" in text and "https://" not in text.replace(
        "http://www.w3.org/2000/svg", ""
    )
    assert page.find("style")


def test_many_steps_are_thinned_and_nan_skipped():
    losses = [1.0 / (i + 1) for i in range(20_000)]
    losses[5] = float("nan")
    svg = html.loss_chart([("rank 0", "#000", False, losses)])
    page = Page(svg)
    (line,) = page.find("polyline")
    pts = line["attrs"]["points"].split()
    assert len(pts) == html.MAX_POINTS and "nan" not in line["attrs"]["points"]


def test_nice_ticks():
    assert html.nice_ticks(0.0, 1.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert html.nice_ticks(1, 20) == [0, 5, 10, 15, 20]
    t = html.nice_ticks(0.93, 2.31)
    assert t[0] <= 0.93 and t[-1] >= 2.31


def test_source_lines_of_tracebacks_and_converted_lines(tmp_path):
    user = tmp_path / "train.py"
    user.write_text("a = 1\nb = 2\n")
    copy = tmp_path / "run" / "train.py"
    copy.parent.mkdir()
    copy.write_text("import os\na = 1\nb = 2\n")
    sources = Sources(
        {str(copy): (str(user), user.read_text())}, user_root=str(tmp_path)
    )
    got = html.source_lines(
        [
            f'File "{user}", line 2, in <module>',
            "the barrier at train.py, converted line 1, added at the top",
        ],
        sources,
    )
    assert got == [(f"{user}:2", "b = 2"), ("train.py, converted line 1", "import os")]


@pytest.mark.runs
def test_html_of_a_real_failing_run(tmp_path):
    pytest.importorskip("torch")
    from ddpify.verify import run_verify

    case = Path(__file__).parent / "verify_cases" / "all_ranks_save.py"
    out = tmp_path / "report.html"
    outcome = run_verify(
        str(case),
        ["--out", str(tmp_path)],
        nproc=2,
        steps=6,
        backend="gloo",
        timeout=120.0,
        convert=False,
        echo=lambda *a, **k: None,
        html_path=str(out),
    )
    assert outcome.exit_code == 1
    page = Page(out.read_text())
    rows = {
        r["attrs"]["data-check"]: r["attrs"]["data-status"]
        for r in page.find("tr", **{"class": "check"})
    }
    assert rows["rank0-writes"] == "FAIL" and rows["params-in-sync"] == "PASS"
    assert [p["attrs"]["data-run"] for p in page.find("polyline")] == [
        "one process",
        "rank 0",
        "rank 1",
    ]
    lines = [r["text"] for r in page.find("tr", **{"class": "line"})]
    assert any("all_ranks_save.py:" in t and "torch.save(" in t for t in lines), lines
