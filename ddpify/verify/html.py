"""`ddpify verify --html REPORT`: the verify report as one self-contained HTML page.

Inline CSS and SVG drawn here (no script, nothing fetched): the checks table, the loss of every
backward pass of the one-process run and of each rank drawn over each other, the throughput, and
for each FAIL its cause with the lines it names (file:line and the source line).
"""

from __future__ import annotations

import html
import math
import os
import re
from pathlib import Path

from ddpify import __version__
from ddpify.verify.checks import FAIL, Check
from ddpify.verify.runner import RunResult

# one colour per line: the one-process run in black, the ranks after it
RANK_COLOURS = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#8c564b",
    "#e377c2",
    "#17becf",
)
BASELINE_COLOUR = "#222222"
MAX_POINTS = (
    1500  # per line: a longer run is thinned evenly (the first and last points kept)
)

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1d1d1f;
 margin:0;background:#f6f7f9}
main{max-width:1040px;margin:0 auto;padding:24px 28px 40px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 10px}
.meta{color:#555;margin:0 0 12px}
.verdict{padding:10px 14px;border-radius:6px;margin:12px 0 6px;font-weight:600}
.verdict.ok{background:#e6f4ea;color:#1e6b34}.verdict.bad{background:#fde8e8;color:#9b1c1c}
section{background:#fff;border:1px solid #e3e5e8;border-radius:8px;padding:4px 18px 16px;margin:16px 0}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;vertical-align:top;padding:6px 10px;border-bottom:1px solid #eceef1}
th{font-size:12px;text-transform:uppercase;letter-spacing:.04em;color:#666}
td.name{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;white-space:nowrap}
.status{display:inline-block;min-width:44px;text-align:center;border-radius:4px;padding:1px 6px;
 font-weight:700;font-size:12px}
.PASS{background:#e6f4ea;color:#1e6b34}.FAIL{background:#fde8e8;color:#9b1c1c}
.NA{background:#f1f1f1;color:#666}.INFO{background:#e8f0fe;color:#1a4fa0}
.cause{color:#9b1c1c}
pre{background:#f6f7f9;border:1px solid #eceef1;border-radius:4px;padding:8px 10px;overflow-x:auto;
 font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;margin:6px 0}
td.where{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;white-space:nowrap;width:1%}
td.code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;white-space:pre}
svg{display:block;max-width:100%;height:auto}
svg text{font:12px system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;fill:#333}
svg .grid{stroke:#eceef1}svg .axis{stroke:#888}
.note{color:#666;font-size:13px}
footer{color:#888;font-size:12px;margin-top:24px}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


# ----------------------------------------------------------------------------- charts


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step + 1e-9) * step
    ticks = [round(first, 12)]
    while ticks[-1] < hi - step * 1e-9:
        ticks.append(round(first + step * len(ticks), 12))
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e4 or abs(v) < 1e-3:
        return f"{v:.2g}"
    return f"{v:.6g}"


def _thin(values: list[float]) -> list[tuple[int, float]]:
    """(backward index from 1, loss) of the finite values, at most MAX_POINTS of them."""
    points = [
        (i + 1, v)
        for i, v in enumerate(values)
        if isinstance(v, (int, float)) and math.isfinite(v)
    ]
    if len(points) <= MAX_POINTS:
        return points
    stride = len(points) / (MAX_POINTS - 1)
    kept = [
        points[min(len(points) - 1, round(k * stride))] for k in range(MAX_POINTS - 1)
    ]
    return kept + [points[-1]]


def loss_chart(
    series: list[tuple[str, str, bool, list[float]]],
    width: int = 960,
    height: int = 380,
) -> str:
    """series: (label, colour, dashed, losses by backward pass). One polyline each."""
    left, right, top, bottom = 72, 190, 16, 52
    pw, ph = width - left - right, height - top - bottom
    drawn = [
        (label, colour, dashed, _thin(values))
        for label, colour, dashed, values in series
    ]
    xs = [x for *_, pts in drawn for x, _ in pts]
    ys = [y for *_, pts in drawn for _, y in pts]
    xmax = max(xs, default=1)
    xt = nice_ticks(1 if xmax > 1 else 0, xmax)
    yt = nice_ticks(min(ys, default=0.0), max(ys, default=1.0))
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def sx(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / ((y1 - y0) or 1) * ph

    out = [
        f'<svg class="chart loss" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg" aria-label="loss per backward pass">'
    ]
    for t in yt:
        out.append(
            f'<line class="grid" x1="{left}" x2="{left + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}"/>'
        )
        out.append(
            f'<text x="{left - 8}" y="{sy(t) + 4:.1f}" text-anchor="end">{_e(_fmt(t))}</text>'
        )
    for t in xt:
        out.append(
            f'<line class="grid" x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{top}" y2="{top + ph}"/>'
        )
        out.append(
            f'<text x="{sx(t):.1f}" y="{top + ph + 18}" text-anchor="middle">{_e(_fmt(t))}</text>'
        )
    out.append(
        f'<line class="axis" x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}"/>'
    )
    out.append(
        f'<line class="axis" x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}"/>'
    )
    out.append(
        f'<text class="axis-label" x="{left + pw / 2:.1f}" y="{height - 10}" text-anchor="middle">backward pass</text>'
    )
    out.append(
        f'<text class="axis-label" x="16" y="{top + ph / 2:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 16 {top + ph / 2:.1f})">loss</text>'
    )
    for k, (label, colour, dashed, pts) in enumerate(drawn):
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        dash = ' stroke-dasharray="7 4"' if dashed else ""
        width_ = 2.4 if dashed else 1.6
        out.append(
            f'<polyline data-run="{_e(label)}" fill="none" stroke="{colour}" stroke-width="{width_}"{dash} '
            f'stroke-linejoin="round" points="{coords}"/>'
        )
        if len(pts) == 1:
            ((x, y),) = pts
            out.append(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"/>'
            )
        ly = top + 10 + 22 * k
        lx = left + pw + 18
        out.append(
            f'<line x1="{lx}" x2="{lx + 26}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="{width_}"{dash}/>'
        )
        out.append(
            f'<text class="legend" x="{lx + 34}" y="{ly + 4}">{_e(label)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


def throughput_chart(
    bars: list[tuple[str, float, str]], unit: str, width: int = 960
) -> str:
    """Horizontal bars: (label, value, colour)."""
    left, right, row = 220, 150, 34
    height = 24 + row * len(bars)
    top = max((v for _, v, _ in bars), default=1.0) or 1.0
    out = [
        f'<svg class="chart throughput" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg" aria-label="throughput in {_e(unit)}">'
    ]
    for k, (label, value, colour) in enumerate(bars):
        y = 12 + row * k
        w = (width - left - right) * value / top
        out.append(
            f'<text x="{left - 10}" y="{y + 16}" text-anchor="end">{_e(label)}</text>'
        )
        out.append(
            f'<rect data-bar="{_e(label)}" x="{left}" y="{y}" width="{w:.1f}" height="22" rx="3" fill="{colour}"/>'
        )
        out.append(
            f'<text x="{left + w + 8:.1f}" y="{y + 16}">{_e(f"{value:,.1f} {unit}")}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


# ----------------------------------------------------------------------------- the lines a FAIL names

_REFS = (
    re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)'),
    re.compile(r"(?P<file>[^\s:\"'`(),]+\.py), converted line (?P<line>\d+)"),
    re.compile(r"(?P<file>[^\s:\"'`(),]+\.py):(?P<line>\d+)"),
)


def source_lines(
    texts: list[str], sources=None, roots: tuple[str, ...] = ()
) -> list[tuple[str, str]]:
    """(file:line as the text names it, that line of the file) for each place the texts name."""
    found: list[tuple[str, str]] = []
    seen: set[tuple[str, int, bool]] = set()
    for text in texts:
        taken: list[tuple[int, int]] = []
        for k, pattern in enumerate(_REFS):
            for m in pattern.finditer(text or ""):
                if any(s <= m.start() < e for s, e in taken):
                    continue  # part of a longer reference already read
                taken.append((m.start(), m.end()))
                converted = k == 1
                key = (m["file"], int(m["line"]), converted)
                if key in seen:
                    continue
                seen.add(key)
                path = _resolve(m["file"], sources, roots)
                if path is not None and converted and sources is not None:
                    path = sources.copy_of(path)
                line = _line(path, int(m["line"])) if path else None
                label = (
                    f"{m['file']}, converted line {m['line']}"
                    if converted
                    else f"{m['file']}:{m['line']}"
                )
                found.append(
                    (label, line if line is not None else "(source not available)")
                )
    return found


def _resolve(name: str, sources, roots: tuple[str, ...]) -> str | None:
    candidates = [name] if os.path.isabs(name) else []
    if sources is not None:
        if sources.user_root:
            candidates.append(os.path.join(sources.user_root, name))
    candidates += [os.path.join(r, name) for r in roots]
    if sources is not None and not os.path.isabs(name):
        for copy, (
            user,
            _,
        ) in sources.copies.items():  # the user's file named by its base name
            if os.path.basename(user) == os.path.basename(name):
                candidates.append(user)
    return next((c for c in candidates if os.path.isfile(c)), None)


def _line(path: str, line: int) -> str | None:
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    return lines[line - 1].strip() if 0 < line <= len(lines) else None


# ----------------------------------------------------------------------------- the page


def _status_class(status: str) -> str:
    return "NA" if status == "N/A" else status


def _losses(run: RunResult | None, rank: int) -> list[float]:
    rec = (run.records.get(rank) or {}) if run else {}
    return list(rec.get("losses") or [])


def page(doc: dict, runs: list[RunResult], checks: list[Check], sources=None) -> str:
    script = os.path.basename(str(doc.get("script", "script")))
    title = f"ddpify verify: {script}"
    failed = [c for c in checks if c.status == FAIL]
    code = doc.get("exit_code")
    verdict = doc.get("verdict") or doc.get("error") or ""
    parts = [f"<h1>{_e(title)}</h1>"]
    meta = [
        f"{doc.get('nproc', '?')} processes"
        + (f" on {doc['nnodes']} nodes" if (doc.get("nnodes") or 1) > 1 else ""),
        f"backend {doc.get('backend', '?')}",
        "to its end"
        if doc.get("to_end")
        else f"{doc['epochs']} epochs"
        if doc.get("epochs")
        else f"{doc.get('steps')} steps",
        f"conversion: {doc.get('conversion', '?')}",
        f"exit {code}",
    ]
    parts.append(f'<p class="meta">{_e(" · ".join(meta))}</p>')
    if verdict:
        parts.append(
            f'<div class="verdict {"bad" if failed or code else "ok"}">{_e(verdict)}</div>'
        )

    # checks
    causes = any(c.cause for c in checks)  # the column only when a check gives one
    rows = [
        "<tr><th>check</th><th>result</th><th>figure</th>"
        + ("<th>cause</th>" if causes else "")
        + "</tr>"
    ]
    for c in checks:
        rows.append(
            f'<tr class="check" data-check="{_e(c.name)}" data-status="{_e(c.status)}">'
            f'<td class="name">{_e(c.name)}</td><td><span class="status {_status_class(c.status)}">{_e(c.status)}</span></td>'
            f"<td>{_e(c.figure)}</td>"
            + (f'<td class="cause">{_e(c.cause or "")}</td>' if causes else "")
            + "</tr>"
        )
    parts.append(
        f'<section><h2>Checks</h2><table class="checks">{"".join(rows)}</table></section>'
    )

    # failures, with the lines they name
    script_dir = os.path.dirname(os.path.abspath(str(doc.get("script", "."))))
    for c in failed:
        body = [
            f'<h2 id="fail-{_e(c.name)}">{_e(c.name)} failed</h2>',
            f'<p class="cause">{_e(c.cause or c.figure)}</p>',
        ]
        if c.details:
            body.append(f"<pre>{_e(chr(10).join(c.details))}</pre>")
        lines = source_lines(
            [c.cause or "", c.figure, *c.details], sources, (script_dir, os.getcwd())
        )
        if lines:
            rows = "".join(
                f'<tr class="line"><td class="where">{_e(w)}</td><td class="code">{_e(src)}</td></tr>'
                for w, src in lines
            )
            body.append(
                f'<table class="lines"><tr><th>line</th><th>source</th></tr>{rows}</table>'
            )
        parts.append(
            f'<section class="failure" data-check="{_e(c.name)}">{"".join(body)}</section>'
        )

    # loss curves
    by_role = {r.role: r for r in runs}
    series: list[tuple[str, str, bool, list[float]]] = []
    base = by_role.get("baseline")
    if base is not None and _losses(base, 0):
        series.append(("one process", BASELINE_COLOUR, True, _losses(base, 0)))
    cand = by_role.get("candidate")
    if cand is not None:
        for r in range(cand.world):
            if _losses(cand, r):
                series.append(
                    (
                        f"rank {r}",
                        RANK_COLOURS[r % len(RANK_COLOURS)],
                        False,
                        _losses(cand, r),
                    )
                )
    plain = by_role.get("plain")
    if plain is not None:
        for r in range(plain.world):
            if _losses(plain, r):
                series.append((f"plain rank {r}", "#999999", True, _losses(plain, r)))
    if series:
        chart = loss_chart(series)
        note = (
            "The loss of every backward pass as the probe recorded it (a tensor's mean where it is not a scalar). "
            "Each rank sees its own shard, so its curve follows the one-process run without matching it step for step."
        )
        parts.append(
            f'<section><h2>Loss</h2>{chart}<p class="note">{_e(note)}</p></section>'
        )
    else:
        parts.append(
            '<section><h2>Loss</h2><p class="note">No loss was recorded (no backward pass ran).</p></section>'
        )

    # throughput
    tp = next((c for c in checks if c.name == "throughput"), None)
    data = tp.data if tp else {}
    if data.get("candidate"):
        unit = data.get("unit", "")
        world = doc.get("nproc") or (cand.world if cand else 1)
        bars = []
        if data.get("baseline"):
            bars.append(("one process", float(data["baseline"]), BASELINE_COLOUR))
        bars.append((f"{world} ranks", float(data["candidate"]), RANK_COLOURS[0]))
        if data.get("baseline") and unit == "samples/s":
            bars.append(
                (
                    f"{world} × one process (ideal)",
                    float(data["baseline"]) * world,
                    "#c7d2e0",
                )
            )
        parts.append(
            f'<section><h2>Throughput</h2>{throughput_chart(bars, unit)}<p class="note">{_e(tp.figure)}</p></section>'
        )
    elif tp is not None:
        parts.append(
            f'<section><h2>Throughput</h2><p class="note">{_e(tp.figure)}</p></section>'
        )

    parts.append(f"<footer>ddpify {__version__} · ddpify verify --html</footer>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head>\n<body><main>\n"
        + "\n".join(parts)
        + "\n</main></body></html>\n"
    )
