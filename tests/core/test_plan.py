"""The planner, table-driven: one case per action and reason, plus its properties.

Each case is (desired, observed, inventory) -> the exact (action, name) list, and a
phrase each reason must contain. ``plan`` is pure: no process or file is involved.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from strategies import (
    NOW,
    OTHER,
    Scenario,
    desired,
    entry,
    inventory,
    marked,
    observed,
    probe,
    record,
    ref,
    replicated_scenarios,
    scenarios,
    view,
)

from controller.backends.local.runtime import LocalBackend
from controller.core.actions import (
    Action,
    Adopt,
    Conflict,
    Fail,
    Hold,
    HoldChange,
    HoldRestart,
    MarkReady,
    MarkSpec,
    Preempt,
    Probed,
    Reap,
    Reject,
    Release,
    Replace,
    Restart,
    Start,
    Stop,
    Update,
)
from controller.core.devices.inventory import Inventory
from controller.core.manifest.names import base_name
from controller.core.manifest.specs import Entry, spec_document, with_secrets
from controller.core.plan import BACKOFF_RESET, Desired, backoff, plan
from controller.core.state import (
    RESTART_DUE,
    Drain,
    ExitInfo,
    Observed,
    Phase,
    ProbeResult,
    backoff_cause,
)
from controller.reconciler.executor import Executor
from controller.reconciler.leases import RecordMaker
from controller.store.instances.events import Journal
from controller.store.instances.records import RecordStore

GPUS = inventory("nvidia:0", "nvidia:1")
GPU_A = entry("a", devices={"count": 1, "kind": "nvidia"})
GPU1 = {"devices": {"count": 1, "kind": "nvidia"}}
DRAIN = Drain(until=NOW + timedelta(hours=1), reason="kernel update", by="ops")
DRAINED = (
    "node drained by ops until 2026-01-01 13:00:00 UTC (kernel update): "
    "run `reconcile uncordon` or wait"
)
HELD_ARGS = f"spec.args changed: held: {DRAINED}"


@dataclass(frozen=True)
class Case:
    want: Desired
    seen: Observed = field(default_factory=Observed)
    expect: tuple[tuple[type[Action], str, str], ...] = ()  # (type, name, reason phrase)
    inv: Inventory = GPUS


def run(case: Case) -> list[Action]:
    return plan(case.want, case.seen, case.inv, NOW)


def exited(code: int | None = None, sig: int | None = None) -> ExitInfo:
    return ExitInfo(code=code, signal=sig, at=NOW)


def secret_entry(digest: str, **spec: Any) -> Entry:
    """Deployment a with a file in envFrom whose values have ``digest`` (the edge's hash)."""
    plain = entry("a", envFrom=[{"file": "/etc/reconcile/a.env"}], **spec)
    return replace(plain, secret_digest=digest, hash=with_secrets(plain.hash, digest))


a_gpu = entry("a", **GPU1)
b_gpu = entry("b", **GPU1)
c_gpu = entry("c", **GPU1)
starting = dict(phase=Phase.STARTING, ready_deadline_at=NOW + timedelta(seconds=30))

# One change of each field that a running engine never sees (the planner's in-place set).
IN_PLACE_CHANGES: dict[str, dict[str, Any]] = {
    "readiness": {"readiness": {"tcpSocket": {}, "deadlineSeconds": 77}},
    "restartPolicy": {"restartPolicy": "OnFailure"},
    "stopGracePeriodSeconds": {"stopGracePeriodSeconds": 7},
}

# The spec document a reconcile of 2026-12-01 stored: the fields added since are absent.
OLDER_DOCUMENT = {
    k: v
    for k, v in spec_document(entry("a").deployment.spec).items()
    if k not in ("affinity", "fallbackAfter", "fallbacks")
}

CASES = [
    # -- Start and Hold --------------------------------------------------------------
    pytest.param(
        Case(desired(entry("a")), expect=((Start, "a", "new deployment: no devices, port 8000"),)),
        id="start-new-deployment",
    ),
    pytest.param(
        Case(desired(a_gpu), expect=((Start, "a", "new deployment: nvidia:0, port 8000"),)),
        id="start-takes-first-free-gpu",
    ),
    pytest.param(
        Case(
            desired(a_gpu),
            observed(view(record("a", spec=a_gpu, phase=Phase.PENDING, message="no capacity"))),
            expect=((Start, "a", "retrying placement"),),
        ),
        id="start-retries-pending",
    ),
    pytest.param(
        Case(
            desired(a_gpu, b_gpu, c_gpu),
            expect=(
                (Start, "a", "nvidia:0"),
                (Start, "b", "nvidia:1"),
                (Hold, "c", "no capacity: needs 1 nvidia device, 0 free — held by a [nvidia:0]; "),
            ),
        ),
        id="hold-no-capacity-names-holders-in-this-plan",
    ),
    pytest.param(
        Case(
            desired(a_gpu, b_gpu, c_gpu),
            observed(
                view(record("a", spec=a_gpu, devices=("nvidia:0",)), alive=True),
                view(record("b", spec=b_gpu, devices=("nvidia:1",), port=8001), alive=True),
            ),
            expect=((Hold, "c", "held by a [nvidia:0]; b [nvidia:1]: remove a manifest"),),
        ),
        id="hold-no-capacity-names-existing-holders",
    ),
    pytest.param(
        Case(
            desired(entry("a", devices={"count": 3})),
            expect=((Hold, "a", "needs 3 devices, 2 free"),),
        ),
        id="hold-asks-more-than-the-node-has",
    ),
    pytest.param(
        Case(
            desired(a_gpu),
            inv=inventory(),
            expect=((Hold, "a", "the node has none: check --devices"),),
        ),
        id="hold-node-without-devices",
    ),
    pytest.param(
        Case(
            desired(entry("a", port=8000), entry("b", port=8000)),
            expect=((Start, "a", "port 8000"), (Hold, "b", "port 8000 is held by deployment a")),
        ),
        id="hold-exact-port-held-by-deployment",
    ),
    pytest.param(
        Case(
            desired(entry("a", port=8000)),
            observed(listening=frozenset({8000})),
            expect=((Hold, "a", "port 8000 is in use by another process: free it"),),
        ),
        id="hold-exact-port-foreign-listener",
    ),
    pytest.param(
        Case(
            desired(entry("a", basePort=8000)),
            observed(listening=frozenset({8000, 8001})),
            expect=((Start, "a", "port 8002"),),
        ),
        id="start-base-port-skips-foreign-listeners",
    ),
    pytest.param(
        Case(
            desired(entry("a", devices={"count": 1, "candidates": ["1"]})),
            expect=((Start, "a", "nvidia:1"),),
        ),
        id="start-honours-candidates",
    ),
    pytest.param(
        Case(
            desired(entry("a", devices={"count": 1, "candidates": ["7"]})),
            expect=((Hold, "a", "among candidates [7]"),),
        ),
        id="hold-no-candidate-exists",
    ),
    pytest.param(
        Case(
            desired(entry("a", devices={"count": 1, "kind": "amd"})),
            inv=inventory("nvidia:0", "amd:0"),
            expect=((Start, "a", "amd:0"),),
        ),
        id="start-kind-amd",
    ),
    pytest.param(
        Case(
            desired(entry("a", devices={"count": 1, "shareable": True})),
            observed(
                view(
                    record(
                        "s",
                        spec=entry("s", devices={"count": 1, "shareable": True}),
                        owner=OTHER,
                        devices=("nvidia:0",),
                        shareable=True,
                        port=8001,
                    ),
                    alive=True,
                )
            ),
            inv=inventory("nvidia:0"),
            expect=((Start, "a", "nvidia:0"),),
        ),
        id="start-shareable-stacks-on-shareable",
    ),
    pytest.param(
        Case(
            desired(entry("a", devices={"count": 1, "shareable": True})),
            observed(view(record("x", owner=OTHER, devices=("nvidia:0",), port=8001), alive=True)),
            inv=inventory("nvidia:0"),
            expect=((Hold, "a", "no capacity"),),
        ),
        id="hold-shareable-never-stacks-on-exclusive",
    ),
    pytest.param(
        Case(
            desired(a_gpu),
            observed(
                foreign_devices={"nvidia:0": "old (unreadable record)"},
                foreign_ports={8000: "old (unreadable record)"},
            ),
            expect=((Start, "a", "nvidia:1, port 8001"),),
        ),
        id="start-avoids-what-unreadable-records-hold",
    ),
    pytest.param(
        Case(
            desired(a_gpu),
            observed(drain=DRAIN),
            expect=(
                (
                    Hold,
                    "a",
                    "node drained by ops until 2026-01-01 13:00:00 UTC "
                    "(kernel update): run `reconcile uncordon`",
                ),
            ),
        ),
        id="hold-drained",
    ),
    pytest.param(
        Case(desired(a_gpu), observed(drain=Drain(until=NOW)), expect=((Start, "a", "nvidia:0"),)),
        id="start-after-drain-expired",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(
                view(record("a"), alive=True), drain=Drain(until=NOW + timedelta(1), evict=True)
            ),
            expect=((Stop, "a", "evicted: node drained"),),
        ),
        id="stop-drain-evicts",
    ),
    pytest.param(
        Case(desired(entry("a")), observed(view(record("a"), alive=True), drain=DRAIN)),
        id="drain-keeps-running-engines",
    ),
    # A spec change on a drained node: its replacement would stop the engine and start
    # nothing until uncordon, so the engine serves on and its record says what waits.
    pytest.param(
        Case(
            desired(entry("a", args=["--new"])),
            observed(view(record("a"), alive=True), drain=DRAIN),
            expect=((HoldChange, "a", f"spec.args changed: held: {DRAINED}"),),
        ),
        id="drain-holds-a-ready-engines-spec-change",
    ),
    pytest.param(
        Case(
            desired(entry("a", args=["--new"])),
            observed(view(record("a", **starting), alive=True, probe=probe(True)), drain=DRAIN),
            expect=((MarkReady, "a", "GET /health"), (HoldChange, "a", "held: node drained")),
        ),
        id="drain-holds-a-starting-engines-spec-change-and-it-gets-ready",
    ),
    pytest.param(
        Case(
            desired(entry("a", args=["--new"])),
            observed(view(record("a", message=HELD_ARGS), alive=True), drain=DRAIN),
            expect=((HoldChange, "a", HELD_ARGS),),  # the executor writes it once
        ),
        id="drain-still-holds-the-change-it-said",
    ),
    pytest.param(
        Case(
            desired(entry("a", args=["--new"])),
            observed(view(record("a", message=HELD_ARGS), alive=True)),
            expect=((Replace, "a", "spec.args changed"),),
        ),
        id="uncordon-applies-the-held-change",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(view(record("a", message=HELD_ARGS), alive=True), drain=DRAIN),
            expect=((HoldChange, "a", "the drain holds its spec change no more"),),
        ),
        id="an-edit-undone-during-the-drain-clears-its-hold",
    ),
    pytest.param(
        Case(
            desired(entry("a", args=["--new"])),
            observed(
                view(record("a"), alive=True), drain=Drain(until=NOW + timedelta(1), evict=True)
            ),
            expect=((Replace, "a", "spec.args changed"),),
        ),
        id="a-drain-that-evicts-holds-no-change",
    ),
    pytest.param(
        Case(
            desired(entry("a", args=["--new"])),
            observed(view(record("a", phase=Phase.PENDING).released()), drain=DRAIN),
            expect=((Hold, "a", DRAINED),),
        ),
        id="drain-holds-a-pending-records-new-spec-as-before",
    ),
    pytest.param(
        Case(
            desired(entry("a"), restarts={"a": NOW}),
            observed(view(record("a", started_at=NOW - timedelta(1)), alive=True), drain=DRAIN),
            expect=((HoldChange, "a", "restarted by `reconcile restart`: held: node drained"),),
        ),
        id="drain-holds-a-restart-asked-before-it",
    ),
    # -- the lifecycle ---------------------------------------------------------------------
    pytest.param(
        Case(desired(entry("a")), observed(view(record("a"), alive=True))),
        id="in-sync-ready",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(view(record("a", **starting), alive=True, probe=probe(True))),
            expect=((MarkReady, "a", "GET /health -> 2xx"),),
        ),
        id="mark-ready-when-probe-passes",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(view(record("a", **starting), alive=True, probe=probe(False))),
        ),
        id="starting-before-deadline-waits",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(
                view(
                    record("a", phase=Phase.STARTING, ready_deadline_at=NOW),
                    alive=True,
                    probe=probe(False),
                )
            ),
            expect=(
                (
                    Fail,
                    "a",
                    "not ready by its readiness deadline (last probe: GET /health -> "
                    "503); restart now",
                ),
            ),
        ),
        id="fail-on-readiness-deadline",
    ),
    pytest.param(
        Case(
            desired(entry("a", restartPolicy="Never")),
            observed(
                view(
                    record(
                        "a",
                        spec=entry("a", restartPolicy="Never"),
                        phase=Phase.STARTING,
                        ready_deadline_at=NOW,
                    ),
                    alive=True,
                )
            ),
            expect=((Fail, "a", "restartPolicy Never"),),
        ),
        id="fail-deadline-never-policy",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(view(record("a"), exit=exited(code=3))),
            expect=((Fail, "a", "engine exited with code 3; restart now"),),
        ),
        id="fail-crash-restarts-now",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(view(record("a", phase=Phase.STARTING))),
            expect=((Fail, "a", "engine exited; restart now"),),
        ),
        id="fail-crash-of-engine-we-did-not-spawn",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(
                view(record("a", phase=Phase.STARTING, restarts=2), exit=exited(code=1)),
                listening=frozenset({8000}),
            ),
            expect=((Release, "a", "port 8000 was taken by another process before the engine"),),
        ),
        id="exit-before-ready-on-a-taken-port-moves-without-a-crash",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(
                view(record("a", phase=Phase.READY, restarts=1), exit=exited(code=1)),
                listening=frozenset({8000}),
            ),
            expect=((Fail, "a", "engine exited with code 1; restart in 10s"),),
        ),
        id="exit-once-ready-is-a-crash-whoever-binds-its-port-now",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(view(record("a", restarts=1), exit=exited(sig=9))),
            expect=((Fail, "a", "killed by signal 9; restart in 10s"),),
        ),
        id="fail-second-crash-backs-off-10s",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(view(record("a", phase=Phase.BACKOFF, restarts=1, backoff_until=NOW))),
            expect=((Restart, "a", "back-off over (restart 2)"),),
        ),
        id="restart-after-back-off",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(
                view(record("a", phase=Phase.BACKOFF, backoff_until=NOW + timedelta(seconds=5)))
            ),
        ),
        id="back-off-not-over-waits",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(view(record("a", phase=Phase.BACKOFF, backoff_until=NOW)), drain=DRAIN),
            expect=((HoldRestart, "a", "; restart held: node drained by ops until "),),
        ),
        id="back-off-over-but-drained-waits-saying-so",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(
                view(
                    record(
                        "a",
                        phase=Phase.BACKOFF,
                        backoff_until=NOW,
                        message="engine exited with code 3; restart held: node drained by ops "
                        "until 2026-01-01 13:00:00 UTC (kernel update): "
                        "run `reconcile uncordon` or wait",
                    )
                ),
                drain=DRAIN,
            ),
        ),
        id="back-off-held-by-the-drain-already-says-so",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(view(record("a"), exit=exited(3)), drain=DRAIN),
            expect=((Fail, "a", "code 3; restart held: node drained by ops until"),),
        ),
        id="crash-on-a-drained-node-says-the-drain-holds-the-restart",
    ),
    pytest.param(
        Case(
            desired(GPU_A),
            observed(
                view(
                    record(
                        "a",
                        spec=GPU_A,
                        phase=Phase.BACKOFF,
                        backoff_until=NOW,
                        devices=("nvidia:2",),
                    )
                )
            ),
            expect=(
                (Release, "a", "nvidia:2 is no longer in the node's inventory: placing it afresh"),
            ),
        ),
        id="back-off-over-on-a-device-gone-from-the-inventory-places-afresh",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(
                view(record("a", phase=Phase.BACKOFF, backoff_until=NOW)),
                listening=frozenset({8000}),
            ),
            expect=((Release, "a", "port 8000 was taken by another process while the engine"),),
        ),
        id="back-off-over-port-taken-releases-to-place-afresh",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(
                view(record("a", phase=Phase.BACKOFF, backoff_until=NOW, extra_ports=(40000,))),
                listening=frozenset({40000}),
            ),
            expect=((Release, "a", "port 40000 was taken by another process"),),
        ),
        id="back-off-over-extra-port-taken-releases",
    ),
    pytest.param(
        Case(desired(entry("a")), observed(view(record("a", phase=Phase.FAILED)))),
        id="failed-is-terminal",
    ),
    pytest.param(
        Case(desired(entry("a")), observed(view(record("a", phase=Phase.SUCCEEDED)))),
        id="succeeded-is-terminal",
    ),
    # -- spec changes and removals ------------------------------------------------------------
    pytest.param(
        Case(
            desired(entry("a", args=["--new"])),
            observed(view(record("a"), alive=True)),
            expect=((Replace, "a", "spec.args changed"),),
        ),
        id="replace-on-spec-change-names-field",
    ),
    pytest.param(
        Case(
            desired(entry("a", devices={"count": 1, "kind": "nvidia"})),
            observed(view(record("a"), alive=True)),
            expect=((Replace, "a", "spec.devices.count, spec.devices.kind changed"),),
        ),
        id="replace-names-nested-fields",
    ),
    # Each field the running engine never sees changes in place, alone; with any field it
    # does see (args) the whole change is a replace, never an in-place update that drops it.
    *(
        pytest.param(
            Case(
                desired(entry("a", **change)),
                observed(view(record("a"), alive=True)),
                expect=((Update, "a", f"spec.{field} changed"),),
            ),
            id=f"in-place-{field}-alone",
        )
        for field, change in IN_PLACE_CHANGES.items()
    ),
    *(
        pytest.param(
            Case(
                desired(entry("a", args=["--new"], **change)),
                observed(view(record("a"), alive=True)),
                expect=((Replace, "a", "spec.args"),),
            ),
            id=f"replace-{field}-with-args",
        )
        for field, change in IN_PLACE_CHANGES.items()
    ),
    # A record an older reconcile wrote (2026-12-01's) lacks the fields added since (none
    # hashed): declared at their defaults they are no edit, and nothing is done (each
    # such record had an update event, and `plan` exit 2, saying they "changed")...
    pytest.param(
        Case(
            desired(entry("a")), observed(view(record("a", stored_spec=OLDER_DOCUMENT), alive=True))
        ),
        id="fields-an-older-record-lacks-at-their-defaults-are-no-edit",
    ),
    # ... set to another value, they are
    pytest.param(
        Case(
            desired(entry("a", fallbackAfter=5)),
            observed(view(record("a", stored_spec=OLDER_DOCUMENT), alive=True)),
            expect=((Update, "a", "spec.fallbackAfter changed"),),
        ),
        id="a-field-an-older-record-lacks-set-is-an-edit",
    ),
    # envFrom's values are not in the document: the hash (covering their digest) says a
    # change, and an in-place field changed beside them must not hide it.
    pytest.param(
        Case(
            desired(secret_entry("b")),
            observed(view(record("a", spec=secret_entry("a")), alive=True)),
            expect=((Replace, "a", "spec.envFrom's values changed"),),
        ),
        id="replace-on-a-changed-secret",
    ),
    pytest.param(
        Case(
            desired(secret_entry("b", stopGracePeriodSeconds=7)),
            observed(view(record("a", spec=secret_entry("a")), alive=True)),
            expect=((Replace, "a", "spec.stopGracePeriodSeconds, spec.envFrom's values"),),
        ),
        id="replace-in-place-field-with-a-changed-secret",
    ),
    pytest.param(
        Case(
            desired(secret_entry("a", stopGracePeriodSeconds=7)),
            observed(view(record("a", spec=secret_entry("a")), alive=True)),
            expect=((Update, "a", "spec.stopGracePeriodSeconds changed"),),
        ),
        id="in-place-field-with-the-same-secret",
    ),
    pytest.param(
        Case(
            desired(
                entry(
                    "a",
                    args=["--new"],
                    **{k: v for c in IN_PLACE_CHANGES.values() for k, v in c.items()},
                )
            ),
            observed(view(record("a"), alive=True)),
            expect=((Replace, "a", "spec.args"),),
        ),
        id="replace-every-in-place-field-with-args",
    ),
    pytest.param(
        Case(
            desired(entry("a", args=["--new"])),
            observed(view(record("a", phase=Phase.PENDING).released())),
            expect=((Start, "a", "spec.args changed: placing the new spec"),),
        ),
        # A recreate's or a preemption's Pending record is placed with the new spec, not
        # dropped: the gateway keeps the name (no 404 between teardown and reservation).
        id="place-pending-on-spec-change",
    ),
    pytest.param(
        Case(
            desired(entry("a", args=["--new"])),
            observed(view(record("a", phase=Phase.FAILED))),
            expect=((Release, "a", "spec.args changed"),),
        ),
        id="release-failed-on-spec-change",
    ),
    pytest.param(
        Case(
            desired(),
            observed(view(record("a"), alive=True)),
            expect=((Stop, "a", "manifest removed (was /srv/manifests/models.yaml)"),),
        ),
        id="stop-removed-manifest",
    ),
    pytest.param(
        Case(
            desired(),
            observed(view(record("a", phase=Phase.PENDING))),
            expect=((Release, "a", "manifest removed"),),
        ),
        id="release-removed-pending",
    ),
    pytest.param(
        Case(
            desired(repo=Path("/srv")),  # a git source's checkout: named from the repository
            observed(view(record("a"), alive=True)),
            expect=((Stop, "a", "manifest removed (was manifests/models.yaml)"),),
        ),
        id="stop-removed-manifest-of-a-repository",
    ),
    pytest.param(
        Case(
            desired(entry("b"), repo=Path("/srv")),  # `metadata.name: a` edited to `b` in place
            observed(view(record("a"), alive=True)),
            expect=(
                (Stop, "a", "removed from manifests/models.yaml, which now declares b (renamed"),
                (Start, "b", "new deployment"),
            ),
        ),
        id="stop-renamed-in-its-file",  # its file is still there: no "manifest removed"
    ),
    pytest.param(
        Case(
            desired(entry("b")),
            observed(view(record("a", phase=Phase.PENDING)), view(record("b"), alive=True)),
            expect=(
                (
                    Release,
                    "a",
                    "removed from /srv/manifests/models.yaml (the file is still there, "
                    "declaring b)",
                ),
            ),
        ),
        id="release-no-longer-declared-in-its-file",
    ),
    pytest.param(
        Case(
            desired(skipped={"a": "gpu=h100"}),
            observed(view(record("a"), alive=True)),
            expect=((Stop, "a", "nodeSelector gpu=h100 no longer matches this node's labels"),),
        ),
        id="stop-no-longer-selected",  # the node's labels changed, not the manifest
    ),
    pytest.param(
        Case(
            desired(skipped={"a": "gpu=h100"}),
            observed(view(record("a", phase=Phase.PENDING))),
            expect=((Release, "a", "nodeSelector gpu=h100 no longer matches this node's labels"),),
        ),
        id="release-no-longer-selected",
    ),
    pytest.param(
        Case(desired(prune=False), observed(view(record("a"), alive=True))),
        id="no-prune-when-folder-missing-or-empty",
    ),
    pytest.param(
        Case(desired(), observed(view(record("a", owner=OTHER), alive=True))),
        id="no-prune-of-other-owners",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(view(record("a", owner=OTHER), alive=True)),
            expect=(
                (Conflict, "a", "set is this one under other -f folders, pass `--owner '/srv/"),
            ),
        ),
        id="conflict-name-owned-by-other-set",
    ),
    pytest.param(
        Case(
            desired(),
            observed(view(record("a", phase=Phase.TERMINATING), alive=True)),
            expect=((Stop, "a", "finishing a teardown under way"),),
        ),
        id="stop-finishes-interrupted-teardown",
    ),
    # -- invariant 4: a broken manifest tears nothing down -----------------------------------
    pytest.param(
        Case(
            desired(invalid={"a": "models.yaml:7: spec.port: bad"}),
            observed(view(record("a"), alive=True)),
            expect=((MarkSpec, "a", "models.yaml:7: spec.port: bad"),),
        ),
        id="mark-spec-invalid-document",
    ),
    pytest.param(
        Case(
            desired(broken_sources=frozenset({"/srv/manifests/models.yaml"})),
            observed(view(record("a"), alive=True)),
            expect=((MarkSpec, "a", "/srv/manifests/models.yaml could not be loaded"),),
        ),
        id="mark-spec-invalid-broken-file",
    ),
    pytest.param(
        Case(
            desired(
                broken_sources=frozenset({"/srv/manifests/models.yaml"}),
                source_errors={"/srv/manifests/models.yaml": "models.yaml:3: invalid YAML: x"},
            ),
            observed(view(record("a"), alive=True)),
            expect=((MarkSpec, "a", "(engine left running): models.yaml:3: invalid YAML: x"),),
        ),
        id="mark-spec-invalid-says-the-files-error",
    ),
    pytest.param(
        Case(
            desired(invalid={"a": "bad"}),
            observed(view(record("a", spec_valid=False), exit=exited(code=1))),
            expect=((Fail, "a", "exited with code 1; no restart until its manifest is valid"),),
        ),
        id="fail-engine-died-while-spec-invalid",
    ),
    pytest.param(
        Case(
            desired(invalid={"a": "bad"}),
            observed(view(record("a", phase=Phase.BACKOFF, spec_valid=False))),
            expect=((MarkSpec, "a", "spec invalid (engine not running): bad"),),
        ),
        id="mark-spec-invalid-engine-not-running",
    ),
    pytest.param(
        Case(
            desired(invalid={"a": "models.yaml:7: spec.port: bad"}),
            expect=((Reject, "a", "spec invalid (not started): models.yaml:7: spec.port: bad"),),
        ),
        id="reject-invalid-from-the-start-gets-a-pending-record",
    ),
    pytest.param(
        Case(
            desired(invalid={"a": "bad"}),
            observed(
                view(
                    record(
                        "a",
                        phase=Phase.PENDING,
                        spec_valid=False,
                        message="spec invalid (not started): bad",
                    )
                )
            ),
        ),
        id="reject-is-not-repeated",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(view(record("a", phase=Phase.BACKOFF, spec_valid=False))),
            expect=(
                (MarkSpec, "a", "manifest is valid again"),
                (Restart, "a", "back-off over (restart 1)"),
            ),
        ),
        id="restart-once-the-manifest-is-fixed",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(view(record("a", spec_valid=False, message="spec invalid"), alive=True)),
            expect=((MarkSpec, "a", "manifest is valid again"),),
        ),
        id="mark-spec-valid-again",
    ),
    # -- invariant 3: dead makers and orphans -------------------------------------------------
    pytest.param(
        Case(
            desired(entry("a")),
            observed(view(record("a", phase=Phase.RESERVED), maker_alive=True)),
        ),
        id="reservation-of-live-maker-left-alone",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(view(record("a", phase=Phase.RESERVED))),
            expect=((Release, "a", "reservation's maker (pid 50) is gone and no engine"),),
        ),
        id="release-dead-makers-reservation",
    ),
    pytest.param(
        Case(
            desired(entry("a")),
            observed(
                view(
                    record("a", phase=Phase.RESERVED),
                    markers=(
                        marked(201, "a", "nonce-a", ppid=200, start=5.0),
                        marked(200, "a", "nonce-a", ppid=1, start=6.0),
                    ),
                )
            ),
            expect=((Adopt, "a", "its maker (pid 50) is gone; engine pid 200 runs"),),
        ),
        id="adopt-dead-makers-engine-by-marker",
    ),
    pytest.param(
        Case(
            desired(),
            observed(view(record("a", owner=OTHER, phase=Phase.RESERVED))),
            expect=((Release, "a", "maker (pid 50) is gone"),),
        ),
        id="release-dead-reservation-of-other-owner",
    ),
    pytest.param(
        Case(
            desired(),
            observed(orphans=(marked(300, "a", "n1"), marked(301, "a", "n1", ppid=300))),
            expect=((Reap, "a", "engine processes (300, 301) of instance n1 have no record"),),
        ),
        id="reap-orphan-markers",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_plan_table(case: Case) -> None:
    actions = run(case)
    got = [(type(a), a.name) for a in actions]
    assert got == [(t, n) for t, n, _ in case.expect], [a.describe() for a in actions]
    for action, (_, _, phrase) in zip(actions, case.expect, strict=True):
        assert phrase in action.reason, action.describe()


@pytest.mark.parametrize(
    ("phase", "listening", "restarts", "kept"),
    [
        (Phase.STARTING, 8000, 2, 2),  # no crash of its own: not counted
        (Phase.BACKOFF, 8000, 2, 3),  # the restart the back-off waited for: counted
    ],
    ids=["taken-before-ready", "taken-during-back-off"],
)
def test_a_port_move_keeps_the_count(
    phase: Phase, listening: int, restarts: int, kept: int
) -> None:
    """A port move is no new spec: the record stays Pending with its count (it restarted
    from 0 once placed elsewhere; Kubernetes resets restartCount only with a new template)."""
    rec = record("a", phase=phase, restarts=restarts, backoff_until=NOW)
    exit_ = exited(code=1) if phase is Phase.STARTING else None
    case = Case(
        desired(entry("a")), observed(view(rec, exit=exit_), listening=frozenset({listening}))
    )
    (action,) = run(case)
    assert isinstance(action, Release) and action.restarts == kept, action


def test_other_releases_drop_the_record_and_its_count() -> None:
    case = Case(desired(), observed(view(record("a", phase=Phase.PENDING, port=None))))
    (action,) = run(case)
    assert isinstance(action, Release) and action.restarts is None, action


# -- back-off arithmetic ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("restarts", "delay"),
    [(0, 0), (1, 10), (2, 20), (3, 40), (4, 80), (5, 160), (6, 300), (7, 300), (40, 300)],
    ids=lambda v: str(v),
)
def test_backoff_doubles_to_five_minutes(restarts: int, delay: float) -> None:
    assert backoff(restarts) == delay
    case = Case(desired(entry("a")), observed(view(record("a", restarts=restarts))))
    (fail,) = run(case)
    assert isinstance(fail, Fail) and fail.phase is Phase.BACKOFF
    assert fail.retry_at == NOW + timedelta(seconds=delay)
    assert fail.restarts == restarts
    assert ("restart now" if delay == 0 else f"restart in {delay:g}s") in fail.reason
    # A view counts the clause again from the record (Record.message_at): it finds the
    # planner's clause whatever the delay, and says what is true when it is read.
    rec = record("a", phase=Phase.BACKOFF, backoff_until=fail.retry_at, message=fail.reason)
    cause = backoff_cause(fail.reason)
    assert cause != fail.reason  # the clause is found
    assert rec.message_at(NOW + timedelta(seconds=delay, hours=1)) == f"{cause}; {RESTART_DUE}"
    if delay:
        left = rec.message_at(NOW + timedelta(seconds=delay - 5.5))
        assert left == f"{cause}; restart in 6s", left
    assert replace(rec, phase=Phase.READY).message_at(NOW) == fail.reason  # only a BackOff's


