"""A cron pass's ``--metrics-file``, or a daemon's ``--metrics-file`` and ``--metrics-port``
without ``--listen``, beside a gateway that outlived its daemon: the gateway's series are
in them, as in the metrics of the daemon that runs it (README "Metrics", the gateway's
section)."""

from __future__ import annotations

import signal
import urllib.request
from typing import Any

from procs import free_ports
from prometheus_client.parser import text_string_to_metric_families
from test_process import gateway_pids, streaming

from controller.store.config import accesstoken


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


def test_a_daemon_without_listen_exports_the_gateway_left_serving(
    reconcile: Any, gateway: Any
) -> None:
    """A daemon started without ``--listen`` leaves the gateway an earlier daemon left
    serving; its textfile and /metrics carry that gateway's series (they had none)."""
    streaming(reconcile, "alpha")
    g = gateway()
    g.wait_phase("alpha", "Ready")
    assert g.post("alpha").status == 200
    assert g.stop() == 0  # the daemon ends; its gateway serves on
    own = reconcile.state / "gateway" / "metrics.prom"
    reconcile.wait_for(lambda: served(own.read_text(), "alpha") == 1, what="1 counted")
    prom, port = reconcile.tmp / "daemon.prom", free_ports(1)
    daemon = reconcile.daemon(
        "--resync", "1h", "--metrics-file", str(prom), "--metrics-port", f"127.0.0.1:{port}"
    )
    reconcile.wait_for(
        lambda: prom.exists() and served(prom.read_text(), "alpha") == 1,
        what="the gateway's series in the daemon's textfile",
    )
    assert g.post("alpha").status == 200  # the daemon left it serving
    url = f"http://127.0.0.1:{port}/metrics?token={accesstoken.read(reconcile.state)}"
    reconcile.wait_for(
        lambda: served(urllib.request.urlopen(url, timeout=5).read().decode(), "alpha") == 2,
        what="the gateway's series, counted on, at the daemon's /metrics",
    )
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=60) == 0
    reconcile.down("--gateway")
    assert gateway_pids(reconcile) == set()
    reconcile.down()
