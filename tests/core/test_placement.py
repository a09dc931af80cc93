"""Pure placement: devices and ports from what is free, or a reason that says why not."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from strategies import deployment, inventory

from controller.core.devices.inventory import Device, Inventory, parse_static
from controller.core.devices.placement import (
    INTERNAL_BASE,
    INTERNAL_BLOCK,
    MAX_PORT,
    Ledger,
    Placed,
    Spread,
    Unplaced,
    bound_selectors,
    ledger_for,
    place,
    place_devices,
    place_ports,
)
from controller.core.state import Observed, Phase, Record


def spec(**fields: Any) -> Any:
    return deployment("web", **fields).spec


@pytest.mark.parametrize(
    ("holders", "shareable", "free"),
    [
        ([], False, True),
        ([], True, True),
        ([("a", False)], False, False),
        ([("a", False)], True, False),
        ([("a", True)], False, False),
        ([("a", True)], True, True),
        ([("a", True), ("b", True)], True, True),
        ([("a", True), ("b", False)], True, False),
    ],
    ids=[
        "free-exclusive",
        "free-shareable",
        "exclusive-on-exclusive",
        "shareable-on-exclusive",
        "exclusive-on-shareable",
        "shareable-on-shareable",
        "shareable-on-two-shareable",
        "shareable-on-mixed",
    ],
)
def test_invariant_1_stacking_only_when_all_shareable(
    holders: list[tuple[str, bool]], shareable: bool, free: bool
) -> None:
    ledger = Ledger(devices={"nvidia:0": holders} if holders else {})
    assert ledger.free_for("nvidia:0", shareable) is free


def test_no_devices_wanted() -> None:
    assert place_devices(spec(), inventory("nvidia:0"), Ledger()) == ()


def test_devices_in_numeric_order() -> None:
    inv = inventory("nvidia:10", "nvidia:2", "nvidia:1")
    assert place_devices(spec(devices={"count": 2}), inv, Ledger()) == ("nvidia:1", "nvidia:2")


def test_kind_any_prefers_nvidia_and_never_mixes_kinds() -> None:
    inv = inventory("amd:0", "amd:1", "nvidia:0")
    assert place_devices(spec(devices={"count": 1}), inv, Ledger()) == ("nvidia:0",)
    assert place_devices(spec(devices={"count": 2}), inv, Ledger()) == ("amd:0", "amd:1")


@pytest.mark.parametrize("memory", [None, "1Gi"], ids=["whole", "memory"])
def test_kind_any_wanting_more_than_one_kind_has_says_so(memory: str | None) -> None:
    """One nvidia and one amd card, `count: 2, kind: any`: a lease is of one kind, so it
    never fits. It read `no capacity: needs 2 devices, 2 free — held by : remove a
    manifest…` (with memory: `most free is 8Gi … held by nobody`), as if someone held them."""
    want: dict[str, Any] = {"count": 2, **({"memory": memory} if memory else {})}
    got = place(spec(devices=want), parse_static("nvidia:0=8Gi,amd:0=8Gi"), Ledger())
    assert got == Unplaced(
        "needs 2 devices, 2 free — the node has at most 1 of one kind (nvidia: 1, amd: 1): "
        "lower devices.count or add devices (--devices / RECONCILE_DEVICES)"
    )


def test_candidates_by_id_or_key() -> None:
    inv = inventory("nvidia:0", "nvidia:1", "amd:1")
    by_id = spec(devices={"count": 1, "kind": "nvidia", "candidates": ["1"]})
    by_key = spec(devices={"count": 1, "candidates": ["amd:1"]})
    assert place_devices(by_id, inv, Ledger()) == ("nvidia:1",)
    assert place_devices(by_key, inv, Ledger()) == ("amd:1",)


def test_skips_held_devices() -> None:
    ledger = Ledger()
    ledger.take("a", ["nvidia:0"], [], False)
    got = place_devices(spec(devices={"count": 1}), inventory("nvidia:0", "nvidia:1"), ledger)
    assert got == ("nvidia:1",)


def test_no_capacity_names_every_holder() -> None:
    ledger = Ledger()
    ledger.take("a", ["nvidia:0"], [8000], False)
    ledger.take("b", ["nvidia:1"], [8001], True)
    got = place(
        spec(devices={"count": 1, "kind": "nvidia"}), inventory("nvidia:0", "nvidia:1"), ledger
    )
    assert got == Unplaced(
        "no capacity: needs 1 nvidia device, 0 free — held by a [nvidia:0]; b [nvidia:1]: "
        "remove a manifest or lower devices.count"
    )


@pytest.mark.parametrize(
    ("more", "fewer"),
    [({"replicas": 3}, "spec.replicas"), ({"autoscale": {"min": 1, "max": 4}}, "autoscale.max")],
    ids=["replicas", "autoscale"],
)
def test_no_capacity_for_a_replica_offers_fewer_replicas(more: dict[str, Any], fewer: str) -> None:
    """web@2 waiting for a card its siblings hold was told only to remove a manifest or
    lower devices.count: fewer replicas is the way out an operator looks for."""
    ledger = Ledger()
    ledger.take("web", ["nvidia:0"], [8000], False)
    ledger.take("web@1", ["nvidia:1"], [8001], False)
    want = spec(devices={"count": 1, "kind": "nvidia"}, **more)
    got = place(want, inventory("nvidia:0", "nvidia:1"), ledger)
    assert isinstance(got, Unplaced)
    assert got.reason.endswith(f": remove a manifest, lower devices.count or {fewer}"), got


def test_no_capacity_among_candidates_says_they_are_the_limit() -> None:
    """nvidia:1 is free: "0 free" alone read as a full node. The candidates read as the
    manifest writes them ([0]), not as a Python list (['0'])."""
    ledger = Ledger()
    ledger.take("a", ["nvidia:0"], [8000], False)
    want = {"count": 1, "kind": "nvidia", "candidates": ["0"]}
    got = place(spec(devices=want), inventory("nvidia:0", "nvidia:1"), ledger)
    assert got == Unplaced(
        "no capacity: needs 1 nvidia device, 0 free of candidates [0] — held by "
        "a [nvidia:0]: widen devices.candidates, remove a manifest or lower devices.count"
    )


def test_no_capacity_among_candidates_names_those_the_inventory_lacks() -> None:
    """nvidia:1 taken out of RECONCILE_DEVICES while a manifest still lists it: "0 free of
    candidates [0, 1]" read as if 1 were held by someone; it says 1 is not there."""
    ledger = Ledger()
    ledger.take("a", ["nvidia:0"], [8000], False)
    want = {"count": 1, "kind": "nvidia", "candidates": ["0", "1"]}
    got = place(spec(devices=want), inventory("nvidia:0", "nvidia:2"), ledger)
    assert got == Unplaced(
        "no capacity: needs 1 nvidia device, 0 free of candidates [0, 1] (1 not in the "
        "inventory) — held by a [nvidia:0]: widen devices.candidates, remove a manifest or "
        "lower devices.count"
    )


