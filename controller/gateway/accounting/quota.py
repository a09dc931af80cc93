"""Per-key limits from the key file (``rpm=``, ``tpm=``): token buckets, one per key and
limit, refilled continuously (a minute's worth at most), kept in the gateway process.

A request takes one from its key's request bucket before it is routed; its tokens are
taken from the token bucket once the engine's ``usage`` says how many (so one request
may leave it below zero: the next ones wait until it refills). A key past either limit
is answered 429 with ``Retry-After``: the seconds until its bucket allows one more.

A reloaded key file (SIGHUP, or a daemon that adopts the gateway) keeps each key's
buckets where they were, a limit lowered included (they never hold more than its new
minute): started afresh, every reload of the daemon, for whatever reason, gave every key
a full minute again. A new gateway process (a hand-over) starts them afresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from controller.gateway.accounting.keys import Keys


class Bucket:
    def __init__(self, per_minute: int, clock: Callable[[], float]) -> None:
        self.per_minute = per_minute
        self.rate = per_minute / 60.0
        self.level = float(per_minute)
        self.clock = clock
        self.at = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(float(self.per_minute), self.level + (now - self.at) * self.rate)
        self.at = now

    def wait(self, need: float) -> float:
        """Seconds until ``need`` is there (0.0: it is now)."""
        self._refill()
        return 0.0 if self.level >= need else (need - self.level) / self.rate

    def take(self, amount: float) -> None:
        self._refill()
        self.level -= amount

    def resized(self, per_minute: int) -> Bucket:
        """This bucket under a new limit: what it holds now, up to the new minute's worth."""
        self._refill()
        bucket = Bucket(per_minute, self.clock)
        bucket.level = min(self.level, float(per_minute))
        return bucket


@dataclass(frozen=True)
class Refusal:
    retry_after: float
    why: str


class Quota:
    """The buckets of one key file (``reloaded``: of its next version)."""

    def __init__(self, keys: Keys | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.keys = keys
        self.clock = clock
        limits = keys.limits if keys is not None else {}
        self._requests = {k: Bucket(v.rpm, clock) for k, v in limits.items() if v.rpm}
        self._tokens = {k: Bucket(v.tpm, clock) for k, v in limits.items() if v.tpm}

    def reloaded(self, keys: Keys | None) -> Quota:
        """The buckets of ``keys``, a reload of this file: a key kept keeps what its
        buckets hold (resized to a changed limit); a new key, or a new limit, starts full."""
        fresh = Quota(keys, self.clock)
        for old, new in ((self._requests, fresh._requests), (self._tokens, fresh._tokens)):
            for label, bucket in new.items():
                if label in old:
                    new[label] = old[label].resized(bucket.per_minute)
        return fresh

    def admit(self, label: str) -> Refusal | None:
        """None (a request taken from the key's allowance), or why not and for how long."""
        tokens = self._tokens.get(label)
        if tokens is not None and (wait := tokens.wait(1.0)) > 0:
            return Refusal(wait, f"over its limit of {tokens.per_minute} tokens per minute")
        requests = self._requests.get(label)
        if requests is not None:
            if (wait := requests.wait(1.0)) > 0:
                why = f"over its limit of {requests.per_minute} requests per minute"
                return Refusal(wait, why)
            requests.take(1.0)
        return None

    def spend(self, label: str, tokens: int) -> None:
        bucket = self._tokens.get(label)
        if bucket is not None and tokens > 0:
            bucket.take(float(tokens))
