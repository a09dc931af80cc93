"""The parse cache: a pass reads what YAML made of a file it has seen, by content.

Every check after parsing still runs; the cache only spares PyYAML (import and compose).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.store.sources import yamlread
from controller.store.sources.manifests import LoadResult, load

GOOD = """\
apiVersion: reconcile/v1
kind: Deployment
metadata:
  name: {name}
  labels: {{team: ml}}
spec:
  engine: command
  command: [serve, "{{port}}", 8192]
  devices: {{count: {count}}}
"""


def _load(folder: Path, cache: Path) -> LoadResult:
    return load([folder], cache_file=cache)


def _summary(result: LoadResult) -> tuple[object, ...]:
    entries = {n: (e.hash, e.line, e.source, e.field_lines) for n, e in result.entries.items()}
    return entries, [str(e) for e in result.errors], result.documents


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "m").mkdir()
    return tmp_path / "m"


def _no_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(text: str) -> object:
        raise AssertionError("parsed a file the cache holds")

    monkeypatch.setattr(yamlread, "documents", refuse)


def test_a_second_load_reads_the_cache_and_gives_the_same(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (folder / "a.yaml").write_text(
        GOOD.format(name="a", count=1) + "---\n" + GOOD.format(name="b", count=0)
    )
    (folder / "bad.yaml").write_text(GOOD.format(name="c", count="-1"))
    cache = tmp_path / "cache" / "manifests.json"
    first = _load(folder, cache)
    assert cache.exists() and oct(cache.stat().st_mode & 0o777) == "0o600"
    assert set(first.entries) == {"a", "b"} and "spec.devices.count" in str(first.errors[0])
    _no_parsing(monkeypatch)
    assert _summary(_load(folder, cache)) == _summary(first)


def test_an_edit_is_seen_even_with_the_same_size_and_mtime(folder: Path, tmp_path: Path) -> None:
    path = folder / "a.yaml"
    path.write_text(GOOD.format(name="a", count=1))
    stamp = path.stat()
    cache = tmp_path / "manifests.json"
    assert _load(folder, cache).entries["a"].deployment.spec.devices.count == 1
    path.write_text(GOOD.format(name="a", count=2))
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert path.stat().st_size == stamp.st_size
    assert _load(folder, cache).entries["a"].deployment.spec.devices.count == 2


def test_broken_yaml_is_never_cached_and_says_where_each_time(folder: Path, tmp_path: Path) -> None:
    (folder / "bad.yaml").write_text("apiVersion: [\n")
    cache = tmp_path / "manifests.json"
    for _ in range(2):
        result = _load(folder, cache)
        assert result.broken_sources == {str(folder / "bad.yaml")}
        assert "invalid YAML" in str(result.errors[0]) and ":2:" in str(result.errors[0])
    assert not cache.exists()  # nothing parsed well: nothing written


def test_values_json_cannot_hold_are_parsed_each_time(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (folder / "a.yaml").write_text(
        GOOD.format(name="a", count=0).replace("team: ml", "day: 2026-12-01")
    )
    cache = tmp_path / "manifests.json"
    first = _load(folder, cache)
    assert "metadata.labels.day" in str(first.errors[0])  # a date, not a string
    assert not cache.exists()
    calls: list[str] = []
    real = yamlread.documents
    monkeypatch.setattr(yamlread, "documents", lambda text: calls.append(text) or real(text))
    assert _summary(_load(folder, cache)) == _summary(first) and len(calls) == 1


def test_a_pass_that_parses_nothing_new_writes_nothing_and_removed_files_drop_out(
    folder: Path, tmp_path: Path
) -> None:
    (folder / "a.yaml").write_text(GOOD.format(name="a", count=0))
    (folder / "b.yaml").write_text(GOOD.format(name="b", count=0))
    cache = tmp_path / "manifests.json"
    _load(folder, cache)
    before = cache.stat()
    _load(folder, cache)
    assert cache.stat().st_ino == before.st_ino and cache.stat().st_mtime_ns == before.st_mtime_ns
    size = cache.stat().st_size
    (folder / "b.yaml").unlink()
    _load(folder, cache)
    assert cache.stat().st_size < size


@pytest.mark.parametrize("junk", [b"", b"not json", b'{"key": "0/old", "docs": {}}', b"[1, 2]"])
def test_a_corrupt_or_foreign_cache_is_ignored(folder: Path, tmp_path: Path, junk: bytes) -> None:
    (folder / "a.yaml").write_text(GOOD.format(name="a", count=1))
    cache = tmp_path / "manifests.json"
    cache.write_bytes(junk)
    assert set(_load(folder, cache).entries) == {"a"}


@pytest.mark.parametrize("entry", [7, [[{}, 5, 1]], [["a", [[["x"], 1]]]]])
def test_an_entry_that_is_not_ours_is_parsed_instead(
    folder: Path, tmp_path: Path, entry: object
) -> None:
    path = folder / "a.yaml"
    path.write_text(GOOD.format(name="a", count=1))
    cache = tmp_path / "manifests.json"
    _load(folder, cache)
    data = json.loads(cache.read_text())
    (digest,) = data["docs"]
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    data["docs"][digest] = entry
    cache.write_text(json.dumps(data))
    assert set(_load(folder, cache).entries) == {"a"}


def test_a_no_op_once_imports_no_yaml(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    sleeper = GOOD.format(name="web", count=0).replace('[serve, "{port}", 8192]', "[sleep, '60']")
    (tmp_path / "m" / "web.yaml").write_text(sleeper)
    code = (
        "import sys; from controller.cli.main import main; "
        "rc = main(sys.argv[1:]); "
        "sys.exit('yaml imported' if 'yaml' in sys.modules else rc)"
    )
    argv = ["--once", "-q", "-f", f"{tmp_path}/m", "--state-dir", f"{tmp_path}/s", "--node", "q"]
    down = ["down", "--state-dir", f"{tmp_path}/s", "--node", "q", "-f", f"{tmp_path}/m"]
    try:
        first = subprocess.run(
            [sys.executable, "-m", "controller", *argv], capture_output=True, timeout=60
        )
        assert first.returncode == 0, first.stderr
        second = subprocess.run(
            [sys.executable, "-c", code, *argv], capture_output=True, timeout=60
        )
        assert second.returncode == 0, second.stderr
    finally:
        subprocess.run([sys.executable, "-m", "controller", *down], capture_output=True, timeout=60)
