"""A gateway that stops answering (SIGSTOP here; a deadlock leaves its control socket as
silent) while its metrics file keeps its last counters: the daemon's ``/metrics`` served
those flat counters as if live, and nothing said the gateway had stopped. A scrape now
says so, as Prometheus' ``up`` and node_exporter's ``node_textfile_mtime_seconds`` do:
``reconcile_gateway_up`` 0 and ``reconcile_gateway_metrics_timestamp_seconds`` the file's
last write, no later than the stop (``time() - x`` grows); SIGCONT and it is up again."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from test_once_metrics import served
from test_process import gateway_pids, streaming

from controller.gateway.lifecycle import registry
from controller.store.config import accesstoken

UP = "reconcile_gateway_up"
AT = "reconcile_gateway_metrics_timestamp_seconds"
WAIT = 60.0  # seconds, for a box at load 20+: the waits poll, this is only their cap


def figures(url: str) -> dict[str, float]:
    """One real scrape: the two gauges, and alpha's requests as ``served``. A stopped
    gateway's answer is waited for (handover.TALK_TIMEOUT, 5 s) before its file is read."""
    with urllib.request.urlopen(url, timeout=WAIT) as answer:
        text = answer.read().decode()
    return {**gauges(text), "served": served(text, "alpha")}


def gauges(text: str) -> dict[str, float]:
    """``reconcile_gateway_up`` and its timestamp in a Prometheus text."""
    return {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name in (UP, AT)
    }


def stopped(pid: int) -> bool:
    """The kernel has stopped ``pid`` (state T): a signal's delivery is not its kill()."""
    state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    return state == "T"


def test_a_stopped_gateway_reads_down_with_its_last_write_not_as_live(
    reconcile: Any, gateway: Any
) -> None:
    reconcile.write("alpha")
    port = reconcile.port + 14
    g = gateway("--metrics-port", str(port))
    g.wait_phase("alpha", "Ready")
    assert g.post("alpha").status == 200
    url = f"http://127.0.0.1:{port}/metrics?token={accesstoken.read(reconcile.state)}"
    asked = time.time()
    live = reconcile.wait_for(
        lambda: (f := figures(url))["served"] == 1 and f, timeout=WAIT, what="1 served"
    )
    assert live[UP] == 1, live
    assert live[AT] >= round(asked, 3) - 0.001, (live, asked)  # rendered for this scrape
    # The file holds the request too: what a scrape falls back on is the same figures.
    reconcile.wait_for(
        lambda: served(registry.metrics_text(reconcile.state), "alpha") == 1,
        timeout=WAIT,
        what="alpha's request in the gateway's metrics file",
    )
    pid = g.serving().ref.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        reconcile.wait_for(lambda: stopped(pid), timeout=WAIT, what=f"pid {pid} stopped")
        since = time.time()
        down = figures(url)
        assert down[UP] == 0, down
        assert down["served"] == 1, down  # its last counters, said to be its file's
        assert 0 < down[AT] <= since, (down, since)
        later = figures(url)
        assert (later[UP], later[AT]) == (0, down[AT]), (later, down)  # age grows
    finally:
        os.kill(pid, signal.SIGCONT)
    back = reconcile.wait_for(
        lambda: (f := figures(url))[UP] == 1 and f, timeout=WAIT, what="up again"
    )
    assert back[AT] > since and back["served"] == 1, back
    g.finish()


def test_a_cron_pass_beside_a_stopped_gateway_says_its_series_are_its_files(
    reconcile: Any, gateway: Any
) -> None:
    """A cron pass read the file of a gateway alive but stopped and wrote its last
    counters as live ones: it asks the gateway now, and says ``reconcile_gateway_up 0``
    with the file's last write, then 1 once the gateway answers again."""
    streaming(reconcile, "alpha")
    g = gateway()
    g.wait_phase("alpha", "Ready")
    assert g.post("alpha").status == 200
    assert g.stop() == 0  # the daemon ends; its gateway serves on (cron takes over)
    own = reconcile.state / "gateway" / "metrics.prom"
    reconcile.wait_for(lambda: served(own.read_text(), "alpha") == 1, timeout=WAIT, what="1")
    prom = reconcile.tmp / "reconcile.prom"
    pid = g.serving().ref.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        reconcile.wait_for(lambda: stopped(pid), timeout=WAIT, what=f"pid {pid} stopped")
        since = time.time()
        reconcile.once("--metrics-file", str(prom))
        text = prom.read_text()
    finally:
        os.kill(pid, signal.SIGCONT)
    assert served(text, "alpha") == 1, text  # its last counters, said to be its file's
    down = gauges(text)
    assert down[UP] == 0 and 0 < down[AT] <= since, (down, since)
    asked = time.time()
    reconcile.once("--metrics-file", str(prom))
    up = gauges(prom.read_text())
    assert up[UP] == 1 and up[AT] >= round(asked, 3) - 0.001, (up, asked)
    reconcile.down("--gateway")
    assert gateway_pids(reconcile) == set()
    reconcile.down()
