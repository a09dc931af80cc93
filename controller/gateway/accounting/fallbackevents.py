"""What a fallback leaves in the event journal: one event per way, per minute.

Every request sent to a fallback is counted (``reconcile_gateway_fallbacks_total``) and
logged, but a journal event per request filled a down primary's journal: it is trimmed
from its oldest lines at 64 KB, so a few hundred requests under load pushed out the
events that say why the primary is down (its crash loop's exit codes), and ``describe``
showed twenty lines of the same fallback. So a way (model, fallback, why) is journalled
at most once a ``WINDOW``, as Kubernetes folds a repeated event into one with a count:
the first request that takes it, then the first after a quiet window, saying how many
went that way unjournalled since. Writes go through a worker thread: the event loop
never waits on the disk.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from controller.store.instances.events import Journal

WINDOW = 60.0  # seconds: one event per way at most in each


@dataclass(slots=True)
class _Way:
    last: float  # when it was last journalled (the clock's seconds)
    since: int = 0  # requests sent that way since, not journalled


class FallbackEvents:
    """The journal's fallback events of one gateway (see the module's docstring)."""

    def __init__(self, state_dir: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self._journal = Journal(state_dir)
        self._clock = clock
        self._ways: dict[tuple[str, str, str], _Way] = {}  # model, fallback, why

    def reason(self, model: str, to: str, why: str, said: str) -> str | None:
        """The event's reason for one request of ``model`` sent to ``to`` (``why``, in
        words ``said``), or None when that way was journalled within the window."""
        now = self._clock()
        way = self._ways.get((model, to, why))
        if way is not None and now - way.last < WINDOW:
            way.since += 1
            return None
        self._ways[(model, to, why)] = _Way(now)
        text = f"{said}: a request went to {to!r}"
        if way is not None and way.since:
            text += f" ({way.since} more since the last such event)"
        return text

    def note(self, deployments: Iterable[str], model: str, to: str, why: str, said: str) -> None:
        """One request went to a fallback: journalled for each of ``deployments`` (the
        model's pool) if due."""
        text = self.reason(model, to, why, said)
        if text is None:
            return
        loop = asyncio.get_running_loop()
        for deployment in deployments:
            loop.run_in_executor(None, self._journal.append, deployment, "fallback", text, "ok")
