"""The metrics' shape, pinned: every family's name, type, HELP and label names, as the
daemon and the gateway expose them (tests/golden/metrics/shape.json, written from the
hand-written exposition before prometheus-client took it over). Dashboards and alerts
lean on these names: a change here is a change of the user contract.

Regenerate only on purpose: ``RECONCILE_GOLDEN=write pytest tests/gateway/test_metrics_shape.py``.
"""

from __future__ import annotations

import json
import math
import os
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from controller.core.devices.inventory import Device, Inventory
from controller.core.state import Phase, Record
from controller.daemon.metrics import BeforeFirstPass, PassFigures, gateway_series, render
from controller.daemon.webhooks import Sender
from controller.gateway.accounting.enginemetrics import EngineLoad
from controller.gateway.accounting.metrics import GatewayMetrics
from controller.gateway.ui.traffic import quantile, totals
from controller.store.config import accesstoken
from controller.store.sources.git import source as gitsource

GOLDEN = Path(__file__).parent.parent / "golden" / "metrics" / "shape.json"
Shape = dict[str, dict[str, Any]]


def shape(text: str) -> Shape:
    """Per family: its type, HELP, and each sample name's sorted label names."""
    out: Shape = {}
    for family in text_string_to_metric_families(text):
        samples: dict[str, list[str]] = {}
        for s in family.samples:
            samples[s.name] = sorted(set(samples.get(s.name, [])) | set(s.labels))
        out[family.name] = {
            "type": family.type,
            "help": family.documentation,
            "samples": samples,
        }
    return out


def _daemon_text() -> str:
    """A pass with a sample in every family the daemon writes."""
    recs = [
        Record(name="web", owner="o", node="n", phase=Phase.READY, restarts=2),
        Record(name="web@1", owner="o", node="n", phase=Phase.PENDING),
    ]
    figures = PassFigures(
        records=recs,
        inventory=Inventory(devices=(Device(kind="nvidia", id="0", memory=80 * 2**30),)),
        node="n",
        revision="abc",
        seconds=0.25,
        ok=True,
        now=1000.0,
        last_ok=900.0,
        manifest_errors=0,
        drained=False,
        passes=3,
        actions={("start", "ok"): 1},
        git_state=gitsource.STATES[0],
    )
    return render(figures)


def _gateway_text() -> str:
    """A gateway that saw one of everything it counts."""
    m = GatewayMetrics()
    m.begin("web", "web@1")
    m.done("web", "k1", 503, 0.2)
    m.answered("web", "k1", 0.05, 10, 20)
    m.ejected("web", "web@1")
    m.dropped(1)
    m.fell_back("web", "small", "not_ready")
    m.swap_avoided("web")
    m.engines[("web", "web@1")] = EngineLoad(waiting=2.0, kv_cache=0.5)
    return m.render()


def _notifications_text(state: Path) -> str:
    """The daemon's notification sender's counter, appended to its /metrics."""
    sender = Sender(state, ())
    sender.counts.update(delivered=1)
    return sender.render()


def current(state: Path) -> Shape:
    return {
        "before-first-pass": shape(render(BeforeFirstPass())),
        "daemon": shape(_daemon_text()),
        "gateway": shape(_gateway_text()),
        # whether the gateway's series are live (daemon/metrics.gateway_series)
        "gateway-up": shape(gateway_series("", False, 1000.0)),
        "notifications": shape(_notifications_text(state)),
    }


def test_every_family_keeps_its_name_type_help_and_labels(tmp_path: Path) -> None:
    if os.environ.get("RECONCILE_GOLDEN") == "write":
        GOLDEN.write_text(json.dumps(current(tmp_path), indent=1, sort_keys=True) + "\n")
    assert current(tmp_path) == json.loads(GOLDEN.read_text())


