"""Which instance of a pool takes the next request: least requests in flight, ties broken
by two random choices.

The counts are the gateway's own (``Table.inflight``, per engine nonce, kept by
``Table.request_began``/``request_ended`` on the event loop with no lock and no disk
I/O). Among the instances with the fewest requests in flight, two are drawn at random
and the one that was sent fewer requests so far wins: a burst that arrives while every
instance is idle (all at 0) still spreads evenly, where one random draw would pile up by
chance (Mitzenmacher's power of two choices).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar


class Candidate(Protocol):
    @property
    def nonce(self) -> str | None: ...


T = TypeVar("T", bound=Candidate)


def pick(
    candidates: Sequence[T],
    inflight: Mapping[str | None, int],
    served: Mapping[str | None, int],
    rng: random.Random,
) -> T:
    """The least loaded of ``candidates`` (never empty); see the module's docstring."""
    if len(candidates) == 1:  # one instance (most pools): nothing to weigh
        return candidates[0]
    if not candidates:
        raise ValueError("no instance to pick from")
    fewest = min(inflight.get(c.nonce, 0) for c in candidates)
    tied = [c for c in candidates if inflight.get(c.nonce, 0) == fewest]
    if len(tied) == 1:
        return tied[0]
    first, second = rng.sample(tied, 2)
    return first if served.get(first.nonce, 0) <= served.get(second.nonce, 0) else second
