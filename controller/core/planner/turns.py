"""One start at a time per shared device: engines packed on a GPU by memory start in turn.

Concurrent CUDA initialisation on one GPU fails where sequential succeeds (vLLM #9198,
#10533, #14376). So a memory-packed start waits while another memory-packed engine on
one of its devices is still starting (Reserved, or Starting and alive), whoever owns
it, until that one is Ready or gone; the waiting record is Pending and says for whom.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from controller.core.actions import AnyAction, Restart
from controller.core.state import Observed, Phase, Record, RecordView

TURN = "one start at a time per device"


def starting_on(observed: Observed) -> dict[str, str]:
    """Device -> the memory-packed record starting on it now (the first by name)."""
    out: dict[str, str] = {}
    for name, view in sorted(observed.records.items()):
        if _starting(view) and not view.record.elsewhere(observed.node):
            for device in view.record.devices:
                out.setdefault(device, name)
    return out


def turn_taken(starting: Mapping[str, str], devices: Iterable[str], name: str) -> str | None:
    """Why ``name`` waits to start on ``devices`` (None: its turn)."""
    for device in devices:
        other = starting.get(device)
        if other is not None and other != name:
            return f"waiting for {other} to be Ready on {device} ({TURN})"
    return None


def restarts_in_turn(actions: Sequence[AnyAction], observed: Observed) -> list[AnyAction]:
    """A memory-packed Restart (its back-off over) waits while another engine starts on its
    device, and of two due on one device the first (by name) goes: the other stays BackOff
    until a later pass (the daemon looks again each second, see daemon/loop.py)."""
    starting = starting_on(observed)
    kept: list[AnyAction] = []
    for action in actions:
        view = observed.records.get(action.name) if isinstance(action, Restart) else None
        if view is not None and view.record.memory is not None:
            if turn_taken(starting, view.record.devices, action.name) is not None:
                continue
            for device in view.record.devices:
                starting.setdefault(device, action.name)
        kept.append(action)
    return kept


def waits_turn(rec: Record) -> bool:
    """A Pending record that only waits for another start on its device (not stuck)."""
    return rec.phase is Phase.PENDING and is_turn(rec.message)


def is_turn(why: str) -> bool:
    """A Hold's reason (a record's message) that is only a turn: the next pass starts it."""
    return why.endswith(f"({TURN})")


def _starting(view: RecordView) -> bool:
    rec = view.record
    if rec.memory is None or not rec.devices:
        return False
    return rec.phase is Phase.RESERVED or (rec.phase is Phase.STARTING and view.alive)