def test_no_device_of_that_kind() -> None:
    got = place(spec(devices={"count": 2, "kind": "amd"}), inventory("nvidia:0"), Ledger())
    assert isinstance(got, Unplaced)
    assert got.reason.startswith("needs 2 amd devices, the node has none")


def test_exact_port() -> None:
    assert place_ports(spec(port=9000), 0, Ledger()) == (9000,)


@pytest.mark.parametrize(
    ("ledger", "why"),
    [
        (Ledger(ports={9000: "a"}), "port 9000 is held by deployment a"),
        (Ledger(listening=frozenset({9000})), "port 9000 is in use by another process"),
    ],
    ids=["held-by-deployment", "foreign-listener"],
)
def test_exact_port_taken(ledger: Ledger, why: str) -> None:
    got = place_ports(spec(port=9000), 0, ledger)
    assert isinstance(got, Unplaced) and got.reason.startswith(why)
    assert "free it or choose another port" in got.reason


def test_base_port_scans_upward() -> None:
    ledger = Ledger(ports={9000: "a"}, listening=frozenset({9001}))
    assert place_ports(spec(basePort=9000), 0, ledger) == (9002,)


def test_default_base_port_is_8000() -> None:
    assert place_ports(spec(), 0, Ledger()) == (8000,)


def test_extra_ports_are_aligned_blocks_away_from_api_ports() -> None:
    # Internal ports come from their own range, one block each, so an engine that
    # scans upward from its internal port never walks into another's API port.
    ledger = Ledger(ports={9001: "a", INTERNAL_BASE: "b"})
    first, second = INTERNAL_BASE + INTERNAL_BLOCK, INTERNAL_BASE + 2 * INTERNAL_BLOCK
    assert place_ports(spec(basePort=9000), 2, ledger) == (9000, first, second)
    assert place_ports(spec(port=9000), 1, ledger) == (9000, first)


