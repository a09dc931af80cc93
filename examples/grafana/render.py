#!/usr/bin/env python3
"""Render the dashboard's panels from a real Prometheus, without Grafana.

    examples/grafana/render.py --prometheus http://127.0.0.1:9090 --out dashboard.html \
        [--minutes 15] [--png dashboard.png]

Every target of every panel in reconcile.json is asked of Prometheus' HTTP API
(``/api/v1/query_range``), with Grafana's variables filled in as Grafana would
(``$__rate_interval``, ``$__interval``, ``$deployment`` as All), and drawn as a line
chart in one HTML page; ``--png`` screenshots that page with headless chromium.
Only the standard library: tests/gateway/test_grafana_example.py imports it.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).with_name("reconcile.json")
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")
Series = list[dict[str, Any]]  # Prometheus' matrix: [{metric: {...}, values: [[t, "v"]]}]


def targets(dashboard: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(panel, target) for every query of the dashboard, in panel order."""
    return [(p, t) for p in dashboard["panels"] for t in p.get("targets", [])]


def substitute(expr: str, dashboard: dict[str, Any], step: int) -> str:
    """``expr`` as Grafana sends it: each template variable at its All value, the
    interval variables for a ``step``-second resolution (``$__rate_interval`` is at
    least four of Prometheus' scrape intervals; ``step`` is chosen to be that)."""
    values = {"__rate_interval": f"{4 * step}s", "__interval": f"{step}s", "__range": "1h"}
    for var in dashboard["templating"]["list"]:
        values[var["name"]] = var.get("allValue") or ".*"

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, match.group(0))

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


def query_range(base: str, expr: str, start: float, end: float, step: int) -> Series:
    params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": str(step)}
    url = f"{base.rstrip('/')}/api/v1/query_range?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as answer:
        body = json.load(answer)
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {expr!r}: {body.get('error')}")
    result: Series = body["data"]["result"]
    return result


def legend(target: dict[str, Any], labels: dict[str, str]) -> str:
    fmt = str(target.get("legendFormat") or "")
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)
    return text.strip() or json.dumps(labels)


def chart(lines: list[tuple[str, list[tuple[float, float]]]], width: int = 460) -> str:
    """One panel's series as an inline SVG line chart with its y range."""
    height, pad = 180, 4
    # A series all NaN in the range (a quantile of a deployment with no request in it) has
    # no point to draw: left out, or its empty line had no last point and raised.
    lines = [(name, pts) for name, pts in lines if pts]
    points = [p for _, pts in lines for p in pts]
    if not points:
        return '<p class="empty">no data</p>'
    t0, t1 = min(t for t, _ in points), max(t for t, _ in points)
    lo, hi = min(0.0, *(v for _, v in points)), max(v for _, v in points)
    span_t, span_v = (t1 - t0) or 1.0, (hi - lo) or 1.0
    out = [f'<svg width="{width}" height="{height}" class="chart">']
    for i, (name, pts) in enumerate(lines):
        xy = " ".join(
            f"{pad + (t - t0) / span_t * (width - 2 * pad):.1f},"
            f"{height - pad - (v - lo) / span_v * (height - 2 * pad):.1f}"
            for t, v in pts
        )
        color = COLORS[i % len(COLORS)]
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{xy}">')
        out.append(f"<title>{html.escape(name)}</title></polyline>")
        last = xy.split(" ")[-1].split(",")  # a one-point series shows as its dot
        out.append(f'<circle cx="{last[0]}" cy="{last[1]}" r="2.5" fill="{color}"/>')
    out.append("</svg>")
    keys = "".join(
        f'<span style="color:{COLORS[i % len(COLORS)]}">&#9632; {html.escape(n)}</span> '
        for i, (n, _) in enumerate(lines)
    )
    return f'{"".join(out)}<div class="axis">{lo:.4g} .. {hi:.4g}</div><div>{keys}</div>'


def render(base: str, dashboard: dict[str, Any], start: float, end: float, step: int) -> str:
    cards = []
    for panel in dashboard["panels"]:
        lines = []
        for target in panel.get("targets", []):
            expr = substitute(target["expr"], dashboard, step)
            for series in query_range(base, expr, start, end, step):
                pts = [(float(t), float(v)) for t, v in series["values"] if v not in ("NaN",)]
                lines.append((legend(target, series["metric"]), pts))
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        title = f"{html.escape(panel['title'])} <small>{html.escape(unit)}</small>"
        cards.append(f'<div class="panel"><h3>{title}</h3>{chart(lines)}</div>')
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(end))
    head = f"{html.escape(dashboard['title'])} dashboard, from {html.escape(base)} at {when}"
    style = (
        "body{font:12px sans-serif;background:#111217;color:#ccccdc;margin:8px}"
        ".grid{display:grid;grid-template-columns:repeat(3,480px);gap:8px}"
        ".panel{background:#181b1f;border:1px solid #2c3235;padding:6px}"
        "h3{margin:0 0 4px;font-size:13px}.axis{color:#8e8e8e}.empty{color:#8e8e8e}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><style>{style}</style></head>"
        f"<body><h2>{head}</h2><div class='grid'>{''.join(cards)}</div></body></html>\n"
    )


def screenshot(page: Path, png: Path) -> None:
    argv = [
        "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        f"--screenshot={png}", "--window-size=1480,1900", page.resolve().as_uri(),
    ]  # fmt: skip
    subprocess.run(argv, check=True, timeout=120, capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090")
    parser.add_argument("--dashboard", type=Path, default=DASHBOARD)
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--step", type=int, default=15, help="seconds: the scrape interval")
    parser.add_argument("--out", type=Path, default=Path("dashboard.html"))
    parser.add_argument("--png", type=Path, default=None)
    args = parser.parse_args()
    dashboard = json.loads(args.dashboard.read_text())
    end = time.time()
    try:
        page = render(args.prometheus, dashboard, end - args.minutes * 60, end, args.step)
    except (OSError, RuntimeError) as exc:
        print(f"render: cannot read {args.prometheus}: {exc}; is Prometheus up?", file=sys.stderr)
        return 1
    args.out.write_text(page)
    if args.png:
        screenshot(args.out, args.png)
    print(args.png or args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