def test_a_restart_held_by_a_drain_counts_no_time_down() -> None:
    """A view leaves the drain's clause as the pass wrote it (no "restart due" under it)."""
    held = "engine exited with code 3; restart held: node drained by ops until X: run it"
    rec = record("a", phase=Phase.BACKOFF, backoff_until=NOW, message=held)
    assert backoff_cause(held) == "engine exited with code 3"
    assert rec.message_at(NOW + timedelta(hours=1)) == held


@pytest.mark.parametrize(
    ("ready_for", "delay"),
    [(BACKOFF_RESET, 0.0), (BACKOFF_RESET - 1, 160.0)],
    ids=["ready-10min-resets", "ready-under-10min-keeps"],
)
def test_backoff_resets_after_ten_minutes_ready(ready_for: float, delay: float) -> None:
    rec = record("a", restarts=5, ready_at=NOW - timedelta(seconds=ready_for))
    (fail,) = run(Case(desired(entry("a")), observed(view(rec))))
    assert isinstance(fail, Fail)
    assert fail.retry_at == NOW + timedelta(seconds=delay)


@pytest.mark.parametrize(
    ("policy", "code", "phase"),
    [
        ("Never", 0, Phase.SUCCEEDED),
        ("Never", 1, Phase.FAILED),
        ("Never", None, Phase.FAILED),
        ("OnFailure", 0, Phase.SUCCEEDED),
        ("OnFailure", 1, Phase.BACKOFF),
        ("Always", 0, Phase.BACKOFF),
    ],
    ids=lambda v: str(v),
)
def test_restart_policies(policy: str, code: int | None, phase: Phase) -> None:
    e = entry("a", restartPolicy=policy)
    ended = exited(code=code) if code is not None else None
    (fail,) = run(Case(desired(e), observed(view(record("a", spec=e), exit=ended))))
    assert isinstance(fail, Fail)
    assert fail.phase is phase, fail.describe()
    if phase is not Phase.BACKOFF:
        assert f"restartPolicy {policy}" in fail.reason


