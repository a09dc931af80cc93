"""Records + liveness by (pid, start time) + marker scan + probes (readiness, and the
liveness answers of Ready engines) -> one ``Observed``."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Literal

from controller.backends.base import Backend
from controller.core.manifest import backendnames
from controller.core.state import (
    ACTOR_GONE,
    OOM_KILLED,
    RUN_UNSAID,
    Drain,
    ExitInfo,
    MarkedProcess,
    Observed,
    Phase,
    ProbeResult,
    ProcessRef,
    Record,
    RecordView,
)
from controller.host import bootclock, ports
from controller.host.probes import ProbeTarget, probe_many
from controller.host.procs import age, identity, process_alive
from controller.reconciler.liveness import LivenessProber
from controller.reconciler.probekeys import Keys, no_keys
from controller.redact import redact_args
from controller.store.instances.records import Snapshot, held_by_unreadable


def port_holders(asked: Iterable[int], listening: frozenset[int]) -> dict[int, str]:
    """Each of ``asked`` (the manifests' own ports) that some process listens on -> that
    process in words, "pid 123 (python3 -m http.server 8080)", where this node can see it
    (another user's is not ours to read): a Pending that cannot have its port then says
    what to stop. A container's published port names the container, as its runtime says
    ("podman container web"), not the runtime's proxy that holds it. Looked up only for
    those ports, as each costs a /proc scan (and a proxy's, a runtime call)."""
    out: dict[int, str] = {}
    for port in sorted(set(asked) & listening):
        found = ports.listener_commands(port)
        if found:
            out[port] = _holder(port, *found[0])
    return out


def _holder(port: int, pid: int, argv: list[str]) -> str:
    from controller.host.containers import publisher  # a held port's: quiet passes skip it

    container = publisher(port, argv[0]) if argv else None
    if container is not None:  # the runtime's proxy holds it: the container is what to stop
        return f"{container} (published by pid {pid}, {os.path.basename(argv[0])})"
    command = " ".join(redact_args(argv))[:160] or "command unknown"
    return f"pid {pid} ({command})"


def observe(
    snapshot: Snapshot,
    backend: Backend,
    *,
    drain: Drain | None = None,
    probe: bool = True,
    node: str | None = None,
    liveness: LivenessProber | None = None,
    keys: Keys = no_keys,
) -> Observed:
    """``liveness``: the prober whose answers this observation takes (None: no liveness);
    ``keys``: the API key each record's probes present (probekeys.py)."""
    backend.refresh(snapshot.records.values())  # one batched look (a cluster: one round trip)
    markers = backend.scan()
    by_nonce: dict[str, list[MarkedProcess]] = {}
    for marked in markers:  # indexed once: a per-record filter of every marker is N^2
        by_nonce.setdefault(marked.nonce, []).append(marked)
    views = {
        # Another node's record is never judged by a local pid, marker or probe.
        name: RecordView(record=rec) if rec.elsewhere(node) else _view(rec, backend, by_nonce)
        for name, rec in snapshot.records.items()
    }
    if probe:
        results = probe_many(_targets(views.values(), keys))
        local = backend.name == backendnames.LOCAL
        for name, result in results.items():
            views[name] = _with_probe(views[name], _owned(views[name], result, local))
    if liveness is not None:
        for name, answers in liveness.take(views, keys).items():
            views[name] = dataclasses.replace(views[name], liveness=answers)
    nonces = {rec.nonce for rec in snapshot.records.values() if rec.nonce}
    nonces |= {p.nonce for p in snapshot.problems if p.nonce}  # unknown version: not ours to reap
    foreign_devices, foreign_ports = held_by_unreadable(snapshot.problems)
    own_ports = {  # a port bound now while its record's engine is dead is someone else's
        p
        for v in views.values()
        if v.record.port
        and not v.record.elsewhere(node)
        and (v.alive or v.markers or v.record.phase is Phase.RESERVED or v.remains)
        for p in v.record.ports
    }
    return Observed(
        records=views,
        foreign_devices=foreign_devices,
        foreign_ports=foreign_ports,
        orphans=tuple(m for m in markers if m.nonce not in nonces),
        listening=backend.listening_ports() - own_ports,
        drain=drain,
        boot=bootclock.read(),  # last: the plan's `now` is taken right after
        node=node,
        unreadable=frozenset(p.name for p in snapshot.problems if p.name and p.kept),
    )


# Where a dead engine's cgroup may still hold a member: a teardown (Fail's, a stop's)
# has not run yet. Asked of no other record, so a pass over many ended ones costs nothing.
LIVED = (Phase.STARTING, Phase.READY, Phase.TERMINATING)


def _view(rec: Record, backend: Backend, by_nonce: dict[str, list[MarkedProcess]]) -> RecordView:
    alive = backend.alive(rec.ref)
    exit_info = None
    if rec.ref is not None and not alive:
        status = backend.exit_of(rec.ref)
        now = datetime.now(UTC)
        if status is not None:
            oom = OOM_KILLED if status.oom_killed else ""
            exit_info = ExitInfo(code=status.code, signal=status.signal, at=now, reason=oom)
        elif rec.phase in (Phase.STARTING, Phase.READY):
            # A cron pass is not the engine's parent: the code is lost, the exit is not. A
            # cluster's engine ends with its actor (one that crashed, its actor restarts).
            why = ACTOR_GONE if rec.on_cluster else "not our child: exit code unknown"
            if rec.container is not None and not rec.on_cluster:
                why = RUN_UNSAID  # never our child: its `run` was killed, or its runtime failed
            exit_info = ExitInfo(at=now, reason=why)
    maker = _maker(rec.reserved_by) if rec.ref is None else "gone"  # a local process
    return RecordView(
        record=rec,
        alive=alive,
        maker_alive=maker == "elsewhere",
        maker_here=maker == "here",
        exit=exit_info,
        markers=tuple(by_nonce.get(rec.nonce, ())) if rec.nonce else (),
        remains=not alive and rec.phase in LIVED and backend.remains(rec),
        instance=backend.instance_of(rec) if alive else None,
        age=age(rec.ref) if alive else None,
    )


def _maker(maker: ProcessRef | None) -> Literal["gone", "here", "elsewhere"]:
    """Where a reservation's maker (a local process) is: gone, this process, or another
    live one. A pass observes with no reservation of its own process in flight (each
    round's spawns end before the next looks), so one this process made is a leftover of
    a pass that failed between the reservation and the engine's record (ENOSPC on the
    state dir): resolved as a dead maker's, or a daemon, alive, would leave it Reserved
    for its whole life (invariant 3)."""
    if maker is None or not process_alive(maker):
        return "gone"
    return "here" if maker.pid == os.getpid() else "elsewhere"


def _targets(views: Iterable[RecordView], keys: Keys) -> dict[str, ProbeTarget]:
    targets = {}
    for view in views:
        rec = view.record
        if view.alive and rec.phase is Phase.STARTING and rec.port is not None:
            targets[rec.name] = ProbeTarget(rec.host, rec.port, rec.probe, keys(rec))
    return targets


def _owned(view: RecordView, result: ProbeResult, local: bool) -> ProbeResult:
    """A probe that passed on a port whose listener is held only by processes older than
    the engine, none of its instance, reached one of them, not the engine (which lost
    its port to it and dies of "address in use"): not Ready. A holder younger than the
    engine may be its doing (a `docker run -p`'s proxy): it counts. Asked of a local
    process engine only: a container's port is its runtime's, a cluster's engine runs
    on another host."""
    rec = view.record
    if not (result.ready and local and rec.container is None and rec.ref and rec.port):
        return result
    ours = {m.ref.pid for m in view.markers} | {rec.ref.pid}
    others = ports.foreign_holders(rec.port, ours)
    if not others or not all(_older(pid, rec.ref) for pid in others):
        return result
    pids = ", ".join(str(pid) for pid in others)
    return ProbeResult(
        False,
        f"{result.detail}, but its listener is another process's (pid {pids}), not this "
        f"engine's: the engine does not serve port {rec.port} (its log says why)",
    )


def _older(pid: int, engine: ProcessRef) -> bool:
    """``pid`` runs and started before ``engine``: nothing the engine started."""
    ref = identity(pid)
    if ref is None:
        return False
    if ref.start_ticks is not None and engine.start_ticks is not None:
        return ref.start_ticks < engine.start_ticks
    return ref.start_time < engine.start_time


def _with_probe(view: RecordView, result: ProbeResult) -> RecordView:
    return dataclasses.replace(view, probe=result)
