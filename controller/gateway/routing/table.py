"""The routing table: model name -> its pool -> the Ready engine a request goes to.

A routable name's pool is every instance (each replica, ``web``, ``web@1``...) of every
deployment that serves the name: a ``spec.model`` shared by several deployments is
balanced over all of them, while each ``metadata.name`` reaches its own deployment's
instances only. ``target`` picks one: least requests in flight, ties broken by two
random choices (balance.py); with ``affinity: session`` a session key's instance
(affinity.py); with ``affinity: prefix`` the instance that served the prompt's beginning
(prefix.py). Records give each engine's host and port, so routing works on any
backend. The daemon hands every pass's records over (``update``, on the gateway's
loop); requests waiting for a pool wake on each update.

RollingUpdate: while ``<instance>@next`` exists, it takes its instance's place in the
pool once it is Ready.
The daemon's executor calls ``retire`` (through the gateway) before it stops an old
instance: from then on nothing new goes to that instance, and ``retire`` returns when
its in-flight requests have ended (or its grace period ran out).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from controller.core.manifest.names import base_name, instance_of, is_next, next_name, replica_of
from controller.core.state import Drain, Phase, Record
from controller.gateway.accounting.enginemetrics import EngineLoad
from controller.gateway.routing import balance
from controller.gateway.routing.affinity import Sessions
from controller.gateway.routing.health import Health
from controller.gateway.routing.prefix import Prefixes
from controller.host import bootclock
from controller.host.probes import connect_host

DOWN_FOR = 5.0  # seconds an engine that refused a connection is passed over (mark_down)
DRAIN_POLL = 0.01  # seconds between looks at a retiring instance's in-flight count
# Seconds a fresh gateway waits for the daemon's first pass (no record of ours yet) before
# routing by what the records say: the first pass says what exists (no 404 before it).
FIRST_PASS_WAIT = 30.0
# Phases an engine never leaves by itself (the planner's lifecycle: terminal until the
# manifest changes or a restart is asked): a request waits for nothing in them.
ENDED = (Phase.FAILED, Phase.SUCCEEDED)
# Phases a drain holds where they are: it starts nothing, restarts nothing (a BackOff's
# restart is held) and no pass moves an ended one on.
HELD_BY_DRAIN = (Phase.IDLE, Phase.PENDING, Phase.BACKOFF, *ENDED)


def _ended(rec: Record) -> bool:
    """Nothing starts it until a person acts: it ended, or its manifest is invalid and no
    engine of it runs: it never validated (Pending, holding nothing: a deadline to wait for
    it has it never had), or its engine exited after the manifest broke (BackOff with no
    restart until the manifest is valid: a request for it waited out the deadline)."""
    return rec.phase in ENDED or (
        not rec.spec_valid and (not rec.holds or rec.phase is Phase.BACKOFF)
    )


def _zeroed(rec: Record) -> bool:
    """Declared with nothing to run (``spec.replicas: 0``): Idle, and no request wakes it
    (neither OnDemand nor autoscaled to zero): nothing starts it until its manifest
    changes."""
    return rec.phase is Phase.IDLE and not _wakes(rec)


def _backing_off(rec: Record, now: datetime) -> bool:
    """Its engine exited and its restart is still ahead (10 s doubling to 300 s): no
    engine of it can be Ready before then. One restarted at once (a first crash) is not:
    it is Starting by the next pass."""
    return rec.phase is Phase.BACKOFF and rec.backoff_until is not None and rec.backoff_until > now


HANDED_OVER = "handed over"  # why a gateway stops once its successor serves (``close``)


@dataclass(frozen=True, slots=True)
class Target:
    deployment: str
    host: str
    port: int
    nonce: str | None
    instance: str = ""  # the instance it serves as (``web@1``; a ``@next``: the one it replaces)


@dataclass(frozen=True, slots=True)
class PoolFacts:
    """What a pool's records say of how its requests go, the same until they change."""

    label: str  # what limits and metrics count its requests under (Table.label)
    affinity: str  # session, prefix or none (Table.affinity)
    fallbacks: tuple[str, ...]  # its fallback models, in order
    fallback_after: float  # seconds to wait for a Ready instance before them
    wakes: tuple[str, ...]  # the deployments a request wakes (Table.on_demand)