def test_mark_spec_invalid_is_not_repeated_once_recorded(tmp_path: Path) -> None:
    """Once the executor has marked the record, the next plan leaves it be.

    Otherwise every pass would rewrite the record, journal an event and run all its rounds.
    """
    want = desired(invalid={"a": "models.yaml:7: spec.port: bad"})
    store = RecordStore(tmp_path)
    store.ensure()
    store.write(record("a"))
    (mark,) = run(Case(want, observed(view(record("a"), alive=True))))
    assert isinstance(mark, MarkSpec) and not mark.valid
    assert _executor(tmp_path, store).apply(mark)
    marked_rec = store.read("a")
    assert marked_rec is not None and not marked_rec.spec_valid
    assert "models.yaml:7: spec.port: bad" in marked_rec.message
    assert run(Case(want, observed(view(marked_rec, alive=True)))) == []


def _executor(tmp_path: Path, store: RecordStore) -> Executor:
    return Executor(
        store=store,
        backend=LocalBackend(tmp_path, "gpu-a"),
        journal=Journal(tmp_path),
        maker=RecordMaker(
            store=store, inventory=GPUS, owner="/srv/manifests", node="gpu-a", me=ref(1)
        ),
    )


@pytest.mark.parametrize(
    "action",
    [
        Fail(name="a", reason="exited 1; restartPolicy Never", phase=Phase.FAILED),
        Preempt(name="a", reason="preempted by b (priority 9)", by="b", priority=9),
    ],
    ids=["failed", "preempted"],
)
def test_an_engine_that_stops_holding_gives_its_whole_lease_back(
    tmp_path: Path, action: Action
) -> None:
    """Fail and Preempt give back the same lease: devices, the memory packed on them, the
    ports (Record.released). A Failed record once kept its memory with no device left."""
    packed = entry("a", devices={"count": 1, "kind": "nvidia", "memory": "20Gi"})
    store = RecordStore(tmp_path)
    store.ensure()
    held = record(
        "a",
        spec=packed,
        ref=None,  # nothing runs: teardown signals no one
        devices=("nvidia:0",),
        device_uuids=(None,),
        memory=20 * 2**30,
        extra_ports=(8001,),
    )
    store.write(held)
    assert _executor(tmp_path, store).apply(action)
    after = store.read("a")
    assert after is not None and not after.holds
    lease = (after.devices, after.device_uuids, after.memory, after.port, after.extra_ports)
    assert lease == ((), (), None, None, ()), lease
    assert after.message == action.reason


