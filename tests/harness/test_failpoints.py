"""Every failpoint, armed in turn: the pass dies (or fails) exactly there, one more pass heals.

One node runs the whole module: each case churns it (a stop, a replace, a crashed
engine, a new deployment), runs the armed pass, checks the fault really fired and
that an I/O error was reported without a traceback, runs one recovery pass and
checks every invariant. CI arms each point with ``kill`` and the riskiest six
with an errno too; ``-m slow`` arms each with all three actions.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import warmcli

from controller.failpoints import ENV as FAILPOINTS
from controller.failpoints import LOG_ENV as FAILPOINTS_LOG
from controller.failpoints import POINTS

from .churn import full_churn, pool
from .cluster import CLI_TIMEOUT, Cluster
from .invariants import describe, violations

# Points that only a recovery pass reaches: the crash that sets each of them up.
SETUP = {
    "executor.adopt.before_write": "executor.spawn.before_record=kill",
    "executor.release.before_delete": "executor.spawn.before_exec=kill",
}


# CI arms these with an errno too (alternating ENOSPC/EIO); -m slow arms every point so.
IO_ERRORS_IN_CI = (
    "records.write.before_rename",
    "records.delete.after_unlink",
    "reconciler.reserve.after_write",
    "executor.spawn.before_record",
    "runtime.stop.after_signal",
    "events.append.before_write",
)


# An I/O error at these is named and the pass goes on. An event is history, never the
# action's condition (issue 34, item 12; a full disk drops the event, store/diskspace.py);
# an engine whose spawn note cannot be written runs, found by its marker (runtime.py).
SAID = {
    "events.append.before_write": ("events not journaled", "events are not being recorded"),
    "runtime.spawn.before_note": ("spawn note not written",),
}


def _cases(slow: bool) -> list[tuple[str, str]]:
    if slow:
        return [(p, a) for p in sorted(POINTS) for a in ("kill", "enospc", "eio")]
    out = [(p, "kill") for p in sorted(POINTS)]
    return out + [(p, ("enospc", "eio")[i % 2]) for i, p in enumerate(IO_ERRORS_IN_CI)]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(Path(tmp_path_factory.mktemp("failpoints")))
    for i, name in enumerate(pool()[:3]):
        cluster.write(name, replicas=2 if i == 0 else 1)  # 4 devices: a0, a0@1, a1, a2
    first = cluster.once()
    assert first.code == 0, str(first)
    yield cluster
    leftovers = cluster.close()
    assert not leftovers, f"engines outlived `reconcile down`: {leftovers}"


def check_fault(node: Cluster, point: str, action: str) -> None:
    seen = len(node.fired())
    churn = full_churn(node, random.Random(f"{point}/{action}"))
    if point in SETUP:
        setup = node.once(failpoints=SETUP[point])
        assert setup.code == -signal.SIGKILL, str(setup)
    armed = node.once(failpoints=f"{point}={action}")
    assert f"{point} {action}" in node.fired()[seen:], f"never reached {point}: {churn}\n{armed}"
    if action == "kill":
        assert armed.code == -signal.SIGKILL, str(armed)
    elif point in SAID:
        assert armed.code == 0, str(armed)
        assert "Traceback" not in armed.err, str(armed)
        assert any(why in armed.err for why in SAID[point]), str(armed)
    else:
        assert armed.code == 1, str(armed)
        assert "Traceback" not in armed.err, str(armed)
        assert "No space left on device" in armed.err or "Input/output error" in armed.err
    recovery = node.once()
    assert recovery.code == 0, f"{churn}\n{recovery}"
    assert violations(node) == [], f"{churn}\n{describe(node)}"


@pytest.mark.parametrize(("point", "action"), _cases(slow=False))
def test_failpoint(node: Cluster, point: str, action: str) -> None:
    check_fault(node, point, action)


@pytest.mark.slow
@pytest.mark.parametrize(("point", "action"), _cases(slow=True))
def test_failpoint_every_action(node: Cluster, point: str, action: str) -> None:
    check_fault(node, point, action)


def test_an_armed_call_is_forked_warm_armed_from_its_own_environment(tmp_path: Path) -> None:
    """A call with RECONCILE_FAILPOINTS is forked from the warm CLI (tests/warmcli.py), not
    started cold (~0.45 s of CPU each, this module's dozens): the point is armed from its
    environment, and the next call, armed with none, passes."""
    cluster = Cluster(tmp_path)
    cluster.write(pool()[0])
    argv, log = cluster.argv("--once"), {FAILPOINTS_LOG: str(cluster.faults)}

    def once(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        done = warmcli.run(argv, env=env, cwd=tmp_path, timeout=CLI_TIMEOUT)
        if done is None:  # every call cold, asked for (RECONCILE_TEST_COLD_CLI), or a miss
            assert os.environ.get(warmcli.OFF), "started cold"
            done = warmcli.run_or_cold(argv, env=env, cwd=tmp_path, timeout=CLI_TIMEOUT, cold=True)
        return done

    try:
        killed = once({**cluster.env, **log, FAILPOINTS: "executor.spawn.before_record=kill"})
        assert killed.returncode == -signal.SIGKILL, killed
        assert cluster.fired() == ["executor.spawn.before_record kill"]
        healed = once({**cluster.env, **log})
        assert healed.returncode == 0, healed
        assert cluster.fired() == ["executor.spawn.before_record kill"]  # fired once
    finally:
        leftovers = cluster.close()
    assert not leftovers, f"engines outlived `reconcile down`: {leftovers}"
