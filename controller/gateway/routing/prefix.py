"""``affinity: prefix``: a prompt goes to the instance that served its beginning last.

An engine with a prefix cache (vLLM's automatic prefix caching, SGLang's radix cache,
llama.cpp's slots and RAM prompt cache, TGI's prefix cache) skips the prefill of a
prompt's beginning it already holds; only the instance that served that beginning holds
it. The gateway has no tokenizer, so it does what llm-d's approximate prefix scorer does:
the prompt's text (a chat's messages in order, or a completion's ``prompt``) is cut into
blocks of ``BLOCK_CHARS`` characters (16 tokens at about 4 characters a token: vLLM's
block size) and each block's hash is chained on the one before it (vLLM's block hashes),
so one hash names a whole beginning. Only whole blocks count (an engine caches whole
blocks), at most ``MAX_BLOCKS`` of them (a 16 K character beginning is a family already).

The index remembers, per engine (its nonce: a restarted engine has an empty cache and a
new nonce), the chains it was sent, least recently used first, at most ``CAPACITY``
blocks each, or as many as the engine says its own cache holds where that is more (vLLM
and SGLang state it: ``note_cache``, up to ``CAPACITY_MAX``): the engine evicts least
recently used blocks too, and a chain's blocks are touched last block first so that the
index, like vLLM, drops a chain's tail before its head. There is no expiry by time: an
engine keeps its cache until memory presses, not for a while (docs/design.md, "Prefix
affinity", says why these sizes).

A request goes to the candidate holding the longest run of its chain (ties: least in
flight, two random choices), unless that instance would then be loaded past the bounded
load of consistent hashing (affinity.py's ``bound``: 1.25x the pool's mean, rounded up);
then, and when no candidate holds any of it, the least loaded. The chosen instance is
told the chain at once (before its answer), so a burst of one family stays together.

An instance's load is its requests in flight past those its engine was seen to run at
once (``room``). Counted in flight alone, a holder serving two turns while the other
replica idled was "loaded" and the third turn moved: a cold prefill of the whole
conversation (seconds) to save a wait the engine did not make, since it batches them
(one turn in four moved on two real llama.cpp replicas with free slots, and ``prefix``
lost to ``session`` 2.3-2.6x on TTFT). The room is learned from the engine's own queue
(its ``/metrics``, read every few seconds, enginemetrics.py): nothing waiting while we
had n in flight on it, it runs at least n at once; w waiting, it runs n - w. An engine
that states no queue has no room: its load is its requests in flight, as before.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from controller.gateway.routing import balance
from controller.gateway.routing.affinity import bound
from controller.gateway.routing.balance import T

BLOCK_CHARS = 64  # characters a block: 16 tokens (vLLM's block) at ~4 characters a token
MAX_BLOCKS = 256  # blocks hashed of one prompt (llm-d's default): 16 K characters
# Blocks remembered per engine: llm-d's default, ~500 K tokens (an 8 B model's KV cache
# on an 80 GB GPU). Each costs ~100 bytes here, so ~3 MB per engine at most.
CAPACITY = 31_250
# ... up to this many for an engine that states a larger cache (note_cache): ~2 M tokens,
# ~12 MB here; past it, the index forgets a family the engine may still hold.
CAPACITY_MAX = 4 * CAPACITY
TOKENS_A_BLOCK = BLOCK_CHARS // 4  # a block's tokens at ~4 characters a token
SEED = b"reconcile-prefix-v1"


def prompt_text(fields: Mapping[str, Any]) -> str | None:
    """What the engine's cache is keyed by, as text: a chat's messages in order (each one
    whole, keys sorted, so a turn's history is the next turn's beginning), else a
    completion's ``prompt``; None for anything else."""
    messages = fields.get("messages")
    if isinstance(messages, list):
        return "".join(_message(m) for m in messages)
    prompt = fields.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return _message(prompt)
    return None


def _message(value: object) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return ""