# -- properties -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ports", "then"),
    [
        ({"basePort": 8000}, (Start, "port 8001")),  # another port, and says which
        ({"port": 8000}, (Hold, "port 8000 is in use by another process: free it")),
    ],
    ids=["base-port-moves-on", "exact-port-says-why"],
)
def test_a_port_taken_during_back_off_is_placed_afresh(
    ports: dict[str, int], then: tuple[type[Action], str]
) -> None:
    """A foreign process took the port while the engine was backing off: restarting there
    would only crash-loop. The record is released, and the next round places it again
    away from the squatter (basePort), or holds it saying why (an exact port)."""
    a = entry("a", **ports)
    squatted = frozenset({8000})
    backing_off = record("a", spec=a, phase=Phase.BACKOFF, restarts=2, backoff_until=NOW)
    first = plan(desired(a), observed(view(backing_off), listening=squatted), GPUS, NOW)
    assert [(type(x), x.name) for x in first] == [(Release, "a")], first
    assert "port 8000 was taken by another process" in first[0].reason
    # The executor dropped the record: the next round sees no record, the port still taken.
    second = plan(desired(a), observed(listening=squatted), GPUS, NOW)
    assert [(type(x), x.name) for x in second] == [(then[0], "a")], second
    assert then[1] in second[0].reason, second[0].reason
    if isinstance(second[0], Start):
        assert second[0].port == 8001


