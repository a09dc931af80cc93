"""``scripts/soak --summary``: the table is rewritten from this checkout's results file,
and a soak that file has no run of keeps the row the table already had (a fresh clone
that reruns one soak must not wipe the others' figures)."""

from __future__ import annotations

import json
from pathlib import Path

from . import figures

OLD = """# Harness

{begin}
| soak | when (UTC) | commit | figures |
|---|---|---|---|
| manifests | 2026-12-02 02:25 | 4a1c15d | files 10000, tracebacks 0 |
| races | 2026-12-02 01:47 | 3ac4a1f | seconds 618, racers 8 |
{end}

After the table.
"""


def _results(path: Path, *rows: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{cut by a kill\n")
    return path


def test_a_rerun_replaces_its_row_and_keeps_the_others(tmp_path: Path) -> None:
    doc = tmp_path / "harness.md"
    doc.write_text(OLD.format(begin=figures.BEGIN, end=figures.END))
    results = _results(
        tmp_path / "figures.jsonl",
        {"soak": "races", "at": "2026-12-03 10:00", "commit": "aaa", "figures": {"seconds": 1}},
        {"soak": "races", "at": "2026-12-03 11:00", "commit": "bbb", "figures": {"seconds": 601}},
        {"soak": "cluster_kill_2", "at": "2026-12-03 11:30", "commit": "bbb", "figures": {}},
    )
    figures.write_summary(doc, results)
    text = doc.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows == [
        "| soak | when (UTC) | commit | figures |",
        "| cluster_kill_2 | 2026-12-03 11:30 | bbb |  |",
        "| manifests | 2026-12-02 02:25 | 4a1c15d | files 10000, tracebacks 0 |",
        "| races | 2026-12-03 11:00 | bbb | seconds 601 |",
    ]
    assert text.startswith("# Harness\n") and text.endswith("\nAfter the table.\n")
    figures.write_summary(doc, results)
    assert doc.read_text() == text  # twice is once


def test_a_doc_without_the_table_gets_it_appended(tmp_path: Path) -> None:
    doc = tmp_path / "harness.md"
    doc.write_text("# Harness\n")
    results = _results(
        tmp_path / "figures.jsonl",
        {"soak": "races", "at": "2026-12-03 11:00", "commit": "bbb", "figures": {"racers": 8}},
    )
    block = figures.write_summary(doc, results)
    assert doc.read_text() == f"# Harness\n\n{block}\n"
    assert "| races | 2026-12-03 11:00 | bbb | racers 8 |" in block