def chain(text: str, block: int = BLOCK_CHARS, limit: int = MAX_BLOCKS) -> tuple[bytes, ...]:
    """The chained hashes of ``text``'s whole blocks: the k-th names its first k+1 blocks."""
    out: list[bytes] = []
    parent = SEED
    for start in range(0, min(len(text) // block, limit) * block, block):
        piece = text[start : start + block].encode("utf-8", "surrogatepass")
        parent = hashlib.blake2b(parent + piece, digest_size=16).digest()
        out.append(parent)
    return tuple(out)


class Prefixes:
    """The chains each engine (by nonce) was sent, least recently used first."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._held: dict[str, OrderedDict[bytes, None]] = {}
        self.room: dict[str, int] = {}  # engine nonce -> requests it was seen to run at once
        self.sized: dict[str, int] = {}  # engine nonce -> blocks its own cache holds, past ours

    def note_cache(self, nonce: str, tokens: float) -> None:
        """Engine ``nonce`` said its KV cache holds ``tokens``: its index keeps as many
        blocks, within ``CAPACITY_MAX``, and never fewer than ``capacity`` (the index errs
        large: docs/design.md, "How the engine's cache shapes the index")."""
        blocks = min(CAPACITY_MAX, math.ceil(tokens / TOKENS_A_BLOCK))
        if blocks > self.capacity:
            self.sized[nonce] = blocks
        else:
            self.sized.pop(nonce, None)

    def capacity_of(self, nonce: str) -> int:
        return self.sized.get(nonce, self.capacity)

    def note_queue(self, nonce: str, inflight: int, waiting: float) -> None:
        """Engine ``nonce`` said ``waiting`` requests wait in its queue while ``inflight``
        of ours were on it (see the module's docstring)."""
        if waiting <= 0:
            self.room[nonce] = max(self.room.get(nonce, 0), inflight)
        else:  # it runs this many at once now (others' requests may wait there too)
            self.room[nonce] = max(0, inflight - math.ceil(waiting))

    def load(self, nonce: str | None, inflight: Mapping[str | None, int], more: int = 0) -> int:
        """Requests in flight on ``nonce`` (and ``more`` sent to it) past what its engine
        runs at once."""
        return max(0, inflight.get(nonce, 0) + more - self.room.get(nonce or "", 0))

    def match(self, nonce: str, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of ``hashes`` engine ``nonce`` holds."""
        held = self._held.get(nonce)
        if held is None:
            return 0
        for count, one in enumerate(hashes):
            if one not in held:
                return count
        return len(hashes)

    def learn(self, nonce: str, hashes: Sequence[bytes]) -> None:
        """Engine ``nonce`` was sent ``hashes``: its most recent, tail evicted first."""
        held = self._held.setdefault(nonce, OrderedDict())
        for one in reversed(hashes):
            held[one] = None
            held.move_to_end(one)
        capacity = self.capacity_of(nonce)
        while len(held) > capacity:
            held.popitem(last=False)

    def keep(self, live: Iterable[str | None]) -> None:
        """Forget every engine not in ``live`` (it left the pool: its cache is gone)."""
        alive = set(live)
        for gone in [n for n in self._held if n not in alive]:
            del self._held[gone]
        for gone in [n for n in self.room if n not in alive]:
            del self.room[gone]
        for gone in [n for n in self.sized if n not in alive]:
            del self.sized[gone]

    def blocks(self) -> int:
        """Blocks remembered in all (the memory bound's measure)."""
        return sum(len(h) for h in self._held.values())

    def engines(self) -> frozenset[str]:
        return frozenset(self._held)

    def place(
        self,
        hashes: Sequence[bytes],
        candidates: Sequence[T],
        inflight: Mapping[str | None, int],
        served: Mapping[str | None, int],
        rng: random.Random,
    ) -> T:
        """The candidate for a prompt of ``hashes`` (see the module's docstring)."""
        chosen = self._holder(hashes, candidates, inflight, served, rng)
        if chosen is None:
            chosen = balance.pick(candidates, inflight, served, rng)
        if hashes and chosen.nonce is not None:
            self.learn(chosen.nonce, hashes)
        return chosen

    def _holder(
        self,
        hashes: Sequence[bytes],
        candidates: Sequence[T],
        inflight: Mapping[str | None, int],
        served: Mapping[str | None, int],
        rng: random.Random,
    ) -> T | None:
        """The candidate holding the longest run of ``hashes`` if it may take one more
        request within the bounded load, else None."""
        if not hashes or not candidates:
            return None
        runs = [(self.match(c.nonce, hashes) if c.nonce else 0, c) for c in candidates]
        best = max(run for run, _ in runs)
        if best == 0:
            return None
        holders = [c for run, c in runs if run == best]
        chosen = holders[0] if len(holders) == 1 else balance.pick(holders, inflight, served, rng)
        # Its load with this request, and the pool's: in flight alone (no room), the
        # request counts one; on an engine with a free place, none.
        after = self.load(chosen.nonce, inflight, more=1)
        total = sum(self.load(c.nonce, inflight) for c in candidates)
        total += after - self.load(chosen.nonce, inflight)
        if after > bound(max(total, 1), len(candidates)):
            return None
        return chosen
