"""Two nodes that run one deployment name, scraped by one real Prometheus in one job as
examples/grafana/prometheus.yml has it (``honor_labels``: a series keeps its own
``instance``, the replica, so the scrape target's is not on it): each node's
per-instance series stay apart, told apart by their ``node`` label. They carried
(deployment, instance) alone, so both nodes' ``web`` were one series in Prometheus
(``count(reconcile_deployment_ready)`` said 1 where two replicas ran, their values
interleaved by scrape), for the daemon's families and the gateway's alike.
"""

from __future__ import annotations

import json
import shutil
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import missing
import yaml
from procs import free_ports

from controller.store.config import accesstoken
from tests.conftest import Reconcile, _nothing_left
from tests.gateway.conftest import Gateway, Gateways

EXAMPLE = Path(__file__).parents[2] / "examples" / "grafana" / "prometheus.yml"
SEEN = 90.0  # seconds for both targets' series to be in Prometheus (a box at load 20)


@contextmanager
def one_job(rc: Any, token: Path, targets: list[str]) -> Iterator[str]:
    """A real Prometheus scraping ``targets`` every second in the example's one job."""
    config = yaml.safe_load(EXAMPLE.read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    job = config["scrape_configs"][0]
    assert job["honor_labels"] is True  # what this test is about
    job["authorization"]["credentials_file"] = str(token)
    job["static_configs"] = [{"targets": targets}]
    folder = rc.tmp / "prometheus"
    folder.mkdir()
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{free_ports(1)}"
    argv = ["prometheus", f"--config.file={folder / 'prometheus.yml'}"]
    argv += [f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address={url[7:]}"]
    with open(folder / "prometheus.log", "wb") as log:
        proc = rc.spawn(argv, stderr=log, stdout=log)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def series(url: str, expr: str) -> list[dict[str, str]] | None:
    """The label sets ``expr`` returns now (None: Prometheus not answering yet)."""
    query = urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=5) as answer:
            found = json.load(answer)["data"]["result"]
    except OSError:
        return None
    return [item["metric"] for item in found]


def node_with_web(rc: Any, gateways: Gateways, token: str) -> tuple[Gateway, int]:
    """``rc``'s daemon and gateway serving one ``web``, its metrics port; the node's
    access token set to ``token`` first (one job has one credential)."""
    rc.state.mkdir(parents=True, exist_ok=True)
    accesstoken.path(rc.state).write_text(token)
    accesstoken.path(rc.state).chmod(0o600)
    rc.write("web")
    metrics_port = rc.port + 14
    g = gateways("--metrics-port", str(metrics_port))
    g.wait_phase("web", "Ready")
    assert g.post("web").status == 200  # the gateway has routed it: its in-flight series
    return g, metrics_port


def test_one_deployment_name_on_two_nodes_is_two_series_in_one_job(
    reconcile: Any, gateway: Gateways, tmp_path: Path
) -> None:
    if shutil.which("prometheus") is None:  # scripts/system-packages installs it
        missing.skip("prometheus", "apt-get install prometheus")
    (tmp_path / "b").mkdir()
    other = Reconcile(tmp_path / "b")
    others = Gateways(other)
    token = "shared-by-the-fleet-" + other.node
    try:
        a, port_a = node_with_web(reconcile, gateway, token)
        b, port_b = node_with_web(other, others, token)
        shared = reconcile.tmp / "token"
        shared.write_text(token)
        with one_job(reconcile, shared, [f"127.0.0.1:{port_a}", f"127.0.0.1:{port_b}"]) as url:
            nodes = {reconcile.node, other.node}
            for name in ("reconcile_deployment_ready", "reconcile_gateway_inflight"):
                expr = f'{name}{{deployment="web",instance="web"}}'

                def both(expr: str = expr) -> bool:
                    found = series(url, expr)
                    return found is not None and {s.get("node") for s in found} == nodes

                reconcile.wait_for(both, timeout=SEEN, what=f"{expr} of each node")
                assert len(series(url, expr) or []) == 2, series(url, expr)
        a.finish()
        b.finish()
    finally:
        others.kill_all()
        other.down()  # its engines, had the test failed before b.finish()
        _nothing_left(other)
