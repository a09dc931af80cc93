"""The table (Markdown) and ``RESULTS.md``."""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.common import Row, median, p95


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return (
        f"{os.cpu_count()} CPUs ({cpu}){mem}, Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def _num(x: float | None) -> str:
    if x is None or x != x:
        return "-"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def render_table(rows: list[Row]) -> str:
    head = (
        "| section | metric | unit | ours median | ours p95 | alternative | alt median "
        "| alt p95 | ratio | goal | met |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        theirs_med = _num(median(r.theirs)) if r.theirs else "-"
        theirs_p95 = _num(p95(r.theirs)) if r.theirs else "-"
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        met = {None: "", True: "yes", False: "**no**"}[r.met]
        ours_p95 = _num(p95(r.ours)) if len(r.ours) > 1 else "-"
        lines.append(
            f"| {r.section} | {r.metric} | {r.unit} | {_num(median(r.ours))} | {ours_p95} "
            f"| {r.alt or '-'} | {theirs_med} | {theirs_p95} | {ratio} | {r.goal or '-'} | {met} |"
        )
    return "\n".join(lines)


NOTES = "<!-- notes below: written by hand, kept when a run rewrites the rest -->"


def write_results(path: Path, table: str, seconds: float, stamp: str) -> None:
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    old = path.read_text() if path.exists() else ""
    notes = NOTES + old.split(NOTES, 1)[1] if NOTES in old else f"{NOTES}\n"
    path.write_text(
        "# Benchmark results\n\n"
        f"- date: {date}\n"
        f"- machine: {machine()}\n"
        f"- command: `python -m benchmarks` ({seconds:.0f} s in all)\n"
        f"- raw output: `benchmarks/out/{stamp}/` (not committed)\n\n"
        "Ratios are ours over the alternative (for a rate, higher is better; for a time,\n"
        "lower is). Medians and nearest-rank p95s over the trials of each line.\n\n"
        f"{table}\n\n"
        f"{notes}"
    )