def test_a_foreign_listener_anywhere_in_a_block_skips_the_block() -> None:
    ledger = Ledger(listening=frozenset({INTERNAL_BASE + 5}))
    assert place_ports(spec(), 1, ledger) == (8000, INTERNAL_BASE + INTERNAL_BLOCK)


def test_no_free_port_left() -> None:
    ledger = Ledger(listening=frozenset({MAX_PORT}))
    got = place_ports(spec(basePort=MAX_PORT), 0, ledger)
    assert isinstance(got, Unplaced)
    assert got.reason.startswith(f"no free port from {MAX_PORT} to {MAX_PORT}: ")
    assert "basePort" in got.reason  # the next move


def test_place_does_not_mutate_the_ledger() -> None:
    ledger = Ledger()
    placed = place(spec(devices={"count": 1}), inventory("nvidia:0"), ledger)
    assert placed == Placed(("nvidia:0",), 8000)
    assert ledger.devices == {} and ledger.ports == {}


def test_ledger_for_counts_unreadable_records_as_exclusive() -> None:
    held = Record(
        name="a",
        owner="o",
        node="n",
        phase=Phase.READY,
        devices=("nvidia:0",),
        port=8000,
        extra_ports=(8001,),
        shareable=True,
    )
    gone = replace(held, name="b", phase=Phase.FAILED, port=8500)
    observed = Observed(
        foreign_devices={"nvidia:1": "old (unreadable record)"},
        foreign_ports={9000: "old (unreadable record)"},
        listening=frozenset({7000}),
    )
    ledger = ledger_for([held, gone], observed)
    assert ledger.devices == {
        "nvidia:0": [("a", True)],
        "nvidia:1": [("old (unreadable record)", False)],
    }
    assert ledger.ports == {8000: "a", 8001: "a", 9000: "old (unreadable record)"}
    assert not ledger.free_for("nvidia:1", True)
    assert ledger.port_taken(7000) == "in use by another process"


def _cluster(**nodes: int) -> Inventory:
    """A cluster's inventory (a Ray node's GPUs name their node): node -> its GPU count."""
    return Inventory(
        tuple(
            Device(kind="nvidia", id=f"{node}/{i}", node=node)
            for node, count in nodes.items()
            for i in range(count)
        ),
        source="ray",
    )


def test_a_clusters_lease_takes_its_devices_on_one_node() -> None:
    """Device order alone took a/0 and b/0 for two GPUs: two machines, where no engine
    runs (`plan` said "create", the pass then found no node for it)."""
    got = place_devices(spec(devices={"count": 2, "kind": "nvidia"}), _cluster(a=1, b=2), Ledger())
    assert got == ("nvidia:b/0", "nvidia:b/1")


def test_a_clusters_lease_larger_than_every_node_says_so_and_what_to_do() -> None:
    """Three GPUs over three free: "no capacity ... remove a manifest" sent people freeing
    GPUs that could never help. It names the largest node and the two moves that do."""
    got = place_devices(spec(devices={"count": 3, "kind": "nvidia"}), _cluster(a=1, b=2), Ledger())
    assert got == Unplaced(
        "no node has 3 devices: an engine's devices are on one node, and the most one has is "
        "2 (node b): lower spec.devices.count, or add a node with 3 GPUs",
        field="spec.devices.count",
    )


def _zoned(**nodes: tuple[int, str]) -> Inventory:
    """A cluster's inventory whose nodes carry a ``zone`` label (and ``pool: t``):
    node -> (GPUs, zone)."""
    return Inventory(
        tuple(
            Device(kind="nvidia", id=f"{node}/{i}", node=node, labels=(("pool", "t"), ("zone", z)))
            for node, (count, z) in nodes.items()
            for i in range(count)
        ),
        source="ray",
    )


WEB = {"replicas": 2, "priority": 10, "devices": {"count": 1, "kind": "nvidia"}}
POOLED = {**WEB, "nodeSelector": {"pool": "t"}}  # every node: it keeps none for itself
BATCH = {"priority": 1, "devices": {"count": 1, "kind": "nvidia"}, "nodeSelector": {"zone": "b"}}