def test_a_running_daemon_and_gateway_expose_the_pinned_shape(reconcile: Any, gateway: Any) -> None:
    """The real /metrics of a daemon with its gateway: each family as pinned, and the
    gateway's counters next to the daemon's."""
    reconcile.write("alpha")
    port = reconcile.port + 14
    g = gateway("--metrics-port", str(port))
    g.wait_phase("alpha", "Ready")
    assert g.post("alpha").status == 200
    assert g.post("nobody").status == 404
    token = accesstoken.read(reconcile.state)
    url = f"http://127.0.0.1:{port}/metrics?token={token}"

    def scraped() -> Shape | None:
        with urllib.request.urlopen(url, timeout=5) as answer:
            found = shape(answer.read().decode())
        return found if "reconcile_gateway_errors" in found else None

    live = reconcile.wait_for(scraped, what="the gateway's counters in /metrics")
    g.finish()
    golden = json.loads(GOLDEN.read_text())
    pinned = {
        **golden["daemon"],
        **golden["gateway"],
        **golden["gateway-up"],
        **golden["notifications"],
    }
    for name, family in live.items():  # a family with no series yet has its header only
        want = pinned[name]
        assert (family["type"], family["help"]) == (want["type"], want["help"]), name
        for sample, labels in family["samples"].items():
            assert labels == want["samples"][sample], sample
    assert {"reconcile_passes", "reconcile_deployments", "reconcile_gateway_requests"} <= set(live)
    assert {"reconcile_gateway_up", "reconcile_gateway_metrics_timestamp_seconds"} <= set(live)
    assert {
        "reconcile_gateway_request_seconds",
        "reconcile_gateway_time_to_first_token_seconds",
    } <= set(live)


def test_an_idle_instance_reads_zero_in_flight_not_no_data(reconcile: Any, gateway: Any) -> None:
    """``reconcile_gateway_inflight`` had no sample while nothing was in flight, so a
    dashboard showed "no data" for an idle engine: each instance routed reads 0, after
    its requests too, and a deployment removed leaves no series."""
    reconcile.write("alpha")
    reconcile.write("beta")
    port = reconcile.port + 14
    g = gateway("--metrics-port", str(port))
    g.wait_phase("alpha", "Ready")
    token = accesstoken.read(reconcile.state)
    url = f"http://127.0.0.1:{port}/metrics?token={token}"

    def inflight() -> dict[str, float]:
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode()
        return {
            s.labels["instance"]: s.value
            for f in text_string_to_metric_families(text)
            if f.name == "reconcile_gateway_inflight"
            for s in f.samples
        }

    def inflight_when(ok: Any) -> Callable[[], dict[str, float] | None]:
        return lambda: found if ok(found := inflight()) else None

    seen = reconcile.wait_for(inflight_when(lambda f: len(f) == 2), what="both instances")
    assert seen == {"alpha": 0, "beta": 0}, seen
    assert g.post("alpha").status == 200
    assert inflight()["alpha"] == 0  # its request ended: 0 again, not gone
    (reconcile.manifests / "beta.yaml").unlink()
    gone = reconcile.wait_for(inflight_when(lambda f: "beta" not in f), what="beta gone")
    assert gone == {"alpha": 0}, gone
    g.finish()


def test_inherited_counters_add_up_and_keep_the_shape() -> None:
    """Two hand-overs in a row: the third gateway counts what all three saw, its text
    keeps the pinned shape, and the gauges (the old one's moment) are not carried."""
    first = GatewayMetrics()
    first.done("web", "k1", 200, 0.2)
    first.answered("web", "k1", 0.05, 10, 20)
    first.begin("web", "web@1")
    second = GatewayMetrics()
    second.inherit(first.render())
    second.done("web", "k1", 503, 3.0)
    second.done("other", "k2", 200, 0.01)
    third = GatewayMetrics()
    third.inherit(second.render())
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(third.render())
        for s in f.samples
    }
    web = (("deployment", "web"), ("key", "k1"))
    assert found[("reconcile_gateway_requests_total", web)] == 2
    assert found[("reconcile_gateway_request_seconds_count", web)] == 2
    assert found[("reconcile_gateway_request_seconds_sum", web)] == 3.2
    assert found[("reconcile_gateway_request_seconds_bucket", (*web, ("le", "0.25")))] == 1
    assert found[("reconcile_gateway_request_seconds_bucket", (*web, ("le", "+Inf")))] == 2
    assert found[("reconcile_gateway_tokens_total", (*web, ("kind", "completion")))] == 20
    assert found[("reconcile_gateway_requests_total", (("deployment", "other"), ("key", "k2")))]
    assert not [k for k in found if k[0] == "reconcile_gateway_inflight"]
    pinned = json.loads(GOLDEN.read_text())["gateway"]
    for name, family in shape(third.render()).items():
        for sample, labels in family["samples"].items():
            assert labels == pinned[name]["samples"][sample], sample


