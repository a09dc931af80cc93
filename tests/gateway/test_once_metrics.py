"""A cron pass's ``--metrics-file`` beside a gateway that outlived its daemon: the gateway's
series are in the textfile, as in the daemon's (README "Metrics", the gateway's section)."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from test_process import gateway_pids, streaming


def served(text: str, deployment: str) -> float:
    """``reconcile_gateway_requests_total`` of ``deployment`` in a Prometheus text."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "reconcile_gateway_requests_total"
        and sample.labels.get("deployment") == deployment
    )


def test_a_cron_pass_writes_the_series_of_the_gateway_left_serving(
    reconcile: Any, gateway: Any
) -> None:
    streaming(reconcile, "alpha")
    g = gateway()
    g.wait_phase("alpha", "Ready")
    assert g.post("alpha").status == 200
    assert g.stop() == 0  # the daemon ends; its gateway serves on (cron takes over)
    assert g.post("alpha").status == 200
    own = reconcile.state / "gateway" / "metrics.prom"
    reconcile.wait_for(lambda: served(own.read_text(), "alpha") == 2, what="2 counted")
    prom = reconcile.tmp / "reconcile.prom"
    reconcile.once("--metrics-file", str(prom))
    text = prom.read_text()
    assert served(text, "alpha") == 2, text
    assert "reconcile_passes_total 1.0" in text  # the pass's own series beside them
    # A gateway no longer alive leaves stale counters behind: not exported.
    reconcile.down("--gateway")
    assert gateway_pids(reconcile) == set()
    reconcile.once("--metrics-file", str(prom))  # it starts alpha again
    assert "reconcile_gateway_" not in prom.read_text()
    reconcile.down()
