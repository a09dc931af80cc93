"""Metrics: the textfile after each pass and the daemon's /metrics, read back with the
Prometheus text parser (prometheus_client.parser).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.core.devices.inventory import Device, Inventory
from controller.core.state import Phase, Record
from controller.daemon.metrics import PassFigures, render
from controller.store.config import accesstoken


def one_pass(
    records: list[Record], inventory: Inventory, node: str = "n", revision: str = ""
) -> str:
    """The metrics of one converged pass over ``records``."""
    figures = PassFigures(
        records=records,
        inventory=inventory,
        node=node,
        revision=revision,
        seconds=0.1,
        ok=True,
        now=1.0,
        last_ok=1.0,
        manifest_errors=0,
        drained=False,
    )
    return render(figures)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: dict[Any, float], name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]


def of(instance: str, deployment: str | None = None, node: str = "n") -> dict[str, str]:
    """The labels of a per-instance series: a replica names its node (one_pass's "n"),
    its deployment and itself."""
    return {"node": node, "deployment": deployment or instance, "instance": instance}


def test_metrics_file_after_each_pass(reconcile: Any) -> None:
    rc = reconcile
    prom = rc.tmp / "textfile" / "reconcile.prom"
    prom.parent.mkdir()
    rc.write("web", devices={"count": 1, "kind": "nvidia"})
    rc.write("huge", devices={"count": 3, "kind": "nvidia"}, basePort=rc.port + 4)
    before = time.time()
    rc("--once", "--metrics-file", str(prom), check=1)  # huge cannot be placed
    found = samples(prom.read_text())
    assert value(found, "reconcile_deployments", phase="Pending") == 1
    assert sum(value(found, "reconcile_deployments", phase=str(p)) for p in Phase) == 2
    huge, web = of("huge", node=rc.node), of("web", node=rc.node)
    assert value(found, "reconcile_deployment_phase", **huge, phase="Pending") == 1
    assert value(found, "reconcile_deployment_restarts_total", **web) == 0
    assert value(found, "reconcile_devices", kind="nvidia", state="held") == 1
    assert value(found, "reconcile_devices", kind="nvidia", state="free") == 1
    assert value(found, "reconcile_last_pass_ok") == 0
    assert value(found, "reconcile_last_pass_duration_seconds") > 0
    assert value(found, "reconcile_passes_total") == 1
    assert value(found, "reconcile_actions_total", action="start", outcome="ok") == 1
    assert value(found, "reconcile_actions_total", action="pending", outcome="ok") >= 1
    assert value(found, "reconcile_last_pass_timestamp_seconds") >= before - 1
    assert value(found, "reconcile_last_successful_pass_timestamp_seconds") == 0  # never yet
    assert value(found, "reconcile_info", node=rc.node, revision="") == 1
    assert oct(prom.stat().st_mode & 0o777) == "0o644"  # node_exporter runs as another user
    assert [p.name for p in prom.parent.iterdir()] == ["reconcile.prom"]  # no temp files left

    (rc.manifests / "huge.yaml").unlink()
    rc("--once", "--wait", "--timeout", "30s", "--metrics-file", str(prom), check=0)
    ok_at = value(samples(prom.read_text()), "reconcile_last_successful_pass_timestamp_seconds")
    assert ok_at >= before - 1

    rc.write("bad", command="not a list")  # invalid: the pass fails, the last success stays
    rc("--once", "--metrics-file", str(prom), check=1)
    found = samples(prom.read_text())
    assert (
        value(found, "reconcile_manifest_errors") == 1
        and value(found, "reconcile_last_pass_ok") == 0
    )
    assert value(found, "reconcile_last_successful_pass_timestamp_seconds") == ok_at
    assert value(found, "reconcile_passes_total") >= 3  # carried over the file: cron passes
    assert value(found, "reconcile_actions_total", action="start", outcome="ok") == 1
    assert value(found, "reconcile_deployment_ready", **web) == 1
    rc.down()


def test_daemon_serves_metrics(reconcile: Any) -> None:
    rc = reconcile
    port = rc.port + 10
    daemon = rc.daemon("--metrics-port", f"127.0.0.1:{port}", "--resync", "1s")

    def scrape() -> str | None:
        try:
            token = accesstoken.read(rc.state)  # /metrics wants the state dir's token
            with urllib.request.urlopen(f"{base}/metrics?token={token}", timeout=2) as r:
                assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                body: str = r.read().decode()
                return body if "reconcile_last_pass_duration_seconds" in body else None
        except OSError:  # FileNotFoundError too: no token before the daemon's start
            return None

    base = f"http://127.0.0.1:{port}"
    text = rc.wait_for(scrape, timeout=30, what="/metrics")
    assert value(samples(text), "reconcile_deployments", phase="Ready") == 0
    assert daemon.poll() is None
    with pytest.raises(urllib.error.HTTPError) as other:  # a 2xx would slip past a bare try
        urllib.request.urlopen(f"{base}/other", timeout=2)
    other.value.close()
    assert other.value.code == 404
    daemon.terminate()
    daemon.wait(timeout=30)


def test_metrics_beyond_loopback_warns_of_the_token_in_clear(reconcile: Any) -> None:
    """``--metrics-port 0.0.0.0:PORT`` serves plain HTTP, and each scrape carries the
    state dir's access token: the start warns, as the gateway's does for a plain
    non-loopback ``--listen``; a loopback bind does not. It said nothing."""
    rc = reconcile
    port = rc.port + 10
    for host, warned in (("0.0.0.0", True), ("127.0.0.1", False)):
        log = rc.tmp / f"daemon-{host}.log"
        with open(log, "wb") as err:
            daemon = rc.daemon("--metrics-port", f"{host}:{port}", stderr=err)
        try:
            rc.wait_for(lambda log=log: "serving metrics" in log.read_text(), what="/metrics")
            rc.wait_for(lambda log=log: "daemon started" in log.read_text(), what="the start")
            text = log.read_text()
            said = f"--metrics-port {host}:{port} speaks plain HTTP to other machines"
            assert (text.count("metrics without TLS"), said in text) == (warned, warned), text
        finally:
            daemon.terminate()
            assert daemon.wait(timeout=30) == 0


def test_readme_has_prometheus_hold_the_token_in_a_file_not_a_url_param() -> None:
    """README offered ``params: {token: [T]}`` beside the credentials file: Prometheus
    then shows the token to whoever reads its targets page or API (``scrapeUrl``,
    ``__param_token``; checked with a real Prometheus scraping a daemon), and the token
    opens the web page's buttons too. It names the file, and the param only to warn."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    metrics = readme.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    assert "authorization: {credentials_file: " in metrics, metrics[:2000]
    assert metrics.count("params:") == metrics.count("Not `params: {token") == 1, metrics


def test_metrics_port_is_for_the_daemon(reconcile: Any) -> None:
    result = reconcile("--once", "--metrics-port", "9", check=64)
    assert "--metrics-file" in result.err
    # A malformed value is a usage error (64) of one line, as every bad flag value is.
    bad = reconcile("--once", "--metrics-port", "x:y", check=64).err
    assert "--metrics-port" in bad and "HOST:PORT" in bad and "Traceback" not in bad


def test_label_values_are_escaped_for_the_parser(tmp_path: Path) -> None:
    rec = Record(name="web", owner="o", node="n", phase=Phase.READY)
    text = one_pass([rec], Inventory(), node='odd "node"\\with\nnewline', revision="abc")
    found = samples(text)
    assert value(found, "reconcile_info", node='odd "node"\\with\nnewline', revision="abc") == 1


def test_replicas_are_instances_of_their_deployment() -> None:
    """Each record its own series (instance), each deployment its replica counts."""
    recs = [
        Record(name="web", owner="o", node="n", phase=Phase.READY, restarts=1),
        Record(name="web@1", owner="o", node="n", phase=Phase.READY),
        Record(name="web@2", owner="o", node="n", phase=Phase.PENDING),
        Record(name="solo", owner="o", node="n", phase=Phase.STARTING),
        Record(name="zero", owner="o", node="n", phase=Phase.IDLE),  # replicas: 0
    ]
    text = one_pass(recs, Inventory())
    found = samples(text)
    desired = {"web": 3, "solo": 1, "zero": 0}
    ready = {"web": 2, "solo": 0, "zero": 0}
    for name in desired:
        assert value(found, "reconcile_deployment_replicas", deployment=name) == desired[name]
        assert value(found, "reconcile_deployment_ready_replicas", deployment=name) == ready[name]
    assert value(found, "reconcile_deployment_ready", **of("web@1", "web")) == 1
    assert value(found, "reconcile_deployment_ready", **of("web@2", "web")) == 0
    assert value(found, "reconcile_deployment_phase", **of("web@2", "web"), phase="Pending") == 1
    assert value(found, "reconcile_deployment_restarts_total", **of("web")) == 1
    assert value(found, "reconcile_deployments", phase="Ready") == 2  # instances, not sets


def test_device_memory_total_and_leased() -> None:
    """Declared memory is exported per device; a record's memory request is its lease,
    one with none holds the whole device, and a device of unknown memory has no series."""
    gib = 1 << 30
    inventory = Inventory(
        devices=(
            Device(kind="nvidia", id="0", memory=80 * gib),
            Device(kind="nvidia", id="1", memory=24 * gib),
            Device(kind="nvidia", id="2"),
        )
    )
    recs = [
        Record(name="a", owner="o", node="n", phase=Phase.READY, devices=("nvidia:0",), memory=gib),
        Record(name="b", owner="o", node="n", phase=Phase.READY, devices=("nvidia:1",)),
        Record(name="c", owner="o", node="n", phase=Phase.FAILED, devices=(), memory=gib),
    ]
    text = one_pass(recs, inventory)
    found = samples(text)
    name = "reconcile_device_memory_bytes"
    assert value(found, name, device="nvidia:0", state="total") == 80 * gib
    assert value(found, name, device="nvidia:0", state="leased") == gib
    assert value(found, name, device="nvidia:1", state="leased") == 24 * gib
    assert not [k for k in found if k[0] == name and ("device", "nvidia:2") in k[1]]


def test_a_crash_loop_is_no_successful_pass(reconcile: Any) -> None:
    """`--once` exits 1 for an engine crash-looping (cron mails), but the metrics said the
    pass converged (`reconcile_last_pass_ok` 1, the last success moving on), so the
    README's alert on `reconcile_last_successful_pass_timestamp_seconds` never fired."""
    rc = reconcile
    prom = rc.tmp / "reconcile.prom"
    rc.write("crashy", command=["sh", "-c", "exit 3"])

    def looping() -> bool:
        result = rc("--once", "--metrics-file", str(prom), check=None)
        return result.code == 1 and "crashy" in result.err

    rc.wait_for(looping, timeout=60, what="--once says crashy crash-loops")
    found = samples(prom.read_text())
    assert value(found, "reconcile_last_pass_ok") == 0, prom.read_text()
    last = value(found, "reconcile_last_pass_timestamp_seconds")
    assert value(found, "reconcile_last_successful_pass_timestamp_seconds") < last
    rc.down()
