"""What differs between backends is a property, never a comparison of a backend's name.

Outside ``controller/backends/`` and ``core/manifest/backendnames.py`` no module compares a string
with "local" or "ray": it asks a ``Backend`` property (``places_engines``,
``exits_watchable``, ``selects_nodes``), a record's ``on_cluster`` or
``backendnames.on_cluster``. The scan reads the code with ``ast`` (nothing runs), so a
new comparison fails here, not in review.
"""

from __future__ import annotations

import ast
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from procs import kill_marked
from strategies import entry, record

from controller.backends.choose import inventory_for
from controller.backends.local.runtime import LocalBackend
from controller.core.manifest import backendnames
from controller.core.manifest.cluster import cluster_refusals
from controller.reconciler.run import Reconciler
from controller.store.config.node import Config
from controller.store.instances.events import Journal
from controller.store.instances.records import RecordStore
from controller.store.sources.manifests import load

PACKAGE = Path(__file__).resolve().parents[2] / "controller"
# The only places that may spell a backend's name in a comparison.
ALLOWED = (PACKAGE / "backends", PACKAGE / "core" / "backendnames.py")
NAMES = frozenset(backendnames.NAMES)


def _names_in(node: ast.expr) -> bool:
    """``node`` is a backend name, or a tuple/list/set holding one (``x in ("ray", ...)``)."""
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_in(e) for e in node.elts)
    return False


def _decides_on_a_name(node: ast.AST) -> bool:
    if isinstance(node, ast.Compare):
        return any(_names_in(e) for e in (node.left, *node.comparators))
    return isinstance(node, ast.MatchValue) and _names_in(node.value)


def name_comparisons(source: str) -> list[int]:
    """Lines where ``source`` compares something with a backend's name (or matches on one)."""
    return [n.lineno for n in ast.walk(ast.parse(source)) if _decides_on_a_name(n)]


def _checked() -> list[Path]:
    return [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if not any(p == a or a in p.parents for a in ALLOWED)
    ]


def test_no_module_above_the_backends_compares_a_backend_name() -> None:
    found = [
        f"{p.relative_to(PACKAGE.parent)}:{line}"
        for p in _checked()
        for line in name_comparisons(p.read_text())
    ]
    assert not found, f"ask a Backend property or Record.on_cluster instead: {found}"


def test_the_scan_covers_the_layers_above_the_backends() -> None:
    checked = {p.relative_to(PACKAGE).parts[0] for p in _checked()}
    assert {"cli", "daemon", "gateway", "reconciler", "store", "host", "core"} <= checked
    assert "backends" not in checked


@pytest.mark.parametrize(
    "planted",
    [
        'if rec.backend == "ray":\n    pass\n',
        'ok = "local" != cfg.backend\n',
        'ok = cfg.backend in ("local", "ray")\n',
        'match cfg.backend:\n    case "ray":\n        pass\n',
    ],
)
def test_the_scan_catches_a_planted_comparison(planted: str) -> None:
    assert name_comparisons(planted)


def test_the_scan_leaves_a_name_that_is_only_data_alone() -> None:
    """A default value or a keyword argument carries the name; it decides nothing."""
    assert not name_comparisons('backend: str = "local"\nInventory((), source="ray")\n')


def test_the_local_backend_places_nothing_itself_and_watches_its_children() -> None:
    assert LocalBackend.name == backendnames.LOCAL
    assert LocalBackend.places_engines is False
    assert LocalBackend.exits_watchable is True
    assert LocalBackend.selects_nodes is False  # nodeSelector is node.yaml's: a fleet's share


def test_the_ray_backend_places_engines_and_cannot_watch_their_pids() -> None:
    pytest.importorskip("ray")
    from controller.backends.ray.backend import RayBackend

    assert RayBackend.name == backendnames.RAY
    assert RayBackend.places_engines is True
    assert RayBackend.exits_watchable is False
    assert RayBackend.selects_nodes is True  # nodeSelector is matched against Ray's nodes


