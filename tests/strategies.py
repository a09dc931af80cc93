"""Builders and Hypothesis strategies for the pure core: specs, records, inventories.

The builders (``entry``, ``record``, ``view``, ``observed``) make planner inputs in
one line; the strategies (``scenarios``) make random but coherent ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import strategies as st

from controller.core.devices.inventory import KINDS, Device, Inventory
from controller.core.manifest.names import base_name, next_name, replica_name
from controller.core.manifest.specs import (
    Deployment,
    Entry,
    routable_names,
    spec_document,
    spec_hash,
)
from controller.core.plan import Desired
from controller.core.render import deadline_of
from controller.core.state import (
    MarkedProcess,
    Observed,
    Phase,
    ProbeResult,
    ProcessRef,
    Record,
    RecordView,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
OWNER = "/srv/manifests"
OTHER = "/srv/other-manifests"
SOURCE = "/srv/manifests/models.yaml"
NODE = "gpu-a"


# -- builders --------------------------------------------------------------------------


def inventory(*keys: str) -> Inventory:
    devices = []
    for key in keys:
        kind, _, ident = key.partition(":")
        devices.append(Device(kind=kind, id=ident))
    return Inventory(tuple(devices), source="static")


def spec_body(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"engine": "command", "command": ["serve", "{port}"]}
    body.update(spec)
    return body


def deployment(name: str, **spec: Any) -> Deployment:
    doc = {
        "apiVersion": "reconcile/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": spec_body(**spec),
    }
    return Deployment.model_validate(doc)


def entry(name: str, *, source: str = SOURCE, **spec: Any) -> Entry:
    dep = deployment(name, **spec)
    return Entry(dep, source, 1, spec_hash(dep.spec))


def ref(pid: int, start: float = 1000.0) -> ProcessRef:
    return ProcessRef(pid=pid, start_time=start)


def record(
    name: str,
    *,
    owner: str = OWNER,
    spec: Entry | None = None,
    phase: Phase = Phase.READY,
    **fields: Any,
) -> Record:
    """A record of ``spec`` (default: ``entry(name)``), its hash and document included."""
    e = spec or entry(name)
    values: dict[str, Any] = {
        "name": name,
        "owner": owner,
        "source": e.source,
        "spec_hash": e.hash,
        "stored_spec": spec_document(e.deployment.spec),
        "activation": e.deployment.spec.activation,
        "idle_timeout": e.deployment.spec.idle_timeout,
        "ready_deadline_seconds": deadline_of(e.deployment.spec),
        "models": routable_names(name, e.deployment.spec),
        "device_count": e.deployment.spec.devices.count,
        "node": NODE,
        "engine": e.deployment.spec.engine,
        "nonce": f"nonce-{name}",
        "phase": phase,
        "shareable": e.deployment.spec.devices.shareable,
        "restart_policy": e.deployment.spec.restart_policy,
    }
    if phase.holds_resources:
        values.setdefault("port", 8000)
        values["ref"] = None if phase is Phase.RESERVED else ref(100)
        values["reserved_by"] = ref(50)
        values["started_at"] = NOW - timedelta(seconds=60)
    values.update(fields)
    return Record(**values)


def view(rec: Record, **fields: Any) -> RecordView:
    return RecordView(record=rec, **fields)


def marked(pid: int, name: str, nonce: str, ppid: int = 1, start: float = 2000.0) -> MarkedProcess:
    return MarkedProcess(ref(pid, start), name, nonce, ppid)


def observed(*views: RecordView, **fields: Any) -> Observed:
    return Observed(records={v.record.name: v for v in views}, **fields)


def desired(*entries: Entry, owner: str = OWNER, **fields: Any) -> Desired:
    return Desired(owner=owner, entries={e.name: e for e in entries}, **fields)


def probe(ready: bool, detail: str = "GET /health -> 2xx") -> ProbeResult:
    return ProbeResult(ready, detail if ready else "GET /health -> 503")


# -- strategies ------------------------------------------------------------------------

names = st.sampled_from([f"m{i}" for i in range(8)])
owners = st.sampled_from([OWNER, OTHER])
ports = st.integers(min_value=8000, max_value=8012)


@st.composite
def inventories(draw: st.DrawFn) -> Inventory:
    keys = draw(
        st.lists(
            st.tuples(st.sampled_from(KINDS), st.sampled_from("0123")).map(":".join),
            unique=True,
            max_size=6,
        )
    )
    return inventory(*keys)


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    """A spec body (the manifest's camelCase keys)."""
    body: dict[str, Any] = {
        "devices": {
            "count": draw(st.integers(0, 3)),
            "kind": draw(st.sampled_from([*KINDS, "any"])),
            "shareable": draw(st.booleans()),
        }
    }
    if draw(st.booleans()):
        body["devices"]["candidates"] = draw(
            st.lists(st.sampled_from("0123"), unique=True, min_size=1, max_size=3)
        )
    port_kind = draw(st.sampled_from(["exact", "base", "none"]))
    if port_kind == "exact":
        body["port"] = draw(ports)
    elif port_kind == "base":
        body["basePort"] = draw(ports)
    body["restartPolicy"] = draw(st.sampled_from(["Always", "OnFailure", "Never"]))
    if draw(st.booleans()):
        body["args"] = [draw(st.sampled_from(["--a", "--b"]))]
    return body


@st.composite
def records(draw: st.DrawFn, name: str, inv: Inventory) -> RecordView:
    """A view of a random record named ``name``, holding devices of ``inv`` (or others)."""
    owner = draw(owners)
    e = entry(base_name(name), **draw(specs()))  # a replica's record states its deployment
    phase = draw(st.sampled_from(list(Phase)))
    keys = [d.key for d in inv.devices] + ["nvidia:9"]
    fields: dict[str, Any] = {}
    # A BackOff may have given its lease back (its image's pull failed): it holds nothing.
    unleased = phase is Phase.BACKOFF and draw(st.booleans())
    if phase.holds_resources and not unleased:
        fields["devices"] = tuple(draw(st.lists(st.sampled_from(keys), unique=True, max_size=3)))
        fields["port"] = draw(ports)
        fields["shareable"] = draw(st.booleans())
    else:
        fields["port"] = None
    fields["restarts"] = draw(st.integers(0, 9))
    if phase is Phase.BACKOFF:
        fields["backoff_until"] = NOW + timedelta(seconds=draw(st.integers(-30, 30)))
    rec = record(name, owner=owner, spec=e, phase=phase, **fields)
    markers = ()
    if draw(st.booleans()):
        markers = (marked(300 + len(name), name, rec.nonce or "x"),)
    return view(
        rec,
        alive=draw(st.booleans()),
        maker_alive=draw(st.booleans()),
        markers=markers,
        probe=draw(st.none() | st.builds(probe, st.booleans())),
    )


@dataclass(frozen=True)
class Scenario:
    desired: Desired
    observed: Observed
    inventory: Inventory

    def holders(self) -> Iterable[tuple[str, Record]]:
        return ((n, v.record) for n, v in self.observed.records.items())


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    inv = draw(inventories())
    declared = draw(st.lists(names, unique=True, max_size=6))
    with_records = draw(st.lists(names, unique=True, max_size=6))
    entries = [entry(n, **draw(specs())) for n in declared]
    views = [draw(records(n, inv)) for n in with_records]
    listening = frozenset(draw(st.lists(ports, max_size=3)))
    want = desired(
        *entries,
        prune=draw(st.booleans()),
        invalid={n: "bad" for n in draw(st.lists(names, max_size=2)) if n not in declared},
    )
    orphans = tuple(
        marked(900 + i, n, f"orphan-{i}") for i, n in enumerate(draw(st.lists(names, max_size=2)))
    )
    return Scenario(want, observed(*views, listening=listening, orphans=orphans), inv)


# -- replicas ----------------------------------------------------------------------------


@st.composite
def replicated_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A spec body with ``replicas`` (0-3), sometimes rolling with maxSurge/maxUnavailable."""
    body = draw(specs())
    body.pop("port", None)  # an exact port holds one engine: replicas need basePort
    body["replicas"] = draw(st.integers(0, 3))
    if draw(st.booleans()):
        body["strategy"] = "RollingUpdate"
        surge, unavailable = draw(
            st.sampled_from([(1, 0), (0, 1), (2, 0), ("50%", "50%"), (0, "34%")])
        )
        body["rollingUpdate"] = {"maxSurge": surge, "maxUnavailable": unavailable}
    return body


@st.composite
def replica_records(draw: st.DrawFn, name: str) -> list[str]:
    """Record names of deployment ``name``: some of its replicas (some beyond its count),
    some with a rolling ``@next``."""
    indexes = draw(st.lists(st.integers(0, 4), unique=True, max_size=4))
    out = [replica_name(name, i) for i in indexes]
    return out + [next_name(n) for n in out if draw(st.booleans())]


@st.composite
def replicated_scenarios(draw: st.DrawFn) -> Scenario:
    """Replicated deployments, their replicas' records (random phases, holders, specs)."""
    inv = draw(inventories())
    declared = draw(st.lists(st.sampled_from(["r0", "r1", "r2"]), unique=True, max_size=3))
    entries = [entry(n, **draw(replicated_specs())) for n in declared]
    named = [r for n in ["r0", "r1", "r2"] for r in draw(replica_records(n))]
    views = [draw(records(n, inv)) for n in named]
    listening = frozenset(draw(st.lists(ports, max_size=2)))
    counts = {n: draw(st.integers(0, 3)) for n in declared if draw(st.booleans())}
    want = desired(*entries, prune=draw(st.booleans()), replicas=counts)
    return Scenario(want, observed(*views, listening=listening), inv)


# -- memory and priority -------------------------------------------------------------------

GI = 1 << 30
SIZES = [8 * GI, 16 * GI, 20 * GI, 40 * GI, 80 * GI]


@st.composite
def memory_inventories(draw: st.DrawFn) -> Inventory:
    """1-4 NVIDIA devices, some of unknown memory."""
    sizes = draw(
        st.lists(st.sampled_from([None, 24 * GI, 40 * GI, 80 * GI]), min_size=1, max_size=4)
    )
    devices = tuple(Device(kind="nvidia", id=str(i), memory=m) for i, m in enumerate(sizes))
    return Inventory(devices, source="static")


@st.composite
def memory_specs(draw: st.DrawFn) -> dict[str, Any]:
    devices: dict[str, Any] = {"count": draw(st.integers(1, 2)), "kind": "nvidia"}
    if draw(st.integers(0, 3)):  # mostly memory requests, some whole or unified leases
        devices["memory"] = draw(st.sampled_from(SIZES))
    else:
        devices["shareable"] = draw(st.booleans())
    return {"devices": devices, "priority": draw(st.integers(-1, 2))}


@st.composite
def memory_scenarios(draw: st.DrawFn) -> Scenario:
    """Our deployments, some running where a random earlier plan put them."""
    inv = draw(memory_inventories())
    declared = draw(st.lists(names, unique=True, min_size=1, max_size=6))
    entries = [entry(n, **draw(memory_specs())) for n in declared]
    keys = [d.key for d in inv.devices]
    views = []
    for e in entries:
        if not draw(st.booleans()):
            continue  # new: no record yet
        want = e.deployment.spec.devices
        held = draw(st.lists(st.sampled_from(keys), unique=True, min_size=1, max_size=want.count))
        rec = record(
            e.name,
            spec=e,
            phase=draw(st.sampled_from([Phase.READY, Phase.STARTING, Phase.BACKOFF])),
            devices=tuple(held),
            memory=want.memory,
            priority=e.deployment.spec.priority,
            started_at=NOW - timedelta(seconds=draw(st.integers(1, 999))),
            port=9000 + len(views),
        )
        views.append(view(rec, alive=True))
    return Scenario(desired(*entries), observed(*views), inv)
