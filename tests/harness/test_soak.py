"""Random SIGKILL soak: kill `reconcile --once` (and the daemon) at random instants.

Each trial churns the manifests (deployments added, edited, removed; an engine
crashed now and then), starts a pass, SIGKILLs it at a random instant inside its
usual duration, runs ONE recovery pass and checks every invariant. Every fifth
trial kills the daemon instead, mid-churn. CI runs ``TRIALS`` trials; the soak
(``scripts/soak``, or ``scripts/test -m slow -k soak``) runs ``SOAK_TRIALS``.

The passes' kill instants are stratified: the span (0.1 to 1.1 times a pass's usual
duration) is cut into as many equal slices as there are passes to kill and each slice
gets one kill, at a random point in it, in a random order. So the 24 passes CI kills
land at most 2/24 of the span apart, where 40 independent draws left gaps as wide and
clumps besides; the soak's 1,000 trials cover the churn's combinations. The passes are
forked warm (tests/warmcli.py), the killed ones and the recoveries alike: the span is the
pass's own work on the state dir (cold, its first ~60% were the interpreter's imports,
where a kill proves nothing).
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import time
from collections import Counter

import pytest

from .churn import pool, random_churn
from .cluster import Cluster, Run
from .invariants import describe, violations

TRIALS = 30
SOAK_TRIALS = int(os.environ.get("HARNESS_SOAK_TRIALS", "1000"))
DAEMON_EVERY = 5


def _kill_at_random(cluster: Cluster, proc: subprocess.Popen[bytes], delay: float) -> bool:
    """SIGKILL ``proc`` after ``delay`` seconds; False when it finished first."""
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return True
    err = cluster.stderr(proc)
    assert "Traceback" not in err, err
    return False


def _pass_killed(cluster: Cluster, delay: float) -> bool:
    """A ``--once`` SIGKILLed ``delay`` seconds in (warm: its keeper kills it at the call's
    timeout); False when it finished first."""
    try:
        run = cluster.once(timeout=delay)
    except subprocess.TimeoutExpired:
        return True
    assert "Traceback" not in run.err, str(run)
    return False


def _daemon_trial(cluster: Cluster, rng: random.Random) -> bool:
    proc = cluster.start("--resync", "0.5s")
    time.sleep(rng.uniform(0.1, 0.5))
    random_churn(cluster, rng)  # the daemon sees a folder event mid-run
    return _kill_at_random(cluster, proc, rng.uniform(0.0, 0.8))


def _recovered(run: Run) -> bool:
    """Exit 0, or 1 for nothing but a deployment the churn crashed right after its restart
    (BackOff: `--once` says "crash-looping" so cron mails; the invariants still hold)."""
    errors = [line for line in run.err.splitlines() if line.startswith("error:")]
    looping = bool(errors) and all("is crash-looping" in line for line in errors)
    return run.code == 0 or (run.code == 1 and looping)


def soak(cluster: Cluster, trials: int, seed: int) -> Counter[str]:
    rng = random.Random(seed)
    took = [cluster.once().seconds]  # a warm pass's usual duration, to start from
    passes = sum(1 for t in range(trials) if t % DAEMON_EVERY != DAEMON_EVERY - 1)
    slices = list(range(passes))  # one kill instant per slice of the span (module doc)
    rng.shuffle(slices)
    stats: Counter[str] = Counter()
    for trial in range(trials):
        done = random_churn(cluster, rng)
        if trial % DAEMON_EVERY == DAEMON_EVERY - 1:
            stats["daemon killed" if _daemon_trial(cluster, rng) else "daemon ran out"] += 1
        else:
            where = (slices.pop() + rng.random()) / passes
            delay = (0.1 + where) * statistics.median(took[-20:])
            stats["pass killed" if _pass_killed(cluster, delay) else "pass finished"] += 1
        recovery = cluster.once()  # warm, as the killed pass: its duration sets the span
        took.append(recovery.seconds)
        context = f"trial {trial} (seed {seed}) after {done}"
        assert _recovered(recovery), f"{context}\n{recovery}"
        found = violations(cluster)
        assert found == [], f"{context}: {found}\n{describe(cluster)}"
        stats["trials"] += 1
    return stats


def _report(stats: Counter[str], began: float) -> None:
    shown = ", ".join(f"{k}: {v}" for k, v in sorted(stats.items()))
    print(f"\nsoak: {shown}; lost: nothing; {time.monotonic() - began:.0f}s")


def test_sigkill_soak(cluster: Cluster) -> None:
    began = time.monotonic()
    seed = int(os.environ.get("HARNESS_SEED", "0")) or random.randrange(1 << 30)
    for name in pool()[:3]:
        cluster.write(name)
    stats = soak(cluster, TRIALS, seed)
    assert stats["trials"] == TRIALS
    assert stats["pass killed"] + stats["daemon killed"] >= TRIALS // 2, stats
    _report(stats, began)


@pytest.mark.slow
def test_sigkill_soak_long(cluster: Cluster) -> None:
    began = time.monotonic()
    seed = int(os.environ.get("HARNESS_SEED", "0")) or random.randrange(1 << 30)
    for name in pool()[:3]:
        cluster.write(name)
    stats = soak(cluster, SOAK_TRIALS, seed)
    assert stats["trials"] == SOAK_TRIALS
    _report(stats, began)
