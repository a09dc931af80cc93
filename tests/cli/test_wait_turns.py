"""``--wait`` and a start that waits its turn on a shared GPU (core/planner/turns.py)."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest

from controller.cli.render import waiting
from controller.core.planner.turns import TURN
from controller.core.state import Phase, Record
from controller.reconciler.run import PassResult

TURN_WHY = f"waiting for c to be Ready on nvidia:0 ({TURN})"


def _pass(**phases: tuple[Phase, str]) -> PassResult:
    records = {
        name: Record(name=name, owner="o", node="n", phase=phase, message=why)
        for name, (phase, why) in phases.items()
    }
    return PassResult(records=records, owner="o", names=set(records), node="n")


class Passes:
    """A reconciler whose passes are the given results, in turn."""

    config = SimpleNamespace(state_dir=Path("/nonexistent"))

    def __init__(self, *results: PassResult) -> None:
        self.results = list(results)
        self.ran = 0

    def run_pass(self) -> PassResult:
        self.ran += 1
        return self.results.pop(0)


def test_a_start_whose_turn_came_in_the_pass_that_saw_the_other_ready_is_waited_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """CI: `--wait` ended with "cannot progress without you: d Pending: waiting for c to be
    Ready (one start at a time per device)" in the very pass whose probe saw c Ready: a
    turn is no failure (`--once` exits 0 on it), and the next pass starts d."""
    passes = Passes(
        _pass(c=(Phase.READY, ""), d=(Phase.PENDING, TURN_WHY)),
        _pass(c=(Phase.READY, ""), d=(Phase.READY, "")),
    )
    assert waiting.wait_until_ready(passes, 60.0, io.StringIO())  # type: ignore[arg-type]
    assert passes.ran == 2
    assert "cannot progress" not in capsys.readouterr().err


def test_a_pending_start_that_is_no_turn_still_ends_the_wait(
    capsys: pytest.CaptureFixture[str],
) -> None:
    passes = Passes(_pass(c=(Phase.READY, ""), d=(Phase.PENDING, "no capacity: 1 GPU free")))
    assert not waiting.wait_until_ready(passes, 60.0, io.StringIO())  # type: ignore[arg-type]
    assert "cannot progress without you: d Pending: no capacity" in capsys.readouterr().err