def test_plan_is_sorted_by_kind_then_name() -> None:
    want = desired(entry("z"), entry("b"), entry("a", args=["--x"]))
    seen = observed(view(record("a"), alive=True), view(record("old"), alive=True))
    actions = run(Case(want, seen))
    keys = [(a.order, a.name) for a in actions]
    assert keys == sorted(keys)
    assert [type(a) for a in actions] == [Replace, Stop, Start, Start]


def _holders_of(scenario: Scenario, actions: list[Action]) -> dict[str, list[tuple[str, bool]]]:
    """Device -> [(holder, shareable)] after the plan: live holders plus new starts."""
    removed = {a.name for a in actions if isinstance(a, Stop | Release | Fail)}
    out: dict[str, list[tuple[str, bool]]] = {}
    for name, rec in scenario.holders():
        if rec.holds and name not in removed:
            for key in rec.devices:
                out.setdefault(key, []).append((name, rec.shareable))
    for a in actions:
        if isinstance(a, Start):
            for key in a.devices:
                out.setdefault(key, []).append((a.name, a.entry.deployment.spec.devices.shareable))
    return out


def _no_device_to_two_exclusive_holders(scenario: Scenario, actions: list[Action]) -> None:
    starts = [a for a in actions if isinstance(a, Start)]
    for key, holders in _holders_of(scenario, actions).items():
        new = {a.name for a in starts if key in a.devices}
        if not new:
            continue  # the plan gave this device to nobody: pre-existing state is not its doing
        if len(holders) > 1:
            assert all(shareable for _, shareable in holders), (key, holders)


