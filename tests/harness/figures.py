"""The soaks' figures: one line each on stdout, and one JSON line in a results file.

``scripts/soak`` runs the soaks; ``scripts/soak --summary`` turns the results file
(``HARNESS_FIGURES``, default ``.soak/figures.jsonl`` at the repository root) into the
table of docs/harness.md, the newest run of each soak winning. The results file is this
checkout's (ignored by git): a soak it has no run of keeps the row the table already has,
so a fresh clone that reruns one soak does not wipe the others' figures.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BEGIN = "<!-- soak figures: written by scripts/soak --summary -->"
END = "<!-- end of soak figures -->"


def results_file() -> Path:
    return Path(os.environ.get("HARNESS_FIGURES", ROOT / ".soak" / "figures.jsonl"))


def _commit() -> str:
    if os.environ.get("HARNESS_COMMIT"):  # a soak run from an exported snapshot
        return os.environ["HARNESS_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return out.stdout.strip() or "?"


def report(soak: str, **figures: object) -> None:
    """Print ``SOAK <name>: k=v ...`` and keep the figures for the summary."""
    print(f"\nSOAK {soak}: " + " ".join(f"{k}={v}" for k, v in figures.items()), flush=True)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
    row = {"soak": soak, "at": when, "commit": _commit(), "figures": figures}
    path = results_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=False) + "\n")


def latest(path: Path) -> dict[str, dict[str, object]]:
    """The newest row of each soak in the results file."""
    rows: dict[str, dict[str, object]] = {}
    if not path.exists():
        return rows
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut by a killed soak
        if isinstance(row, dict) and isinstance(row.get("soak"), str):
            rows[row["soak"]] = row
    return rows


def table(rows: dict[str, dict[str, object]], kept: dict[str, str] | None = None) -> str:
    """The table of ``rows``, and of ``kept`` (name -> a row line) for soaks not in it."""
    lines = dict(kept or {})
    for name, row in rows.items():
        figures = row.get("figures")
        pairs = figures.items() if isinstance(figures, dict) else []
        text = ", ".join(f"{k} {v}" for k, v in pairs)
        lines[name] = f"| {name} | {row.get('at', '?')} | {row.get('commit', '?')} | {text} |"
    head = ["| soak | when (UTC) | commit | figures |", "|---|---|---|---|"]
    return "\n".join(head + [lines[name] for name in sorted(lines)])


def rows_of(block: str) -> dict[str, str]:
    """The row lines of a table :func:`table` wrote, by soak name (its header left out)."""
    out = {}
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] not in ("soak", "---") and len(cells) >= 4:
            out[cells[0]] = line
    return out


def write_summary(doc: Path, path: Path) -> str:
    """Replace the block between the markers in ``doc`` (appended if absent)."""
    text = doc.read_text(encoding="utf-8")
    head, marked, rest = text.partition(BEGIN)
    old, ended, tail = rest.partition(END)
    whole = bool(marked and ended)  # else: no table yet, it goes at the end
    block = f"{BEGIN}\n{table(latest(path), rows_of(old) if whole else {})}\n{END}"
    text = head + block + tail if whole else text.rstrip("\n") + "\n\n" + block + "\n"
    doc.write_text(text, encoding="utf-8")
    return block


if __name__ == "__main__":
    print(write_summary(ROOT / "docs" / "harness.md", results_file()))
