"""Forwarding a request to an engine, once its body is read and its model known
(routes.py): the deployment's concurrency limit, its fallbacks (a limit reached, no
instance Ready within fallbackAfter, none that can become Ready at all, every instance
ejected), OnDemand rivals' turns and activation, the wait for a Ready instance
(routing/readiness.py), and the call itself: counted per engine (the balancer, retire,
the autoscaler's figures), judged for passive health, and sent once more on another
instance when the engine dropped the connection before a byte of its answer, or was
judged hung before its answer's head (routing/hangs.py).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from controller.core.manifest.names import base_name
from controller.core.state import BACKOFF_MAX, Drain, Phase, Record
from controller.gateway.accounting.fallbackevents import FallbackEvents
from controller.gateway.accounting.inflight import InflightCounts
from controller.gateway.accounting.metrics import GatewayMetrics
from controller.gateway.accounting.tracing import Tracing
from controller.gateway.accounting.usage import Meter
from controller.gateway.http.answers import error
from controller.gateway.http.messages import Request, Response, StreamResponse
from controller.gateway.http.upstream import Upstream
from controller.gateway.routing import readiness
from controller.gateway.routing.activation import Demand, Rewake
from controller.gateway.routing.concurrency import Limiter
from controller.gateway.routing.hangs import Awaited, Hangs
from controller.gateway.routing.prefix import chain, prompt_text
from controller.gateway.routing.readiness import ReadyWaits
from controller.gateway.routing.swaps import Turns
from controller.gateway.routing.table import HANDED_OVER, Table, Target
from controller.gateway.surface.proxy import UpstreamDown, UpstreamFailed, forward
from controller.gateway.surface.upload import TooLarge, Upload
from controller.gateway.surface.waiting import Waiting
from controller.host import bootclock, procstat
from controller.logsetup import get_logger
from controller.store.side import daemonset

log = get_logger("reconcile")

RETRY_AFTER = 5.0  # seconds a 503 or 429 asks the client to wait
CLOSING_RETRY_AFTER = 1.0  # ... when the gateway stops: its successor serves already
DRAIN_RETRY_AFTER = 60.0  # ... at most, when the node's drain holds the deployment
CONNECT_RETRIES = 3  # an engine not reached (refused, connect timed out): wait for a Ready one
SESSION_HEADER = "x-session-id"  # affinity's key; else the OpenAI body's `user`
SESSION_MAX = 1024  # characters of a session key (it is hashed, never stored)


@dataclass
class Forwarder:
    """Takes a request whose body is read and whose model is known to an engine, through
    its fallbacks; owns the per-deployment load, the OnDemand turns, the cold-start waits
    and the looks at silent engines."""

    table: Table
    demand: Demand
    limiter: Limiter
    metrics: GatewayMetrics
    # The engines' connections (http/upstream.py). A retry goes on a new one: the pool may
    # hold more connections the engine closed, and a retry on one of them moved the
    # request off its instance after all (tests/gateway/test_upstream.py).
    upstream: Upstream
    strip_keys: bool = False  # API keys are on: a client's key headers never reach an engine
    tracing: Tracing = field(default_factory=Tracing)  # traces (tracing.py): none by default
    load: InflightCounts = field(default_factory=InflightCounts)  # per deployment (autoscaler)
    turns: Turns | None = None  # OnDemand rivals take turns (swaps.py)
    # engine nonce -> the look at a silent engine (_judge_silence)
    _judging: dict[str | None, asyncio.Task[None]] = field(default_factory=dict, init=False)
    waits: ReadyWaits = field(init=False)  # requests held while their pool cold-starts
    hangs: Hangs = field(init=False)  # requests waiting for an answer's head (hangs.py)
    fallback_events: FallbackEvents = field(init=False)  # the journal's (fallbackevents.py)

    def __post_init__(self) -> None:
        if self.turns is None:
            self.turns = Turns(self.metrics.swap_avoided)
        self.waits = ReadyWaits(self.table, self.demand.request_pass)
        self.hangs = Hangs(self.table.health, self._record_of, self._elsewhere_now)
        self.fallback_events = FallbackEvents(self.demand.state_dir)

    def _record_of(self, nonce: str | None) -> Record | None:
        return next((r for r in self.table.records.values() if r.nonce == nonce), None)

    def _elsewhere_now(self, pool: str, nonce: str | None) -> bool:
        """Another instance of ``pool`` than ``nonce``'s may take a request now, or a
        fallback may (``nonce``'s engine is ejected: DESIGN's "all ejected")."""
        return bool(self.table.candidates(pool, avoid=nonce)) or self._falls_back(pool)

    def _falls_back(self, pool: str) -> bool:
        """``pool`` has a fallback that something serves (``serve`` picks which)."""
        return any(f in self.table.pools for f in self.table.facts(pool).fallbacks)

    def tasks(self) -> list[asyncio.Task[None]]:
        """Its tasks (the gateway cancels what is left of them when it closes): the probes
        of Starting engines and the looks at silent ones."""
        return [*self.waits.tasks(), *self._judging.values(), *self.hangs.tasks()]

    async def serve(
        self,
        incoming: Incoming,
        body: bytes | Upload,
        fields: dict[str, Any],
        tried: tuple[str, ...],
        rest: tuple[str, ...] = (),
    ) -> tuple[str, StreamResponse]:
        """Serve the request with the last model of ``tried``, else with the first that can
        take it of ``rest`` (the fallbacks left of the models before it), then of its own
        fallbacks; none already tried: no loop."""
        model = tried[-1]
        facts = self.table.facts(model)
        label = facts.label
        onward = (
            self._onward(tried, (*rest, *facts.fallbacks))
            if facts.fallbacks or rest
            else []  # most pools have none: no call
        )
        if onward and self.limiter.full(label):
            return await self._fall_back(incoming, body, fields, tried, onward, "limit")
        if not (self.limiter.take(label) or await self.limiter.queued(label)):
            why = f"deployment {label!r} is at its limit of concurrent requests; retry later"
            why = _lead(incoming.passed) + why  # a chain's end: each model tried, and why
            return label, error(429, why, "rate_limit_exceeded", retry_after=RETRY_AFTER)
        incoming.no_instance = incoming.unreached = False
        try:
            want = Ask(
                model,
                label,
                _session(incoming.request, fields),
                _prefix(fields) if facts.affinity == "prefix" else (),
                # A model with fallbacks waits at most its fallbackAfter, even once they
                # were all tried (a loop, a -> b -> a): a chain answers within the sum of
                # its models' fallbackAfter, never an engine's readiness deadline (b's
                # once held a request 9.5 minutes).
                facts.fallback_after if onward or facts.fallbacks else None,
            )
            with self.tracing.span("routing", {"reconcile.model": model}):
                answered = await self._forward(incoming, body, want)
        finally:
            self.limiter.release(label)
        if onward and incoming.no_instance and self.table.closing is None:
            why = "unreachable" if incoming.unreached else self._why(model)
            return await self._fall_back(incoming, body, fields, tried, onward, why)
        return answered

    def _onward(self, tried: tuple[str, ...], fallbacks: tuple[str, ...]) -> list[str]:
        """``fallbacks`` in order, once each, but those tried and those nothing serves."""
        pools = self.table.pools
        return [f for f in dict.fromkeys(fallbacks) if f not in tried and f in pools]

    def _why(self, model: str) -> str:
        """Why pool ``model`` took no request (a fallback's reason)."""
        if self.table.ejected(model) is not None:
            return "ejected"
        return "ended" if self.table.ended(model) else "not_ready"

    async def _fall_back(
        self,
        incoming: Incoming,
        body: bytes | Upload,
        fields: dict[str, Any],
        tried: tuple[str, ...],
        onward: list[str],
        why: str,
    ) -> tuple[str, StreamResponse]:
        """``tried[-1]`` cannot take the request (``why``): the first of ``onward`` serves
        it (or, failing that too, the next: the rest of ``onward``, then that one's own
        fallbacks). Each one taken is counted, and journalled once a minute per way
        (fallbackevents.py)."""
        model, to = tried[-1], onward[0]
        self.metrics.fell_back(model, to, why)
        log.info("request sent to a fallback", model=model, fallback=to, reason=why)
        said = {
            "not_ready": "no instance Ready",
            "ejected": "every instance ejected",
            "ended": "no instance can become Ready (Failed or Succeeded)",
            "unreachable": "its engine could not be reached (connection refused or reset)",
        }
        words = said.get(why, "at its concurrency limit")
        # the last 503 names them, each with why, as it names its own
        incoming.passed = (*incoming.passed, (model, self._passed_over(model, why, words)))
        self.fallback_events.note(self.table.pools.get(model, ()), model, to, why, words)
        if incoming.waiting is not None:  # its comments name what it waits for now
            incoming.waiting.follow(self.table.label(to), lambda: self.table.phases(to))
        with self.tracing.span("fallback", {"reconcile.from": model, "reconcile.to": to}):
            self.tracing.note({"reconcile.reason": why})
            return await self.serve(incoming, body, fields, (*tried, to), tuple(onward[1:]))

    def _passed_over(self, model: str, why: str, words: str) -> str:
        """Why ``model`` was passed over, for a chain's last answer: its phases and their
        reason, briefly, as the last model's own 503 says them (the models before it said
        only "no instance Ready": Pending for want of a GPU, or Starting, alike)."""
        if why == "not_ready":
            held = self.table.held(model)
            return f"{words}: {self.table.phases(model)}" + (f": {held}" if held else "")
        ended = self.table.ended(model) if why == "ended" else ()
        return f"no instance can become Ready: {_states(ended)}" if ended else words

    async def _forward(
        self, incoming: Incoming, body: bytes | Upload, want: Ask
    ) -> tuple[str, StreamResponse]:
        """The deployment that answered (or the pool's label) and its answer."""
        sleepers = self.table.on_demand(want.pool)  # a request for the pool wants them all
        turns = self.turns
        aged = False
        if sleepers and turns is not None:
            turns.learn(self.table.records)
            aged = await turns.enter(sleepers, lambda: bool(self.table.candidates(want.pool)))
        for name in sleepers:
            self.demand.begin(name)
        rewake = Rewake(self.demand, sleepers, self.table.parked_at) if sleepers else None
        try:
            for _ in range(CONNECT_RETRIES):
                if sleepers and not self.table.candidates(want.pool):
                    for name in sleepers:
                        problem = await self.demand.activate(name)
                        if problem is not None:  # nothing can wake it: say so now
                            why = (
                                f"deployment {want.label!r} cannot be started: its demand "
                                "could not be written (the gateway's log names the file)"
                            )
                            return want.label, error(503, why, "model_not_ready")
                with self.tracing.span("wait for Ready", {"reconcile.pool": want.pool}):
                    target = await self.waits.target(
                        want.pool, want.session, want.prefix, want.wait, rewake
                    )
                if target is None:
                    incoming.no_instance = True  # a fallback may take it (serve)
                    return want.label, self._not_ready(want, _lead(incoming.passed))
                try:
                    answer = await self._send_once_more(incoming, body, want, target)
                    return target.deployment, answer
                except TooLarge as exc:
                    # The client's upload outgrew --max-body: its 413. As the engine's
                    # failure (a 502), three in a row ejected a healthy engine for all.
                    refused = error(413, str(exc), "request_too_large")
                    refused.force_close()  # the rest of the body is not read
                    return target.deployment, refused
                except UpstreamDown as exc:
                    why = str(exc)
                    log.info("engine not reached", deployment=target.deployment, error=why)
                    self.table.mark_down(target)
                    # Why, should no instance come back before its wait ends (the marks
                    # these refusals made are their effect, not the reason): a CI run
                    # under load waited them out and said not_ready.
                    incoming.unreached = True
            # None of its engines took it: a fallback may (serve), and says why.
            incoming.no_instance = True
            why = f"deployment {want.label!r}: its engine could not be reached; retry later"
            why = _lead(incoming.passed) + why
            return want.label, error(503, why, "model_not_ready", retry_after=RETRY_AFTER)
        finally:
            for name in sleepers:
                self.demand.end(name)
            if sleepers and turns is not None:
                turns.leave(sleepers, aged)

    def _not_ready(self, want: Ask, lead: str) -> Response:
        """The 503 of a pool with no instance to take the request; ``lead`` names the
        models tried before it, the one asked for first (``_lead``)."""
        if self.table.closing is not None:  # retried at once: on the port's next gateway
            # A stop (SIGTERM) leaves no gateway after it: "the new gateway" was not so.
            after = (
                "the new gateway serves the port"
                if self.table.closing == HANDED_OVER
                else "once a gateway serves the port again (`reconcile gateway start`)"
            )
            why = (
                f"deployment {want.label!r} is not Ready ({self.table.phases(want.pool)}) "
                f"and this gateway process is stopping ({self.table.closing}); retry: {after}"
            )
            return error(503, why, "model_not_ready", retry_after=CLOSING_RETRY_AFTER)
        ejected = self.table.ejected(want.pool)
        if ejected is not None:
            why = (
                f"{lead}every instance of {want.label!r} is ejected after failing requests in "
                f"a row; the next trial in {max(1, round(ejected))}s"
            )
            return error(503, why, "model_not_ready", retry_after=ejected)
        ended = self.table.ended(want.pool)
        if ended:
            return _ended(want.label, ended, lead)
        zeroed = self.table.zeroed(want.pool)
        if zeroed:
            return _scaled_to_zero(want.label, zeroed, lead)
        drain = self.table.drained(want.pool)
        if drain is not None:
            return _drained(want.label, drain, lead)
        backing = self.table.backing_off(want.pool)
        if backing:
            return _backing_off(want.label, backing, lead)
        phase = self.table.phases(want.pool)
        held = self.table.held(want.pool)  # what keeps it from starting: the client's why
        if want.wait is not None:  # it has fallbacks, none left to try: a loop's end
            within = f"its fallbackAfter ({want.wait:g}s), and no fallback is left to try"
        else:
            waited = self.table.deadline(want.pool)  # the records': the daemon's deadline
            within = f"its readiness deadline ({waited:g}s)"
        why = (
            f"{lead}deployment {want.label!r} is not Ready ({phase}{': ' if held else ''}"
            f"{held}) within {within}; {self._next_move()}"
        )
        return error(503, why, "model_not_ready", retry_after=RETRY_AFTER)

    def _next_move(self) -> str:
        """A wait that ended with no daemon on the state dir was for nothing: the daemon
        starts engines and records them Ready (the gateway outlives it), so "retry later"
        alone sent a client round while the operator learnt nothing."""
        state_dir = self.demand.state_dir
        pid = daemonset.daemon_pid(state_dir)
        if pid is not None:
            # One stopped (SIGSTOP, a debugger, a frozen VM) holds its lock, and starts nothing.
            facts = procstat.stat(pid) if pid else None
            if facts is not None and facts.state in ("T", "t"):
                return (
                    f"the daemon (pid {pid}) on its state dir is stopped (SIGSTOP, a debugger): "
                    f"nothing starts it until the daemon runs again (kill -CONT {pid}), then retry"
                )
            return "retry later"
        return (
            f"no daemon runs on its state dir ({state_dir}) to start it or find it Ready: "
            "the operator starts the daemon, then retry"
        )

    async def _send_once_more(
        self, incoming: Incoming, body: bytes | Upload, want: Ask, target: Target
    ) -> StreamResponse:
        """Send; an engine that dropped the connection before any byte of its answer gets
        the request once more on the same instance, on a new connection: a kept-alive
        connection the engine closed just as it was reused (llama.cpp's server closes one
        after each streamed answer) is no reason to move a session off the instance that
        holds its cache, and a cold prefill elsewhere. Only when the instance fails again
        does the request go to another Ready instance of the pool, if there is one (one
        not reached at all is the caller's: UpstreamDown); else a 502."""
        try:
            return await self._send(incoming, body, want.pool, target)
        except UpstreamHung as exc:
            return await self._elsewhere(incoming, body, want, target, exc)
        except UpstreamFailed as exc:
            again = _may_resend(exc, body)
            log.info(
                "engine connection lost before its answer",
                deployment=target.deployment,
                instance=target.instance,
                error=str(exc),
                retried="same instance" if again else "no",
            )
            if not again:
                return _upstream_error(target.deployment, exc)
        try:
            with self.tracing.span("retry", {"reconcile.deployment": target.deployment}):
                return await self._send(incoming, body, want.pool, target, fresh=True)
        except UpstreamFailed as exc:
            other = self._other(want, target, exc, body)
            gone = other is None and await self._gone(target, exc, body)
            log.info(
                "engine connection lost again",
                deployment=target.deployment,
                instance=target.instance,
                error=str(exc),
                retried="another instance" if other else "when one is Ready" if gone else "no",
            )
            if gone:  # the caller holds it for a Ready instance, as for one not reached
                raise UpstreamDown(f"{exc}; then its port refused connections") from exc
            if other is None:
                return _upstream_error(target.deployment, exc)
        try:
            with self.tracing.span("retry", {"reconcile.deployment": other.deployment}):
                return await self._send(incoming, body, want.pool, other, fresh=True)
        except UpstreamFailed as exc:
            log.info(
                "engine connection lost again",
                deployment=other.deployment,
                instance=other.instance,
                error=str(exc),
            )
            return _failed(other.deployment, exc)

    def _other(
        self, want: Ask, target: Target, exc: UpstreamFailed, body: bytes | Upload
    ) -> Target | None:
        """Another instance of the pool for a request ``target`` did not answer, when the
        request may go again (``_may_resend``); the same session and prefix choose it."""
        if not _may_resend(exc, body):
            return None
        return self.table.target(
            want.pool, avoid=target.nonce, session=want.session, prefix=want.prefix
        )

    async def _gone(self, target: Target, exc: UpstreamFailed, body: bytes | Upload) -> bool:
        """The request may go again and ``target``'s engine no longer takes connections:
        it died (a SIGKILL: the pooled connection and the retry's fresh one reset as its
        process ended), so the request waits for a Ready instance (its restart, a roll's
        ``@next``) instead of a 502. An engine alive that resets requests keeps its 502."""
        if not _may_resend(exc, body):
            return False
        return not await self.upstream.reachable(target.host, target.port)

    async def _elsewhere(
        self, incoming: Incoming, body: bytes | Upload, want: Ask, target: Target, exc: UpstreamHung
    ) -> StreamResponse:
        """``target`` was judged hung with the request unanswered (hangs.py): another
        instance of the pool gets it, when there is one and the body can go again (not
        the same one: it is ejected); else its fallback, if it has one (``serve``, as for
        a pool all ejected); else a 504 saying so."""
        other = self._other(want, target, exc, body)
        # The pool's last instance ejected: its fallback takes the request (serve).
        incoming.no_instance = (
            other is None and _may_resend(exc, body) and self._falls_back(want.pool)
        )
        log.warning(
            "engine hung: its request sent elsewhere" if other else "engine hung",
            deployment=target.deployment,
            instance=target.instance,
            error=str(exc),
            retried=other.instance if other else "a fallback" if incoming.no_instance else "no",
        )
        if other is None:
            return _failed(target.deployment, exc)
        try:
            with self.tracing.span("retry", {"reconcile.deployment": other.deployment}):
                return await self._send(incoming, body, want.pool, other, fresh=True)
        except UpstreamFailed as again:
            log.info("engine failed the retry", deployment=other.deployment, error=str(again))
            return _failed(other.deployment, again)

    async def _send(
        self,
        incoming: Incoming,
        body: bytes | Upload,
        pool: str,
        target: Target,
        *,
        fresh: bool = False,
    ) -> StreamResponse:
        """Forward, counted per engine: a retiring instance is stopped only once it is 0,
        and the balancer sends the next request to the least loaded."""
        # No await between the table's answer and this count: retire() sees every request,
        # and concurrent requests see each other's.
        self.table.request_began(target.nonce)
        self.load.add(target.deployment, 1)
        self.metrics.begin(target.deployment, target.instance)
        incoming.meter.instance = target.instance
        incoming.meter.deployment = target.deployment
        trial = self.table.health.sent(target.nonce)
        outcome: int | str | None = None  # passive health (health.py); None: no verdict
        silent = False  # the client gave up before a byte of the engine's answer
        movable = _always if isinstance(body, bytes) else body.resendable
        awaited = self.hangs.sent(target, pool, movable)
        try:
            answer = await self._call(incoming, body, target, fresh, awaited)
            outcome = answer.status
            return answer
        except (UpstreamDown, UpstreamFailed) as exc:
            outcome = str(exc) or type(exc).__name__
            raise
        except asyncio.CancelledError:
            if awaited.hung is not None and _cancel_was_ours():
                outcome = awaited.hung
                raise UpstreamHung(awaited.hung) from None
            silent = incoming.meter.first is None
            raise
        finally:
            self.hangs.answered(awaited)
            if silent:
                self._judge_silence(target, trial)
            else:
                self.table.health.report(target, trial, outcome)
            self.metrics.end(target.deployment, target.instance)
            self.load.add(target.deployment, -1)
            self.table.request_ended(target.nonce)

    async def _call(
        self,
        incoming: Incoming,
        body: bytes | Upload,
        target: Target,
        fresh: bool,
        awaited: Awaited,
    ) -> StreamResponse:
        """One call to an engine; with traces on, in a span whose context the engine gets
        as ``traceparent`` (tracing.py)."""
        settle = _headed(self.hangs, awaited, incoming.waiting)
        args = (self.upstream, incoming.request, body, target, incoming.path, incoming.query)
        strip = self.strip_keys
        if not self.tracing.enabled:
            return await forward(
                *args, incoming.meter, strip_keys=strip, settle=settle, fresh=fresh
            )
        attrs = {"reconcile.deployment": target.deployment, "reconcile.instance": target.instance}
        # The peer as OpenTelemetry's HTTP client spans name it: what a backend draws an
        # engine that does not trace itself by (a service graph's node, its address)
        peer: dict[str, str | int] = {"server.address": target.host, "server.port": target.port}
        peer["http.request.method"] = incoming.request.method
        with self.tracing.span("engine", {**attrs, **peer}, client=True):
            answer = await forward(
                *args,
                incoming.meter,
                strip_keys=strip,
                settle=settle,
                inject=self.tracing.inject,
                fresh=fresh,
            )
            status = answer.status
            self.tracing.note({"http.response.status_code": status}, failed=status >= 500)
            return answer

    def _judge_silence(self, target: Target, trial: bool) -> None:
        """A client gave up on an engine that had sent nothing: an upstream timeout for
        passive health when the engine answers no other request either (hung), no verdict
        when it does (a slow answer). One look per engine at a time."""
        health = self.table.health
        if target.nonce in self._judging:
            health.report(target, trial, None)
            return
        rec = next((r for r in self.table.records.values() if r.nonce == target.nonce), None)

        async def judge() -> None:
            why = None
            try:
                why = await readiness.silent(target.host, target.port, rec)
            finally:
                self._judging.pop(target.nonce, None)
                health.report(target, trial, why)

        self._judging[target.nonce] = asyncio.get_running_loop().create_task(judge())


@dataclass(slots=True)  # not frozen: a frozen dataclass's init cost ten times as much
class Ask:
    """What a request asks for: a pool (its routable name), the label limits and metrics
    count it under, its session key (affinity), if any, and its prompt's chained block
    hashes (prefix affinity)."""

    pool: str
    label: str
    session: str | None
    prefix: tuple[bytes, ...] = ()
    wait: float | None = None  # the longest wait for a Ready instance (fallbackAfter)


@dataclass
class Incoming:
    """A request to forward and the one path (normalised) and query it goes on with."""

    request: Request
    path: str
    query: str
    meter: Meter  # its timings and token counts (usage.py)
    mark: bytes | None = None  # a multipart upload's boundary (bodies.py)
    waiting: Waiting | None = None  # a held stream's comments (waiting.py)
    no_instance: bool = False  # the pool had no instance to take it (a fallback may)
    unreached: bool = False  # ... because its engines refused or reset each connection
    passed: tuple[tuple[str, str], ...] = ()  # (model, why) of each it fell back from


class UpstreamHung(UpstreamFailed):
    """The engine was judged hung before its answer's head (hangs.py): nothing came back,
    so the request may go to another instance."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retry=True)


def _cancel_was_ours() -> bool:
    """The task's cancellation was the hang watch's alone (not its client's going away
    too): taken back, so the request goes on elsewhere."""
    task = asyncio.current_task()
    return task is not None and task.uncancel() == 0


def _headed(
    hangs: Hangs, awaited: Awaited, waiting: Waiting | None
) -> Callable[[], Awaitable[StreamResponse | None]]:
    """``forward``'s ``settle``: the head came (no longer watched for a hang), then the
    waiting comments stop, if any (waiting.py)."""

    async def settle() -> StreamResponse | None:
        hangs.answered(awaited)
        return await waiting.settle() if waiting is not None else None

    return settle


def _always() -> bool:
    return True


def _may_resend(exc: UpstreamFailed, body: bytes | Upload) -> bool:
    """Nothing of the answer came, and the body can be sent again (a streamed upload the
    engine has begun to read cannot)."""
    return exc.retry and not (isinstance(body, Upload) and body.started)


def _lead(passed: tuple[tuple[str, str], ...]) -> str:
    """The beginning of a 503 (or a 429) after fallbacks: the model asked for, then each
    fallback tried, and why each could not take the request; the last one's reason follows."""
    if not passed:
        return ""
    return "tried " + ", then ".join(f"{m!r} ({why})" for m, why in passed) + ", then: "


def _ended(label: str, records: tuple[Record, ...], lead: str = "") -> Response:
    """The 503 of a pool none of whose engines can become Ready by itself: at once, no
    Retry-After (a retry waits for a person), its phases and why, and what to do."""
    names = " ".join(dict.fromkeys(base_name(rec.name) for rec in records))
    why = (
        f"{lead}deployment {label!r} cannot become Ready by itself ({_states(records)}); "
        f"fix its manifest, or start it again with `reconcile restart {names}`"
    )
    return error(503, why, "model_not_ready", final=True)


def _scaled_to_zero(label: str, records: tuple[Record, ...], lead: str = "") -> Response:
    """The 503 of a pool its manifests scale to 0 (``spec.replicas: 0``): at once and
    final, as Kubernetes refuses a Service with no endpoints. It waited out the readiness
    deadline (600 s by default) for an engine nothing was going to start."""
    names = ", ".join(dict.fromkeys(base_name(rec.name) for rec in records))
    why = (
        f"{lead}deployment {label!r} is scaled to 0 by its manifest ({names}: "
        "spec.replicas: 0): nothing runs it; raise spec.replicas, or use autoscale with min: 0 "
        "to start it on a request"
    )
    return error(503, why, "model_not_ready", final=True)


def _backing_off(label: str, records: tuple[Record, ...], lead: str = "") -> Response:
    """The 503 of a pool none of whose engines runs, each waiting out its back-off after
    it exited (a crash loop): at once, as Kubernetes refuses a Service with no ready
    endpoint, with how each exited and ``Retry-After`` at the first restart. Held to the
    readiness deadline (600 s), its client waited ten minutes for an engine that kept dying."""
    now = datetime.now(UTC)
    restarts = [r.backoff_until for r in records if r.phase is Phase.BACKOFF and r.backoff_until]
    # A wall clock stepped back is no hour's wait: a back-off is never longer than its max.
    left = min(BACKOFF_MAX, max(0.0, (min(restarts) - now).total_seconds()))
    names = " ".join(dict.fromkeys(base_name(rec.name) for rec in records))
    why = (
        f"{lead}deployment {label!r} has no engine running: it exited and waits to be "
        f"restarted ({_states(records)}); retry in {max(1, math.ceil(left))}s, and see why "
        f"it exits with `reconcile logs {names}`"
    )
    return error(503, why, "model_not_ready", retry_after=max(1.0, math.ceil(left)))


def _states(records: tuple[Record, ...]) -> str:
    """Each instance's phase and why (its record's message, as true now: a back-off's
    countdown), once each."""
    now = datetime.now(UTC)
    return "; ".join(
        dict.fromkeys(
            f"{rec.name} {rec.phase.value}" + (f": {text}" if (text := rec.message_at(now)) else "")
            for rec in records
        )
    )


def _drained(label: str, drain: Drain, lead: str = "") -> Response:
    """The 503 of a pool the node's drain keeps from starting: at once (it waited out its
    readiness deadline for nothing), retried when the drain ends, a minute at most (an
    uncordon may end it sooner)."""
    now, clock = datetime.now(UTC), bootclock.read()
    why = f"{lead}deployment {label!r} cannot start now: {drain.said(now, clock)}"
    wait = min(drain.remaining(now, clock), DRAIN_RETRY_AFTER)
    return error(503, why, "model_not_ready", retry_after=wait)


def _failed(name: str, exc: UpstreamFailed) -> Response:
    """The error answer of a request that failed on ``name``'s engine."""
    if isinstance(exc, UpstreamHung):
        why = f"the engine of {name!r} is hung ({exc}); retry later"
        return error(504, why, "upstream_timeout", retry_after=RETRY_AFTER)
    return _upstream_error(name, exc)


def _upstream_error(name: str, exc: UpstreamFailed) -> Response:
    """A 502 that says what the engine did, in upstream.py's words: every failure was
    "closed the connection before answering", an answer that is no HTTP (a head of
    100 KB, bytes of another protocol) or one cut short too, which sent its operator to
    look for a crash."""
    why = (
        f"the engine of {name!r} gave no answer to pass on ({exc}); retry later, and if "
        f"it recurs, `reconcile logs {name}` may say why"
    )
    return error(502, why, "upstream_error")


def _prefix(fields: dict[str, Any]) -> tuple[bytes, ...]:
    """The prompt's chained block hashes, for a pool that routes by prefix (prefix.py)."""
    text = prompt_text(fields)
    return chain(text) if text else ()


def _session(request: Request, fields: dict[str, Any]) -> str | None:
    """The session key: the ``x-session-id`` header, else the OpenAI ``user`` field."""
    header = request.headers.get(SESSION_HEADER)
    if header:
        return header[:SESSION_MAX]
    user = fields.get("user")
    return user[:SESSION_MAX] if isinstance(user, str) and user else None