def _no_port_handed_out_twice(scenario: Scenario, actions: list[Action]) -> None:
    held = {
        p
        for _, rec in scenario.holders()
        if rec.holds and rec.port is not None
        for p in (rec.port, *rec.extra_ports)
    }
    given_out: list[int] = []
    for a in actions:
        if isinstance(a, Start):
            given_out += [a.port, *a.extra_ports]
    assert len(given_out) == len(set(given_out)), given_out
    assert not set(given_out) & held, (given_out, held)
    assert not set(given_out) & scenario.observed.listening


# Actions that rewrite a record's words or fields and change nothing that runs: one may
# go beside the instance's own action (the tables: a held change's words cleared before
# a recreate, facts restated beside a readiness, a spec marked valid again).
NOTES = (Update, MarkSpec, HoldChange, Probed)


def acts_on_each_instance_once(actions: list[Action]) -> None:
    """No two actions of a plan decide what becomes of one instance (a restart and a
    promotion, two starts of one name: each would have it serve its own way). Beside its
    one action go the notes above, and reaps of orphan processes carrying its name (other
    nonces: other engines)."""
    counted = [a.name for a in actions if not isinstance(a, (Reap, *NOTES))]
    twice = {n for n in counted if counted.count(n) > 1}
    assert not twice, [a.describe() for a in actions if a.name in twice]


