"""Bad input never tracebacks, always names its file (and line), never disturbs a healthy engine.

In process, Hypothesis throws fuzzed manifests and raw bytes at the loader (the
only YAML reader) by the hundred. Through the real CLI (`validate` and `--once`),
a folder holding a healthy deployment also gets the nasty files of ``nasty.py``
and batches of fuzzed ones: stderr never holds a traceback, every bad file is
named, and the healthy engine keeps its pid.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.store.sources.manifests import LoadResult, load

from .cluster import Cluster, alive
from .invariants import read_records
from .nasty import clear, plant
from .strategies import BASE, PATHS, manifest_texts, raw_bytes, set_path

TRIED: Counter[str] = Counter()
FIRST_PID: dict[str, int] = {}  # the healthy engine's pid when the module's cluster came up


def _composes(data: bytes) -> bool:
    """Whether plain YAML can read the file (then every error must carry a line)."""
    try:
        list(yaml.compose_all(data.decode("utf-8"), Loader=yaml.SafeLoader))
    except (UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return False
    return True


def load_one(data: bytes) -> tuple[Path, LoadResult]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzzed.yaml"
        path.write_bytes(data)
        return path, load([Path(tmp)])


@settings(max_examples=400)
@given(raw_bytes)
def test_the_loader_survives_any_bytes(data: bytes) -> None:
    path, result = load_one(data)  # raising at all is the failure
    TRIED["in-process files"] += 1
    for error in result.errors:
        assert error.file == str(path), error
        assert str(error).startswith(f"{path}"), error
    if _composes(data) and len(data) < 4096:
        assert all(e.line is not None for e in result.errors), result.errors


WRONG_TYPES: tuple[Any, ...] = (1.5, 20.0, float("inf"), [], {}, {"a": [1]}, True, None, -1)
WRONG_TYPES += (10**100, "", "a" * 300, "\x00\x1b[31m", ["x", 1.5], {"k" * 200: 1})


@pytest.mark.parametrize("path", PATHS, ids=".".join)
def test_every_field_of_the_schema_with_every_wrong_type(path: tuple[str, ...]) -> None:
    """Each field the schema lists, set to each kind of wrong value: the loader never
    raises (a float in ``devices.memory`` once did, in every pass), every error names the
    file, and no message quotes a long value whole."""
    for value in WRONG_TYPES:
        doc = copy.deepcopy(BASE)
        set_path(doc, path, value)
        data = yaml.safe_dump(doc, allow_unicode=True).encode()
        where, result = load_one(data)
        TRIED["schema fields x wrong types"] += 1
        for error in result.errors:
            assert str(error).startswith(f"{where}"), error
            assert len(str(error)) < len(str(where)) + 400, error


@pytest.mark.slow
@settings(max_examples=10_000, deadline=None)
@given(raw_bytes)
def test_the_loader_survives_ten_thousand_files(data: bytes) -> None:
    """The soak's size of the in-process fuzz above (`scripts/test -m slow`)."""
    path, result = load_one(data)
    for error in result.errors:
        assert str(error).startswith(f"{path}"), error


# -- through the real CLI ------------------------------------------------------------------


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A node whose folder "a" holds one healthy, running deployment."""
    cluster = Cluster(Path(tmp_path_factory.mktemp("bad-input")))
    cluster.write("healthy")
    first = cluster.once()
    assert first.code == 0, str(first)
    FIRST_PID["healthy"] = _engine(cluster)
    yield cluster
    leftovers = cluster.close()
    assert not leftovers, f"engines outlived `reconcile down`: {leftovers}"


def _engine(cluster: Cluster) -> int:
    rec = read_records(cluster.state)[0]["healthy"]
    assert rec.ref is not None and alive(rec.ref.pid), rec
    return rec.ref.pid


def _check_cli(cluster: Cluster, bad: list[Path], verbs: tuple[str, ...]) -> None:
    pid = _engine(cluster)
    for verb in verbs:
        run = cluster.run(verb)
        assert "Traceback" not in run.err, str(run)
        if verb in ("validate", "--once"):
            assert run.code == (1 if bad else 0), str(run)
            missing = [p.name for p in bad if str(p) not in run.err]
            assert not missing, f"not named: {missing}\n{run}"
    assert _engine(cluster) == pid  # the healthy engine never moved


def test_nasty_files_through_the_cli(healthy: Cluster) -> None:
    folder = healthy.sets["a"]
    names = plant(folder)
    try:
        _check_cli(healthy, [folder / n for n in names], ("validate", "--once", "plan", "status"))
        assert not os.path.exists("/tmp/reconcile-pwned")
        TRIED["nasty files via CLI"] += len(names)
    finally:
        clear(folder)
    pid = _engine(healthy)
    after = healthy.once()
    assert after.code == 0, str(after)
    assert _engine(healthy) == pid


def test_a_duplicate_name_keeps_the_engine(healthy: Cluster) -> None:
    """Invariant 4: the same name declared again breaks the spec, never the engine."""
    pid = _engine(healthy)
    dup = healthy.sets["a"] / "again.yaml"
    dup.write_text(yaml.safe_dump(healthy.manifest("healthy")))
    try:
        run = healthy.once()
        assert run.code == 1 and str(dup) in run.err and "Traceback" not in run.err, str(run)
        rec = read_records(healthy.state)[0]["healthy"]
        assert rec.spec_valid is False and "duplicate" in rec.message, rec
        assert _engine(healthy) == pid
    finally:
        dup.unlink()
    assert healthy.once().code == 0
    assert _engine(healthy) == pid


@settings(max_examples=4)
@given(st.lists(manifest_texts(), min_size=6, max_size=10))
def test_fuzzed_files_through_the_cli(healthy: Cluster, texts: list[bytes]) -> None:
    TRIED.setdefault("fuzzed files via CLI", 0)  # ran: the report checks it tried something
    folder = healthy.sets["a"]
    bad = []
    for i, data in enumerate(texts):
        _, alone = load_one(data)
        if alone.entries or not alone.errors:
            continue  # only files that must be refused: nothing fuzzed may run
        path = folder / f"fuzzed-{i}.yaml"
        path.write_bytes(data)
        bad.append(path)
    try:
        _check_cli(healthy, bad, ("validate", "--once"))
        TRIED["fuzzed files via CLI"] += len(bad)
    finally:
        for path in bad:
            path.unlink()


def test_report_bad_inputs(request: pytest.FixtureRequest) -> None:
    """Last in the module: every bad-input test that ran tried at least one bad input
    (a filter that let nothing through would pass vacuously), and the healthy engine
    is the one that came up first: never restarted or replaced by any of them."""
    if not TRIED:
        pytest.skip("nothing to report: run with the bad-input tests of this module")
    starved = sorted(kind for kind, count in TRIED.items() if count == 0)
    assert not starved, f"ran but tried no bad input at all: {starved} ({dict(TRIED)})"
    if "healthy" in FIRST_PID:  # the CLI tests ran: their engine is still the first one
        healthy: Cluster = request.getfixturevalue("healthy")
        assert _engine(healthy) == FIRST_PID["healthy"], "the healthy engine was disturbed"
    print(f"\nbad inputs tried: {dict(TRIED)}; healthy engine disturbed: never")