def test_ejections_inherited_from_a_gateway_without_node_go_on_under_this_node() -> None:
    """A gateway of an older reconcile wrote its ejections as {deployment, instance}: its
    successor, which labels them with its node too, adds them to its own series rather
    than keep a second one without the node (two series for one instance)."""
    older = (
        "# HELP reconcile_gateway_ejections_total Times passive health ejected an instance.\n"
        "# TYPE reconcile_gateway_ejections_total counter\n"
        'reconcile_gateway_ejections_total{deployment="web",instance="web@1"} 2.0\n'
    )
    newer = GatewayMetrics("box-a")
    newer.inherit(older)
    newer.ejected("web", "web@1")
    found = [
        (s.labels, s.value)
        for f in text_string_to_metric_families(newer.render())
        for s in f.samples
        if s.name == "reconcile_gateway_ejections_total"
    ]
    assert found == [({"deployment": "web", "instance": "web@1", "node": "box-a"}, 3.0)]


def _buckets(text: str, name: str) -> list[tuple[float, float]]:
    """(bound, cumulative count) of the one series of histogram ``name``, by bound."""
    found = [
        (float(s.labels["le"]), s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == f"{name}_bucket"
    ]
    return sorted(found)


def test_an_answer_of_minutes_is_in_a_bucket_of_its_own_not_past_the_last() -> None:
    """A 4-minute stream and a 7-minute cold start's first token: the last bound was
    120 s, so both were only in +Inf, and Prometheus' histogram_quantile (and the page's
    p50) read 120 s for them; they now land under finite bounds."""
    metrics = GatewayMetrics()
    metrics.done("web", "k1", 200, 240.0)
    metrics.answered("web", "k1", 420.0, 1, 1)
    text = metrics.render()
    for name, seconds in (("request_seconds", 240.0), ("time_to_first_token_seconds", 420.0)):
        finite = [(le, n) for le, n in _buckets(text, f"reconcile_gateway_{name}") if n]
        assert finite[0][0] != math.inf, name
        assert seconds <= finite[0][0] <= 2.5 * seconds, (name, finite[0])
    assert (quantile(0.5, totals(metrics)["web"].buckets) or 0.0) > 120.0


def test_a_predecessors_histogram_with_fewer_bounds_keeps_the_buckets_rising() -> None:
    """A gateway of an older reconcile (its last bound 120 s) hands over: its histogram
    has no 300/600/1800 buckets. Added as they were, ours would read fewer answers at
    le=300 than at le=120 (a histogram Prometheus calls broken); each bound it lacks
    takes its count at the largest bound below."""
    older = GatewayMetrics()
    for seconds in (0.2, 3.0, 90.0, 200.0):
        older.done("web", "k1", 200, seconds)
    text = older.render()
    old_bounds = ("300.0", "600.0", "1800.0")
    lines = [line for line in text.splitlines() if not any(f'le="{b}"' in line for b in old_bounds)]
    newer = GatewayMetrics()
    newer.inherit("\n".join(lines) + "\n")
    newer.done("web", "k1", 200, 0.2)
    counts = [n for _, n in _buckets(newer.render(), "reconcile_gateway_request_seconds")]
    assert counts == sorted(counts), counts  # cumulative: never falls as the bound rises
    assert counts[-1] == 5  # +Inf: every answer, the one past 120 s of the older too
    assert counts[-2] == 4  # le=1800: the older's 200 s answer is not known to be there