def _prunes_only_what_it_owns(scenario: Scenario, actions: list[Action]) -> None:
    """Stop/Replace/Release touch only our records (or a reservation whose maker died),
    and with prune=False nothing undeclared is stopped (invariants 5 and 8)."""
    want, seen = scenario.desired, scenario.observed
    for a in actions:
        if not isinstance(a, Stop | Release):
            continue
        v = seen.records.get(a.name)
        assert v is not None, a.describe()
        dead_reservation = v.record.phase is Phase.RESERVED and not v.maker_alive
        assert v.record.owner == want.owner or dead_reservation, a.describe()
        pruning = base_name(a.name) not in want.entries and not dead_reservation
        if pruning and not want.prune:
            assert v.record.phase is Phase.TERMINATING, a.describe()


@given(scenarios() | replicated_scenarios())  # replicas: each its own lease
def test_property_a_plan_never_double_books_nor_prunes_others_and_is_deterministic(
    scenario: Scenario,
) -> None:
    """Every property of a random scenario's plan, on the same examples: drawing a
    scenario is nearly all of an example's cost (planning it, ~1/20), so one draw is
    checked for all five rather than five tests each drawing their own 100. A failing
    assertion is still shrunk and reported on its own (each its own line)."""
    actions = plan(scenario.desired, scenario.observed, scenario.inventory, NOW)
    _no_device_to_two_exclusive_holders(scenario, actions)
    _no_port_handed_out_twice(scenario, actions)
    _prunes_only_what_it_owns(scenario, actions)
    acts_on_each_instance_once(actions)
    again = plan(scenario.desired, scenario.observed, scenario.inventory, NOW)
    assert actions == again  # deterministic


