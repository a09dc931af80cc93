"""The autoscaler's remembered count (``<state>/scale/<name>.json``) lives as long as its
deployment: a recreate keeps it, a pruned deployment takes it along (an HPA goes with its
Deployment), so a later manifest of the same name starts from its own spec's count.

The count is written through the store as the autoscaler writes it (load through a
gateway is tests/gateway/test_autoscaling.py's); everything else is the real CLI.
"""

from __future__ import annotations

from typing import Any

from controller.core.scaling.autoscale import Scale
from controller.store.side import scale

AUTOSCALE = {"min": 1, "max": 3}
TWO = Scale(count=2, changed_at=1.0, reason="scaled 1→2: 9.0 in flight on 1 Ready replica")


def test_a_recreate_keeps_the_count_and_a_prune_drops_it(reconcile: Any) -> None:
    reconcile.write("web", autoscale=AUTOSCALE)
    reconcile.converge()
    scale.write(reconcile.state, "web", TWO)
    reconcile.converge()
    assert sorted(reconcile.status()) == ["web", "web@1"]  # the count is the kept one

    # A spec change recreates both replicas: the deployment and its count remain.
    reconcile.write("web", autoscale=AUTOSCALE, env={"CHANGED": "1"})
    reconcile.converge()
    assert sorted(reconcile.status()) == ["web", "web@1"]
    assert scale.read_all(reconcile.state)["web"].count == 2

    # The manifest removed: the records are pruned and the count with them.
    (reconcile.manifests / "web.yaml").unlink()
    reconcile.once("--allow-empty")
    assert reconcile.status() == {}
    assert not (reconcile.state / "scale" / "web.json").exists()

    # A new deployment of the same name starts from its own spec (min 1), not from 2.
    reconcile.write("web", autoscale=AUTOSCALE)
    reconcile.converge()
    assert sorted(reconcile.status()) == ["web"]
    reconcile.down()


def test_a_replica_scaled_away_keeps_the_deployments_count(reconcile: Any) -> None:
    """Only the deployment's prune drops its count, not the Stop of one of its replicas."""
    reconcile.write("web", autoscale=AUTOSCALE)
    reconcile.converge()
    scale.write(reconcile.state, "web", TWO)
    reconcile.converge()
    scale.write(reconcile.state, "web", Scale(count=1, changed_at=2.0, reason="scaled 2→1"))
    reconcile.converge()
    assert sorted(reconcile.status()) == ["web"]
    assert scale.read_all(reconcile.state)["web"].count == 1
    reconcile.down()


def test_a_torn_or_lost_count_is_taken_from_the_replicas_running(reconcile: Any) -> None:
    """The count's file torn (quarantined) or removed: the pass started again from the
    spec's count and stopped the replicas above it at once, healthy and under whatever
    load, with no scaleDownDelay. The replicas the records hold are the count now."""
    reconcile.write("web", autoscale=AUTOSCALE)
    reconcile.converge()
    scale.write(reconcile.state, "web", TWO)
    reconcile.converge()
    pids = {name: item["pid"] for name, item in reconcile.status().items()}
    assert sorted(pids) == ["web", "web@1"], pids
    kept = reconcile.state / "scale" / "web.json"
    for damage in ('{"version": 1, "count": ', None):
        if damage is None:
            kept.unlink(missing_ok=True)
        else:
            kept.write_text(damage)
        reconcile.once()
        after = {name: item["pid"] for name, item in reconcile.status().items()}
        assert after == pids, (damage, after)
    reconcile.down()
