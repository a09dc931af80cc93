"""Bad manifests by the thousand through the real CLI (badmanifests.py: twelve
categories), in batches beside a healthy running deployment and one good new manifest
per batch: `validate`, `plan` and `--once` never traceback, never hang, exit only with
their documented codes (validate and --once 1, plan 1), name every bad file, and the
good manifest of each batch runs while the healthy engine keeps its pid. CI: one batch
of 120; the soak (scripts/soak): 10,000 files.
"""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest

from . import figures
from .badmanifests import plant
from .cluster import Cluster
from .invariants import read_records

BATCH = 200
SAMPLE = 120
FULL = int(os.environ.get("HARNESS_BAD_MANIFESTS", "10000"))
SEED = 26
HANG = 180.0  # seconds: a CLI call past this is a hang


def _engine(cluster: Cluster, name: str) -> int | None:
    rec = read_records(cluster.state)[0].get(name)
    return rec.ref.pid if rec is not None and rec.ref is not None else None


def _batch(cluster: Cluster, first: int, count: int, tried: Counter[str]) -> None:
    folder = cluster.sets["a"]
    tried.update(plant(folder, SEED, first, count))
    good = f"good-{first}"
    cluster.write(good)
    bad = sorted(p.name for p in folder.glob("bad-*.yaml"))
    try:
        for verb, codes in (("validate", {1}), ("plan", {1}), ("--once", {1})):
            run = cluster.run(verb, timeout=HANG)
            tried[f"{verb} calls"] += 1
            assert "Traceback" not in run.err, str(run)
            assert run.code in codes, str(run)
            if verb != "plan":
                missing = [n for n in bad if n not in run.err]
                assert not missing, f"not named: {missing[:5]}\n{run}"
        assert _engine(cluster, good) is not None, read_records(cluster.state)[0].get(good)
    finally:
        for path in folder.glob("bad-*.yaml"):
            path.unlink()
        cluster.remove(good)


def soak(cluster: Cluster, total: int) -> Counter[str]:
    cluster.write("healthy")
    assert cluster.once().code == 0
    pid = _engine(cluster, "healthy")
    tried: Counter[str] = Counter()
    for first in range(0, total, BATCH):
        _batch(cluster, first, min(BATCH, total - first), tried)
        assert _engine(cluster, "healthy") == pid, "the healthy engine was disturbed"
    assert cluster.once().code == 0  # the good ones of the batches are gone again, cleanly
    return tried


def test_bad_manifests_sample(cluster: Cluster) -> None:
    tried = soak(cluster, SAMPLE)
    assert sum(v for k, v in tried.items() if not k.endswith("calls")) == SAMPLE


@pytest.mark.slow
def test_manifests_soak(cluster: Cluster) -> None:
    began = time.monotonic()
    tried = soak(cluster, FULL)
    calls = {k: v for k, v in tried.items() if k.endswith("calls")}
    files = {k: v for k, v in tried.items() if not k.endswith("calls")}
    figures.report(
        "manifests",
        files=sum(files.values()),
        seconds=round(time.monotonic() - began),
        cli_calls=sum(calls.values()),
        tracebacks=0,
        undocumented_exits=0,
        hangs=0,
        healthy_disturbed=0,
        categories=len(files),
    )