def test_a_name_is_a_cluster_name_only_for_a_cluster_backend() -> None:
    assert backendnames.on_cluster(backendnames.RAY)
    assert not backendnames.on_cluster(backendnames.LOCAL)
    assert not backendnames.on_cluster("nonsense")  # an unknown name is refused elsewhere
    assert set(backendnames.NAMES) == {"local", "ray"}  # the record contract's values


def test_a_records_backend_says_whether_it_is_on_a_cluster() -> None:
    local = record("web", backend=backendnames.LOCAL, node="node-a")
    remote = record("web", backend=backendnames.RAY, node="f" * 56)
    assert not local.on_cluster and remote.on_cluster
    # a local record another node made is never judged here; any node judges a cluster's
    assert local.elsewhere("node-b") and not local.elsewhere("node-a")
    assert not remote.elsewhere("node-b")


def test_only_a_cluster_refuses_an_exact_port() -> None:
    pinned = entry("web", port=8000).deployment.spec
    assert cluster_refusals(pinned, backendnames.LOCAL) == []
    assert [f for f, _ in cluster_refusals(pinned, backendnames.RAY)] == ["spec.port"]


class _PlacingLocal(LocalBackend):
    """A local backend that says it placed the engine itself, as a cluster's does."""

    places_engines = True


@pytest.mark.parametrize("backend", [LocalBackend, _PlacingLocal])
def test_the_spawn_event_names_the_node_only_when_the_backend_placed_it(
    tmp_path: Path, backend: type[LocalBackend]
) -> None:
    node = f"t-{uuid.uuid4().hex[:12]}"
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    doc = {
        "apiVersion": "reconcile/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "engine": "command",
            "command": [sys.executable, "-c", "import time; time.sleep(60)"],
            "readiness": {"tcpSocket": {}, "deadlineSeconds": 30},
            "stopGracePeriodSeconds": 1,
        },
    }
    (manifests / "web.yaml").write_text(yaml.safe_dump(doc))
    state = tmp_path / "state"
    config = Config(
        manifests=(manifests,), state_dir=state, node=node, devices="nvidia:0", owner="names-test"
    )
    reconciler = Reconciler(config, backend(state, node), inventory_for(config))
    try:
        reconciler.run_pass()
        assert RecordStore(state).read("web") is not None
        spawned = [e for e in Journal(state).read("web") if "spawned" in str(e.get("outcome"))]
        assert len(spawned) == 1, spawned
        assert str(spawned[0]["reason"]).startswith("node ") is backend.places_engines
    finally:
        reconciler.down()
        kill_marked(f"{node}/")


class _SelectingLocal(LocalBackend):
    """A local backend that says it matches nodeSelector against its own nodes, as Ray's
    does (its labels are Ray's, tests/ray proves the match itself)."""

    selects_nodes = True


@pytest.mark.parametrize("backend", [LocalBackend, _SelectingLocal])
def test_node_yaml_labels_share_the_deployments_only_when_the_backend_does_not_select(
    tmp_path: Path, backend: type[LocalBackend]
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    for name, selector in (("mine", {"gpu": "h100"}), ("theirs", {"gpu": "a10"})):
        doc = {
            "apiVersion": "reconcile/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {"engine": "command", "command": ["true"], "nodeSelector": selector},
        }
        (manifests / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    state = tmp_path / "state"
    config = Config(
        manifests=(manifests,),
        state_dir=state,
        node="n",
        devices="nvidia:0",
        owner="names-test",
        labels={"gpu": "h100"},
    )
    preview = Reconciler(config, backend(state, "n"), inventory_for(config))
    desired = preview.desired(load(config.manifests))
    if backend.selects_nodes:  # every deployment is the cluster's: none is another node's
        assert set(desired.entries) == {"mine", "theirs"} and desired.skipped == {}
    else:
        assert set(desired.entries) == {"mine"} and desired.skipped == {"theirs": "gpu=a10"}
    assert desired.prune
