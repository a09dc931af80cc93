"""examples/grafana against a real Prometheus (issue 39): the real daemon and gateway
process under load through the gateway (the stand-in engine, streams and errors, its
own vLLM-style /metrics, a model pulled from a local server), Prometheus scraping the
daemon's ``--metrics-port`` (which carries the gateway's series too) with the access
token as ``examples/grafana/prometheus.yml`` says; then every target of every panel,
with Grafana's variables filled in by ``examples/grafana/render.py``, returns a series
from Prometheus' HTTP API, and the render script draws each panel. The dashboard JSON
is also checked for the fields Grafana's import needs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import missing
import yaml
from modelservers import serving
from procs import free_ports, kill_marked

from controller.pull import launch

EXAMPLE = Path(__file__).parents[2] / "examples" / "grafana"
DATA = os.urandom(64 * 1024)
ENGINE_METRICS = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="alpha"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="alpha"} 0.25
"""
STEP = 2  # seconds a point of the range queries; $__rate_interval is four of them
PANEL_WAIT = 90.0  # the engines' /metrics are read every 5 s, a rate wants two scrapes
GRID = 24  # Grafana's dashboard is 24 columns wide


def render_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grafana_render", EXAMPLE / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((EXAMPLE / "reconcile.json").read_text())
    return data