@pytest.mark.parametrize(
    ("nodes", "web", "batch", "want"),
    [
        # The Ray trial's cluster, in both node orders: web on zone a's two GPUs, batch on
        # zone b's only one (the launch spread web@1 there: batch Pending for good).
        ({"a": (2, "a"), "b": (1, "b")}, WEB, True, {"web": "a", "web@1": "a", "batch": "b"}),
        ({"a": (1, "b"), "b": (2, "a")}, WEB, True, {"web": "b", "web@1": "b", "batch": "a"}),
        # Room on two nodes of zone a: the replicas spread over them.
        (
            {"a": (1, "a"), "b": (1, "b"), "c": (1, "a")},
            WEB,
            True,
            {"web": "a", "web@1": "c", "batch": "b"},
        ),
        # No selector-bound deployment: the replicas spread over the nodes (device order
        # alone put both on node a).
        ({"a": (2, "a"), "b": (1, "b")}, WEB, False, {"web": "a", "web@1": "b"}),
        # web bound too, to a pool of every node: its selector keeps none of them.
        ({"a": (2, "a"), "b": (1, "b")}, POOLED, True, {"web": "a", "web@1": "a", "batch": "b"}),
        # Zone b is the only room left: web (priority 10) takes it, batch waits.
        ({"a": (1, "a"), "b": (1, "b")}, WEB, True, {"web": "a", "web@1": "b", "batch": None}),
    ],
)
def test_replicas_spread_over_nodes_and_leave_a_selector_bound_deployment_its_node(
    nodes: dict[str, tuple[int, str]],
    web: dict[str, Any],
    batch: bool,
    want: dict[str, str | None],
) -> None:
    inv = _zoned(**nodes)
    specs = {"web": spec(**web), "batch": spec(**BATCH)} if batch else {"web": spec(**web)}
    selectors = bound_selectors(specs.values())
    ledger, got = Ledger(), {}
    for name in want:  # in priority order, as the planner places them
        deployment = name.partition("@")[0]
        placed = place_devices(specs[deployment], inv, ledger, Spread(deployment, selectors))
        if isinstance(placed, Unplaced):
            got[name] = None
            continue
        ledger.take(name, placed, (), False)
        got[name] = inv.by_key()[placed[0]].node
    assert got == want


def test_a_start_takes_a_node_holding_its_files_first_after_a_selector_bound_ones() -> None:
    """The plan gave a deployment with pulled files the first free device, while its
    launch went to a node holding them: ``Spread.near`` (``PullView.nodes``) puts it
    there, a replica too, before spreading; not on a node a selector-bound deployment
    needs (its launch pulls the files to the plan's node then)."""
    inv = _zoned(a=(2, "a"), b=(1, "a"), c=(1, "b"))
    one = spec(**{**WEB, "replicas": 1})
    assert place_devices(one, inv, Ledger()) == ("nvidia:a/0",)
    assert place_devices(one, inv, Ledger(), Spread("web", near=frozenset({"b"}))) == (
        "nvidia:b/0",
    )
    ledger = Ledger()
    ledger.take("web", ("nvidia:a/0",), (), False)
    near = Spread("web", near=frozenset({"a"}))  # web@1: beside its sibling, by its files
    assert place_devices(spec(**WEB), inv, ledger, near) == ("nvidia:a/1",)
    kept = Spread("web", bound_selectors([spec(**BATCH)]), frozenset({"c"}))
    assert place_devices(one, inv, Ledger(), kept) == ("nvidia:a/0",)


def test_a_node_selector_picks_a_clusters_devices_by_their_nodes_labels() -> None:
    """The plan gave a selector-bound deployment any node's GPU; Ray's label filter then
    put it elsewhere than `plan` said."""
    inv = _zoned(a=(1, "a"), b=(1, "b"))
    assert place_devices(spec(**BATCH), inv, Ledger()) == ("nvidia:b/0",)
    held = Ledger()
    held.take("other", ("nvidia:b/0",), (), False)
    got = place_devices(spec(**BATCH), inv, held)
    assert isinstance(got, Unplaced), got
    assert "0 free on the nodes matching nodeSelector zone=b — held by other" in got.reason
    got = place_devices(spec(**{**BATCH, "nodeSelector": {"zone": "c"}}), inv, Ledger())
    assert got == Unplaced(
        "no node with nvidia devices matches nodeSelector zone=c; theirs: zone=a (1), "
        "zone=b (1): label one, or change spec.nodeSelector"
    )
