"""Races: reconcilers on one state dir, two owners, one GPU pool, churn, for a bounded time.

Racers (8 by default): `--once` loops on both manifest sets (cron gone wild), the
daemon on set "b", a `down -f a` loop and a `drain --evict` / `uncordon` loop.
Meanwhile both folders churn and a sampler reads the records continuously: a device
or port held by two live records is a double booking, confirmed by re-reading (a
file unchanged since it was read existed the whole time, so two confirmed files held
the thing at once). Then the racers stop, the folders settle within capacity, and
two passes per set must converge. CI races 12 s; the soak 10 minutes.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from controller.core.state import Record
from controller.store.instances.recordjson import from_json

from . import figures
from .churn import load, pool, random_churn
from .cluster import Cluster
from .invariants import describe, double_bookings, violations

RACE_SECONDS = 12.0
RACERS = 8  # the `--once` loops are what is left after the daemon, `down` and drain
# The soak's size (scripts/soak): 10 minutes, 8 racers unless told otherwise.
SOAK_SECONDS = float(os.environ.get("HARNESS_RACE_SECONDS", "600"))
SOAK_RACERS = int(os.environ.get("HARNESS_RACERS", "8"))


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return (info.st_ino, info.st_mtime_ns, info.st_size)


def sample(state: Path) -> list[str]:
    """Double bookings among live records, each confirmed unchanged after the read."""
    seen: dict[str, tuple[tuple[int, int, int], Record]] = {}
    with contextlib.suppress(FileNotFoundError):
        for path in (state / "instances").glob("*.json"):
            with contextlib.suppress(FileNotFoundError, ValueError), open(path, "rb") as f:
                info = os.fstat(f.fileno())
                rec = from_json(f.read())
                seen[rec.name] = ((info.st_ino, info.st_mtime_ns, info.st_size), rec)
    found = double_bookings({n: r for n, (_, r) in seen.items()})
    if not found:
        return []
    stable = {
        n for n, (ident, _) in seen.items() if _identity(state / "instances" / f"{n}.json") == ident
    }
    return double_bookings({n: r for n, (_, r) in seen.items() if n in stable})


class Race:
    def __init__(self, cluster: Cluster, seconds: float) -> None:
        self.cluster = cluster
        self.until = time.monotonic() + seconds
        self.stats: Counter[str] = Counter()
        self.bookings: list[str] = []
        self.failures: list[str] = []
        self.lock = threading.Lock()

    def running(self) -> bool:
        return time.monotonic() < self.until

    def note(self, key: str, failure: str | None = None) -> None:
        with self.lock:
            self.stats[key] += 1
            if failure:
                self.failures.append(failure)

    def loop(self, *args: str, set_: str, pause: float = 0.0) -> None:
        while self.running():
            run = self.cluster.run(*args, set_=set_, timeout=120)
            bad = run.code not in (0, 1) or "Traceback" in run.err
            self.note(f"{args[0]} -f {set_}", str(run) if bad else None)
            time.sleep(pause)

    def drain(self) -> None:
        """Drain with eviction, hold it a moment, uncordon: the other racers meet both."""
        while self.running():
            for verb in (("drain", "--evict", "--ttl", "30s"), ("uncordon",)):
                run = self.cluster.run(*verb, set_="a", timeout=120)
                bad = run.code not in (0, 1) or "Traceback" in run.err
                self.note(verb[0], str(run) if bad else None)
                time.sleep(1.0)

    def churn(self, seed: int) -> None:
        rng = random.Random(seed)
        while self.running():
            set_ = rng.choice(("a", "b"))
            random_churn(self.cluster, rng, set_, most=2)
            self.note("churn")
            time.sleep(rng.uniform(0.1, 0.6))

    def sampler(self) -> None:
        while self.running():
            found = sample(self.cluster.state)
            with self.lock:
                self.stats["samples"] += 1
                self.bookings += found
            time.sleep(0.005)


def _threads(targets: list[Callable[[], None]]) -> list[threading.Thread]:
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    return threads


def _settle(cluster: Cluster) -> None:
    """Within capacity: two devices' worth of replicas per set (4 devices)."""
    for set_ in ("a", "b"):
        present = sorted(cluster.declared()[set_])
        while load(cluster, set_, present) > 2:
            cluster.remove(present.pop(), set_)
        for name in pool(set_)[: max(0, 1 - len(present))]:
            cluster.write(name, set_)


def race(cluster: Cluster, seconds: float, racers: int) -> Counter[str]:
    """``racers`` reconcilers for ``seconds``; then settle and converge, or fail."""
    cluster.write("a0", "a", replicas=2)  # a replicated deployment races too
    for name in pool("b")[:2]:
        cluster.write(name, "b")
    # The warm CLI's zygote (tests/warmcli.py) started before the clock does: its imports
    # took the first seconds of the race, and the racers made a third of the passes.
    assert cluster.run("validate").code == 0
    race = Race(cluster, seconds)
    daemon = cluster.start("--resync", "1s", set_="b")
    onces = max(2, racers - 3)  # the daemon, `down` and drain are the other three
    loops: list[Callable[[], None]] = [
        lambda s=s: race.loop("--once", set_=s) for s in ("a", "b") * onces
    ][:onces]
    loops += [lambda: race.loop("down", set_="a", pause=1.5), race.drain]
    threads = _threads([*loops, lambda: race.churn(random.randrange(1 << 30)), race.sampler])
    for t in threads:
        t.join(timeout=seconds + 180)
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=60) == 0, cluster.stderr(daemon)
    assert "Traceback" not in cluster.stderr(daemon), cluster.stderr(daemon)
    assert not race.failures, race.failures[0]
    assert race.bookings == [], race.bookings[:5]
    assert cluster.run("uncordon").code == 0  # the drain loop may have stopped mid-drain
    _settle(cluster)
    # An engine the churn killed while it started is in BackOff, which `--once` reports
    # (exit 1, "crash-looping"): converge through the back-off, as an operator would.
    finals = [
        cluster.run("--once", "--wait", "--timeout", "120s", set_=s, timeout=200)
        for s in ("a", "b")
    ]
    finals += [cluster.once(s) for s in ("a", "b")]
    assert [r.code for r in finals[-2:]] == [0, 0], "\n".join(map(str, finals))
    assert violations(cluster) == [], describe(cluster)
    return race.stats


def test_eight_reconcilers_never_double_book(two_sets: Cluster) -> None:
    stats = race(two_sets, RACE_SECONDS, RACERS)
    print(f"\nraces: {dict(stats)}; double bookings: 0")


@pytest.mark.slow
def test_races_soak(two_sets: Cluster) -> None:
    """scripts/soak: 10 minutes of 8 racers (HARNESS_RACE_SECONDS, HARNESS_RACERS)."""
    began = time.monotonic()
    stats = race(two_sets, SOAK_SECONDS, SOAK_RACERS)
    passes = sum(v for k, v in stats.items() if k.startswith("--once"))
    figures.report(
        "races",
        seconds=round(time.monotonic() - began),
        racers=SOAK_RACERS,
        once_passes=passes,
        downs=stats["down -f a"],
        drains=stats["drain"],
        churns=stats["churn"],
        samples=stats["samples"],
        double_bookings=0,
        orphans=0,
    )