class Table:
    def __init__(self, rng: random.Random | None = None, health: Health | None = None) -> None:
        self.pools: dict[str, tuple[str, ...]] = {}  # routable name -> its deployments
        self.instances: dict[str, tuple[str, ...]] = {}  # deployment -> its instances
        self.records: dict[str, Record] = {}
        # Deployments whose record a newer reconcile wrote (a version this one cannot read)
        # and that route nowhere: a request for one is told so, not "does not exist".
        self.unreadable: frozenset[str] = frozenset()
        self.drain: Drain | None = None  # the node's, as the last look read it
        self._changed = asyncio.Event()
        # Engines that refused a connection: nonce -> (its record then, until when).
        self._down: dict[str | None, tuple[Record | None, float]] = {}
        self.loaded = asyncio.Event()  # set by the first pass's records
        self.inflight: Counter[str | None] = Counter()  # engine nonce -> requests in flight
        self.served: Counter[str | None] = Counter()  # engine nonce -> requests sent so far
        self._retired: set[str | None] = set()  # nonces of instances being stopped
        self._probed: set[str | None] = set()  # Starting nonces our own probe saw ready
        self._sessions: defaultdict[str, Sessions] = defaultdict(Sessions)  # per pool
        self.prefixes = Prefixes()  # per engine: the prompt beginnings it was sent
        self._rng = rng or random.Random()
        self.health = health or Health()  # passive health: engines failing in a row
        self._facts: dict[str, PoolFacts] = {}  # pool -> its facts, until the records change
        # (instance, engine nonce) -> where its requests go, until the records change
        self._targets: dict[tuple[str, str | None], Target] = {}
        # Reads the records now if they changed (the gateway process's look); None where
        # the records are pushed (``update``: a test's gateway in process).
        self.catch_up: Callable[[], Awaitable[None]] | None = None
        # Why this gateway stopped accepting (a hand-over, a stop), once it has: a request
        # then waits for no engine (``close``).
        self.closing: str | None = None

    async def known(self, name: str) -> bool:
        """Is ``name`` routable? One the table lacks is looked for once more in the
        records as they are now (``catch_up``): a deployment written since the last look,
        which ``status`` may already show, is not answered 404."""
        if name not in self.pools and self.catch_up is not None:
            await self.catch_up()
        return name in self.pools

    async def _hopeless(self, name: str) -> bool:
        """Pool ``name`` ended, drained or backing off, as the records are now: an
        `uncordon` or a `restart` that has just returned is looked for (``catch_up``)
        before the 503 says the drain or the failure holds (the last look may be up to a
        turn old)."""
        if not self._stuck(name):
            return False
        if self.catch_up is not None:
            await self.catch_up()
        return self._stuck(name)

    def _stuck(self, name: str) -> bool:
        return bool(
            self.ended(name) or self.zeroed(name) or self.drained(name) or self.backing_off(name)
        )

    async def first_pass(self, timeout: float) -> None:
        """Before the first pass there is nothing to route by: wait for it (bounded)."""
        if not self.loaded.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.loaded.wait(), timeout)

    def mark_down(self, target: Target) -> None:
        """Route nothing more to that engine for ``DOWN_FOR`` seconds, or until its own
        record changes (its exit seen, a restart under a new nonce). Not until any record
        changes: another engine's record written while this one's still says Ready put
        the refused engine back in the pool, where, with nothing in flight, least in
        flight chose it again, so a request could use up its retries on a dead engine
        while others were Ready (a 503 in tests/gateway/test_pools.py)."""
        rec = next((r for r in self.records.values() if r.nonce == target.nonce), None)
        self._down[target.nonce] = (rec, time.monotonic() + DOWN_FOR)

    def update(
        self,
        records: Iterable[Record],
        drain: Drain | None = None,
        unreadable: frozenset[str] = frozenset(),
    ) -> None:
        """The records of ours, and the node's drain (``drain.json``), as read now;
        ``unreadable``: the deployments of records of a version this reconcile cannot read."""
        self.drain = drain
        self.unreadable = unreadable
        was = {r.nonce: (r.host, r.port) for r in self.records.values()}
        self.records = {r.name: r for r in records}
        self._facts, self._targets = {}, {}
        pools: defaultdict[str, set[str]] = defaultdict(set)
        instances: defaultdict[str, set[str]] = defaultdict(set)
        for rec in self.records.values():
            deployment = base_name(rec.name)
            instances[deployment].add(instance_of(rec.name))
            if is_next(rec.name) and instance_of(rec.name) in self.records:
                # A rolling update's new instance: routed as the one it replaces. Alone
                # (a restarted daemon finished the old one's stop before the promotion),
                # it is that instance already: its names route to it.
                continue
            for name in rec.models:
                pools[name].add(deployment)
        self.pools = {name: tuple(sorted(found)) for name, found in sorted(pools.items())}
        self.instances = {d: tuple(sorted(found, key=replica_of)) for d, found in instances.items()}
        live = {r.nonce for r in self.records.values()}
        self._down = {
            nonce: (rec, until)
            for nonce, (rec, until) in self._down.items()
            if rec is not None and self.records.get(rec.name) == rec
        }
        self._retired &= live  # an instance still on record stays retired until it is gone
        # A probe vouches for a Starting engine until the daemon has its say: once its
        # record is in another phase it is dropped, so an engine that goes back to
        # Starting (Ray restarting its actor on a lost node, same nonce, old address) is
        # not routed to on the strength of a probe from before it was Ready.
        self._probed &= {r.nonce for r in self.records.values() if r.phase is Phase.STARTING}
        # Ray restarts a lost node's actor elsewhere under the same nonce: an engine at a
        # new address is another process. What the old one earned (an ejection for its
        # cut link, the prompts it cached) is not the new one's: with one replica, the old
        # ejection answered 503 for the rest of its 30 s after the new engine was Ready.
        moved = {
            r.nonce
            for r in self.records.values()
            if was.get(r.nonce, (r.host, r.port)) != (r.host, r.port)
        }
        self.health.forget(live - moved)
        self.prefixes.keep(live - moved)  # an engine that left took its cache with it
        for gone in [n for n in self.served if n not in live]:
            del self.served[gone]  # only the tie-break reads it: a gone engine's is moot
        self.loaded.set()
        self._wake()

    def close(self, why: str) -> None:
        """The gateway stopped accepting (``why``): no request waits for a Ready engine
        from now on. One that has none is answered at once, before the drain's deadline
        would cut it with no answer at all: its client's retry reaches the gateway that
        serves the port (a hand-over's successor), and it held no engine state."""
        self.closing = why
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def next_change(self) -> None:
        """Until the table's next change: records, a probe, a retire."""
        await self._changed.wait()

    def probed_ready(self, nonce: str | None) -> None:
        """The gateway's own probe passed for a Starting engine: route to it already."""
        if nonce is not None:
            self._probed.add(nonce)
            self._wake()

    def request_began(self, nonce: str | None) -> None:
        """A request went to engine ``nonce``: in flight (least requests, retire's wait)
        and served (the balancer's tie-break)."""
        # get, not the Counter's missing key: an idle engine has no entry (request_ended),
        # and a Counter's __missing__ is a Python call on every request at one client.
        self.inflight[nonce] = self.inflight.get(nonce, 0) + 1
        self.served[nonce] += 1

    def engine_read(self, nonce: str, load: EngineLoad) -> None:
        """Engine ``nonce``'s own figures as just read (enginemetrics.py): its queue,
        beside our requests in flight on it, says how many it runs at once, which prefix
        routing's bound counts past; its cache's size sizes its prefix index (prefix.py)."""
        if load.waiting is not None:
            self.prefixes.note_queue(nonce, self.inflight.get(nonce, 0), load.waiting)
        if load.cache_tokens is not None:
            self.prefixes.note_cache(nonce, load.cache_tokens)

    def request_ended(self, nonce: str | None) -> None:
        """A request to ``nonce`` ended, however (answered, failed, cancelled)."""
        self.inflight[nonce] -= 1
        if self.inflight[nonce] <= 0:
            del self.inflight[nonce]  # an idle engine leaves no entry behind

    async def retire(self, old: Record, new: Record | None, timeout: float) -> None:
        """Send nothing more to ``old`` (to ``new`` instead, if given); wait out its requests."""
        if new is not None:
            self.records[new.name] = new
            self._facts, self._targets = {}, {}
        self._retired.add(old.nonce)
        self._wake()
        end = time.monotonic() + timeout
        while self.inflight[old.nonce] > 0 and time.monotonic() < end:
            await asyncio.sleep(DRAIN_POLL)

    def facts(self, name: str) -> PoolFacts:
        """Pool ``name``'s facts, kept until the records change: each request asks for
        them, and reading them afresh from the records each time was ~4% of a profile."""
        known = self._facts.get(name)
        if known is not None:
            return known
        pool = self.pools.get(name, ())
        firsts = [self._first(d) for d in pool]
        affinities = {first.affinity for first in firsts}
        fallbacks: dict[str, None] = {}
        for first in firsts:
            fallbacks.update(dict.fromkeys(first.fallbacks))
        known = PoolFacts(
            # its deployment when it has one, else the model name itself
            label=pool[0] if len(pool) == 1 else name,
            # session if one of its deployments asks for it (a session key is the
            # client's own word), else prefix if one does, else none
            affinity=next((a for a in ("session", "prefix") if a in affinities), "none"),
            fallbacks=tuple(fallbacks),  # each deployment's, first seen first
            fallback_after=min((first.fallback_after for first in firsts), default=30.0),
            wakes=tuple(d for d, first in zip(pool, firsts, strict=True) if _wakes(first)),
        )
        if name in self.pools:  # bounded by the pools: never a name a client made up
            self._facts[name] = known
        return known

    def label(self, name: str) -> str:
        """What limits and metrics count a pool's requests under: its deployment when it
        has one, else the model name itself."""
        return self.facts(name).label

    def parked_at(self, deployment: str) -> datetime | None:
        """When ``deployment``'s record was parked, while it is Idle (else None)."""
        rec = self.records.get(deployment)
        return rec.idle_since if rec is not None and rec.phase is Phase.IDLE else None

    def on_demand(self, name: str) -> tuple[str, ...]:
        """The deployments of pool ``name`` a request wakes: OnDemand ones, and autoscaled
        ones scaled to zero (a request for the pool wants them all)."""
        return self.facts(name).wakes

    def target(
        self,
        name: str,
        avoid: str | None = "-",
        session: str | None = None,
        prefix: tuple[bytes, ...] = (),
    ) -> Target | None:
        """Where a request for pool ``name`` goes now, never to the engine whose nonce is
        ``avoid`` (it just dropped a request): ``session``'s instance under session
        affinity, the holder of the prompt's beginning (``prefix``: its chained block
        hashes) under prefix affinity, else the least loaded."""
        found = self.candidates(name, avoid)
        if not found:
            return None
        affinity = self.affinity(name)
        if session is not None and affinity == "session":
            by_instance = {t.instance: t for t in found}
            return by_instance[self._sessions[name].place(session, by_instance)]
        if affinity == "prefix":
            return self.prefixes.place(prefix, found, self.inflight, self.served, self._rng)
        return balance.pick(found, self.inflight, self.served, self._rng)

    def candidates(
        self, name: str, avoid: str | None = "-", *, healthy: bool = True
    ) -> list[Target]:
        """Every instance of pool ``name`` that may take a request now: a Ready ``@next``
        in its instance's place, else the instance itself (``healthy``: not ejected)."""
        out: list[Target] = []
        for deployment in self.pools.get(name, ()):
            for instance in self.instances.get(deployment, ()):
                for rec in (self.records.get(next_name(instance)), self.records.get(instance)):
                    found = self._target(instance, rec)
                    if found is not None and found.nonce != avoid:
                        if not healthy or self.health.admits(found.nonce):
                            out.append(found)
                        break
        return out

    def ejected(self, name: str) -> float | None:
        """Seconds until the next trial when every routable instance of pool ``name`` is
        ejected (health.py); None when one is not (or none is routable at all)."""
        return self.health.ejected(t.nonce for t in self.candidates(name, healthy=False))

    def starting(self, name: str) -> list[Record]:
        """The records of pool ``name`` whose engines are starting (what the gateway may
        probe)."""
        return [
            rec
            for deployment in self.pools.get(name, ())
            for instance in self.instances.get(deployment, ())
            for rec in (self.records.get(instance), self.records.get(next_name(instance)))
            if rec is not None and rec.phase is Phase.STARTING and rec.port is not None
        ]

    def _target(self, instance: str, rec: Record | None) -> Target | None:
        if rec is None or rec.port is None or rec.nonce in self._retired:
            return None
        probed = rec.phase is Phase.STARTING and rec.nonce in self._probed
        if rec.phase is not Phase.READY and not probed:
            return None
        down = self._down.get(rec.nonce)
        if down is not None:
            if time.monotonic() < down[1]:
                return None
            del self._down[rec.nonce]  # tried again: a refusal marks it once more
        # Made once per record: each request asks, and a frozen dataclass is costly to make.
        made = self._targets.get((instance, rec.nonce))
        if made is None:
            host = connect_host(rec.host)
            made = Target(base_name(rec.name), host, rec.port, rec.nonce, instance)
            self._targets[(instance, rec.nonce)] = made
        return made

    def _first(self, deployment: str) -> Record:
        """Replica 0's record (the deployment's facts are the same on every replica)."""
        instances = self.instances.get(deployment, ())
        rec = self.records.get(instances[0]) if instances else None
        return rec or Record(name=deployment, owner="", node="")

    def affinity(self, name: str) -> str:
        """Pool ``name``'s affinity: session if one of its deployments asks for it, else
        prefix if one does, else none."""
        return self.facts(name).affinity

    def fallbacks(self, name: str) -> tuple[str, ...]:
        """Pool ``name``'s fallback models, in order (each deployment's, first seen first)."""
        return self.facts(name).fallbacks

    def fallback_after(self, name: str) -> float:
        """Seconds a request for pool ``name`` waits for a Ready instance before its
        fallbacks (the shortest of its deployments')."""
        return self.facts(name).fallback_after

    def deadline(self, name: str) -> float:
        """How long a request may wait for pool ``name`` to have a Ready instance: the
        longest readiness deadline of its records, the very ones the daemon fails engines
        at (0: no valid spec, nothing will start it)."""
        return max(
            (
                rec.ready_deadline_seconds or 0.0
                for deployment in self.pools.get(name, ())
                for instance in self.instances.get(deployment, ())
                if (rec := self.records.get(instance)) is not None
            ),
            default=0.0,
        )

    def ended(self, name: str) -> tuple[Record, ...]:
        """The records of pool ``name`` when none of its instances can become Ready by
        itself (each one, and its ``@next`` if any, Failed or Succeeded, or holding
        nothing under an invalid manifest: terminal until the manifest changes or
        ``reconcile restart``); () while one still may."""
        return self._every(name, _ended)

    def zeroed(self, name: str) -> tuple[Record, ...]:
        """The records of pool ``name`` when its manifests scale every one of its
        deployments to 0 (``spec.replicas: 0``: Idle, woken by no request); ()
        otherwise. A request for it waited out the readiness deadline for nothing."""
        return self._every(name, _zeroed)

    def backing_off(self, name: str) -> tuple[Record, ...]:
        """The records of pool ``name`` while none of its instances can be Ready before a
        restart that is seconds to minutes away: each one backing off after its engine
        exited (a crash loop) or ended, one at least backing off; () while one may be Ready
        sooner (Starting, Pending for room, Idle until a request starts it)."""
        now = datetime.now(UTC)
        found = self._every(name, lambda rec: _ended(rec) or _backing_off(rec, now))
        return found if any(_backing_off(rec, now) for rec in found) else ()

    def _every(self, name: str, judged: Callable[[Record], bool]) -> tuple[Record, ...]:
        """The records of pool ``name`` when each instance's, and its ``@next``'s if any,
        is ``judged`` so; () when one is not, or none is there."""
        found: list[Record] = []
        for deployment in self.pools.get(name, ()):
            for instance in self.instances.get(deployment, ()):
                recs = [self.records.get(instance), self.records.get(next_name(instance))]
                present = [rec for rec in recs if rec is not None]
                if not present or not all(map(judged, present)):
                    return ()
                found.extend(present)
        return tuple(found)

    def phases(self, name: str) -> str:
        """The phases of pool ``name``'s instances, for a 503's message."""
        found = [
            rec.phase.value
            for deployment in self.pools.get(name, ())
            for instance in self.instances.get(deployment, ())
            if (rec := self.records.get(instance)) is not None
        ]
        return ", ".join(sorted(set(found))) or "gone"

    def drained(self, name: str) -> Drain | None:
        """The node's drain while it keeps every instance of pool ``name`` from getting
        Ready (none is starting or serving, and a drain starts nothing), else None."""
        drain = self.drain
        if drain is None or not self.pools.get(name):
            return None
        for deployment in self.pools[name]:
            for instance in self.instances.get(deployment, ()):
                for rec in (self.records.get(instance), self.records.get(next_name(instance))):
                    if rec is not None and rec.phase not in HELD_BY_DRAIN:
                        return None
        return drain if drain.active(datetime.now(UTC), bootclock.read()) else None

    def held(self, name: str) -> str:
        """Why pool ``name`` waits, as its first Pending instance's record says (no
        capacity and who holds it, preempted, drained), for a 503's message; "" if none."""
        found = (
            rec.message
            for deployment in sorted(self.pools.get(name, ()))
            for instance in self.instances.get(deployment, ())
            if (rec := self.records.get(instance)) is not None and rec.phase is Phase.PENDING
        )
        return next((message for message in found if message), "")

    async def wait_target(
        self,
        name: str,
        timeout: float,
        on_wait: Callable[[], None] = lambda: None,
        session: str | None = None,
        prefix: tuple[bytes, ...] = (),
    ) -> Target | None:
        """A Ready engine of pool ``name``, waiting up to ``timeout`` for one.

        ``on_wait`` runs before each wait (the gateway starts its own probes there).
        """
        end = time.monotonic() + timeout
        while True:
            found = self.target(name, session=session, prefix=prefix)
            left = end - time.monotonic()
            if found is not None or left <= 0 or name not in self.pools:
                return found
            if self.closing is not None:
                return None  # the gateway is closing: the 503 says to retry (close)
            if self.ejected(name) is not None:
                return None  # every instance is ejected: the 503 says when to retry
            if await self._hopeless(name):
                return None  # none can become Ready (soon) by itself: the 503 says why, at once
            on_wait()
            # An engine marked down is tried again when its mark runs out, which no
            # record change announces: the wait ends then too, and looks again.
            wake = min(left, self._down_ends_in())
            try:
                await asyncio.wait_for(self._changed.wait(), wake)
            except TimeoutError:
                if wake >= left:
                    return self.target(name, session=session, prefix=prefix)

    def _down_ends_in(self) -> float:
        """Seconds until the first engine marked down may be tried again (inf: none is
        marked); the marks that ran out are dropped."""
        now = time.monotonic()
        self._down = {nonce: mark for nonce, mark in self._down.items() if mark[1] > now}
        return min((until for _, until in self._down.values()), default=math.inf) - now


def _wakes(first: Record) -> bool:
    return first.on_demand or (first.scale_to_zero and first.phase is Phase.IDLE)