# -- records of another node ------------------------------------------------------------


def test_a_record_of_another_node_is_never_judged_here() -> None:
    """Node gpu-b shares the state dir: gpu-a's dead engine is not restarted, reaped or
    dropped from gpu-b, and its devices do not count against gpu-b's inventory."""
    theirs = record("a", spec=entry("a", **GPU1), devices=("nvidia:0",), node="gpu-a")
    pending = record("p", spec=entry("p", **GPU1), phase=Phase.RESERVED, node="gpu-a")
    want = desired(entry("a", **GPU1), entry("p", **GPU1), entry("b", devices={"count": 2}))
    seen = observed(view(theirs, alive=False, exit=exited(1)), view(pending), node="gpu-b")
    actions = run(Case(want, seen))
    assert [(type(a), a.name) for a in actions] == [(Start, "b")]
    (start,) = actions
    assert isinstance(start, Start) and start.devices == ("nvidia:0", "nvidia:1")


def test_the_same_records_on_their_own_node_are_judged() -> None:
    theirs = record("a", spec=entry("a", **GPU1), devices=("nvidia:0",), node="gpu-a")
    seen = observed(view(theirs, alive=False, exit=exited(1)), node="gpu-a")
    actions = run(Case(desired(entry("a", **GPU1)), seen))
    assert [type(a) for a in actions] == [Fail]


REFUSED = "GET /health: ConnectionRefusedError: [Errno 111] Connection refused"
LOOPBACK_HINT = (
    "; on this backend the engine must listen on its node's address: pass it `{host}` "
    "(e.g. `--host {host}`)"
)


@pytest.mark.parametrize(
    ("backend", "command", "hint"),
    [
        pytest.param("ray", ["serve", "{port}"], LOOPBACK_HINT, id="cluster-no-host"),
        pytest.param("ray", ["serve", "{port}", "--host", "{host}"], "", id="cluster-host"),
        pytest.param("local", ["serve", "{port}"], "", id="local"),
    ],
)
def test_a_refused_engine_on_a_cluster_is_told_to_bind_its_host(
    backend: str, command: list[str], hint: str
) -> None:
    """On a cluster the node's address is probed: a command engine whose argv names no
    ``{host}`` binds its own default (loopback, most often) and is refused there at every
    deadline; the reason says what to pass. Locally loopback is what is probed."""
    spec = entry("a", command=command)
    rec = record("a", spec=spec, phase=Phase.STARTING, ready_deadline_at=NOW, backend=backend)
    got = plan(
        desired(spec), observed(view(rec, alive=True, probe=ProbeResult(False, REFUSED))), GPUS, NOW
    )
    reason = f"not ready by its readiness deadline (last probe: {REFUSED}){hint}; restart now"
    assert [(type(a), a.name, a.reason) for a in got] == [(Fail, "a", reason)]


def test_an_eviction_drains_the_engine_and_keeps_its_record_pending() -> None:
    # Its answers in flight end first (the gateway's drain), and the record stays, Pending:
    # dropped, the gateway answered 404 for a declared model until the next pass (a trial).
    drain = Drain(until=NOW + timedelta(1), evict=True)
    seen = observed(view(record("a"), alive=True), drain=drain)
    (stop,) = run(Case(desired(entry("a")), seen))
    assert isinstance(stop, Stop) and stop.evict and stop.drain, stop