def test_the_dashboard_has_what_grafana_imports() -> None:
    board = dashboard()
    assert board["title"] and board["uid"] and isinstance(board["schemaVersion"], int)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids, cells = set(), set()
    for panel in board["panels"]:
        assert panel["id"] not in ids, panel["title"]
        ids.add(panel["id"])
        assert panel["type"] == "timeseries" and panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= GRID, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):  # no two panels on one cell
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, panel["title"]
                cells.add((x, y))
        assert panel["fieldConfig"]["defaults"]["unit"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(set(refs)) == len(refs), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"] and target["expr"]
            used = set(re.findall(r"\$\{?(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= set(variables), (panel["title"], used)
    shown = {p["title"] for p in board["panels"]}
    wanted = {"Requests per second", "Errors per second", "Request latency"}
    wanted |= {"Time to first token", "Tokens per second", "In flight", "Engine queue"}
    wanted |= {"Engine KV cache", "Instances by phase", "Engine restarts", "Pulls"}
    assert wanted | {"Device memory"} <= shown


def shown_in(panel: dict[str, Any], ref: str) -> tuple[str, str]:
    """The unit and the y axis a panel draws its target ``ref`` with: the panel's,
    unless an override for that query (``byFrameRefID``) says otherwise."""
    unit, axis = panel["fieldConfig"]["defaults"]["unit"], "auto"
    for override in panel["fieldConfig"].get("overrides", []):
        if override["matcher"] == {"id": "byFrameRefID", "options": ref}:
            props = {p["id"]: p["value"] for p in override["properties"]}
            unit = props.get("unit", unit)
            axis = props.get("custom.axisPlacement", axis)
    return unit, axis


def test_a_query_in_seconds_is_drawn_in_seconds_on_an_axis_of_its_own() -> None:
    """Every target whose answer is seconds (a ``_seconds`` series, or ``time() -`` a
    timestamp) is drawn with the unit ``s``; beside a target of another unit in one
    panel, on an axis of its own. "Seconds since a pass converged" was a bare number on
    the axis of "last pass ok" (0 or 1): hundreds beside a 1, with no unit."""
    for panel in dashboard()["panels"]:
        units = {t["refId"]: shown_in(panel, t["refId"]) for t in panel["targets"]}
        for target in panel["targets"]:
            unit, axis = units[target["refId"]]
            if "_seconds" in target["expr"] or "time() -" in target["expr"]:
                assert unit == "s", (panel["title"], target["refId"])
                others = {u for ref, (u, _) in units.items() if ref != target["refId"]}
                assert others <= {"s"} or axis == "right", (panel["title"], target["refId"])


@contextmanager
def prometheus(reconcile: Any, metrics_port: int) -> Iterator[str]:
    """A real Prometheus scraping the daemon every second, configured from the example."""
    config = yaml.safe_load((EXAMPLE / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    job = config["scrape_configs"][0]
    job["authorization"]["credentials_file"] = str(reconcile.state / "access-token")
    job["static_configs"] = [{"targets": [f"127.0.0.1:{metrics_port}"]}]
    folder = reconcile.tmp / "prometheus"
    folder.mkdir()
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_ports(1)
    argv = ["prometheus", f"--config.file={folder / 'prometheus.yml'}"]
    argv += [f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}"]
    with open(folder / "prometheus.log", "wb") as log:
        proc = reconcile.spawn(argv, stderr=log, stdout=log)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, (folder / "prometheus.log").read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    reconcile.wait_for(ready, timeout=60, what="Prometheus ready")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextmanager
def load(g: Any) -> Iterator[None]:
    """Requests through the gateway until the block ends: streams (slow enough to be
    seen in flight), plain answers, and a model nobody serves (404: the errors)."""
    stop = threading.Event()
    failures: list[str] = []

    def client(stream: bool) -> None:
        while not stop.is_set():
            answer = g.post("alpha", stream=stream)
            if answer.status != 200:
                failures.append(repr(answer))
            g.post("nobody")

    threads = [threading.Thread(target=client, args=(s,)) for s in (True, True, False)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert not failures, failures[:3]


def test_a_series_with_no_point_in_the_range_is_left_out_of_its_chart() -> None:
    """A panel where one series is NaN all along (a latency quantile of a deployment that
    had no request in the range) next to one with points: render.py raised IndexError on
    the empty one (a gateway trial's dashboard, two minutes after a cold start)."""
    render = render_module()
    drawn = render.chart([("demo", [(1.0, 0.5), (2.0, 0.7)]), ("cold", [])])
    assert drawn.count("<polyline") == 1 and "demo" in drawn and "cold" not in drawn
    assert "no data" in render.chart([("cold", [])])


def test_every_panel_returns_a_series_from_a_real_prometheus(reconcile: Any, gateway: Any) -> None:
    for tool in ("prometheus", "chromium"):  # scripts/system-packages installs both
        if shutil.which(tool) is None:
            missing.skip(tool, f"apt-get install {tool}")
    render, board = render_module(), dashboard()
    reconcile.devices = "nvidia:0=80Gi,nvidia:1=80Gi"  # declared memory: its panel
    engine_metrics = reconcile.tmp / "engine.prom"
    engine_metrics.write_text(ENGINE_METRICS)
    command = reconcile.demo_command(
        chunks="10", chunk_delay="0.1", metrics_file=str(engine_metrics)
    )
    reconcile.write("alpha", command=command)
    started = time.time()
    metrics_port = reconcile.port + 14
    try:
        with serving({"tiny.gguf": DATA}) as files:
            source = {"url": files.url("tiny.gguf"), "sha256": hashlib.sha256(DATA).hexdigest()}
            reconcile.write("beta", command=reconcile.demo_command(), source=source)
            g = gateway("--metrics-port", str(metrics_port), "--resync", "1s")
            g.wait_phase("alpha", "Ready")
            g.wait_phase("beta", "Ready")  # pulled, then started
        with prometheus(reconcile, metrics_port) as url, load(g):
            for panel, target in render.targets(board):
                expr = render.substitute(target["expr"], board, STEP)

                def found(expr: str = expr) -> bool:
                    return bool(render.query_range(url, expr, started, time.time(), STEP))

                what = f"panel {panel['title']!r} {target['refId']}: {expr}"
                reconcile.wait_for(found, timeout=PANEL_WAIT, what=what)
            inflight = render.query_range(
                url, "reconcile_gateway_inflight", started, time.time(), 1
            )
            # honor_labels: the instance is the engine's, not the scrape target's; beta,
            # idle, reads 0 rather than no data
            assert {s["metric"]["instance"] for s in inflight} == {"alpha", "beta"}
            shot = reconcile.tmp / "dashboard.png"
            argv = [sys.executable, str(EXAMPLE / "render.py"), "--prometheus", url]
            argv += ["--minutes", "5", "--step", str(STEP), "--out", str(shot.with_suffix(".html"))]
            subprocess.run([*argv, "--png", str(shot)], check=True, timeout=180)
        page = shot.with_suffix(".html").read_text()
        assert shot.read_bytes().startswith(b"\x89PNG")
        for panel in board["panels"]:
            assert panel["title"] in page
        assert "no data" not in page and page.count("<polyline") >= len(board["panels"])
        g.finish()
    finally:
        kill_marked(str(reconcile.state / "models"), marker=launch.MARKER)
