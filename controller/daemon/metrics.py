"""Prometheus metrics: a textfile-collector file after each pass, and ``/metrics``.

``--metrics-file PATH`` (``*.prom`` in node_exporter's ``--collector.textfile.directory``)
is rewritten after every pass: temp file, fsync, rename, so the collector never reads
half a file. ``--metrics-port [HOST:]PORT`` makes the daemon serve the same text at
``/metrics`` (``metricsserver.py``). Each pass leaves a ``PassFigures``, a
prometheus-client collector read at scrape time; ``generate_latest`` writes the text.
No global registry: a collector is rendered on its own, so nothing leaks between tests.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from controller import __version__
from controller.core.devices.inventory import Inventory
from controller.core.manifest.names import base_name
from controller.core.replicaset import group
from controller.core.state import Phase, Record
from controller.host import bootclock
from controller.logsetup import get_logger
from controller.store.config.node import Config, read_drain
from controller.store.documents import write_atomic
from controller.store.sources import gitsource

if TYPE_CHECKING:
    from controller.reconciler.run import PassResult

log = get_logger("reconcile")

# version=0.0.4, not the library's 1.0.0: what Prometheus and node_exporter of any age read
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LAST_OK = "reconcile_last_successful_pass_timestamp_seconds"
PASSES = "reconcile_passes_total"
ACTIONS = "reconcile_actions_total"
GIT_STATE = "reconcile_git_source_state"  # one series per state of `reconcile source`
PASSES_HELP = "Passes this process (or, with --metrics-file, the file) counted."

Tally = Mapping[tuple[str, str], int]  # (action, outcome) -> count


def render(collector: Collector) -> str:
    return generate_latest(collector).decode()


class _Latest:
    """The newest pass's figures, shared with the HTTP server's threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.figures: Collector | None = None  # before the first pass: _BeforeFirstPass

    def set(self, figures: Collector) -> None:
        with self.lock:
            self.figures = figures

    def get(self) -> str:
        with self.lock:
            figures = self.figures
        return render(figures if figures is not None else _BeforeFirstPass())


LATEST = _Latest()
# More text to append (the gateway's counters, rendered by its own process), registered
# by whoever wires the daemon.
SOURCES: list[Callable[[], str]] = []


def add_source(text: Callable[[], str]) -> None:
    SOURCES.append(text)


def current() -> str:
    """The last pass's metrics plus every registered source, rendered now."""
    return LATEST.get() + "".join(text() for text in SOURCES)


def exporters(config: Config, inventory: Inventory) -> list[Exporter]:
    """The after-pass hooks the configuration asks for (none without a metrics flag)."""
    return [Exporter(config, inventory)] if config.metrics_file or config.metrics_port else []


class Exporter:
    """The after-pass hook: the pass's figures for ``/metrics``, and the textfile."""

    def __init__(self, config: Config, inventory: Inventory) -> None:
        self.config = config
        self.inventory = inventory
        # A cron pass is a new process: counters and the last success carry over the file.
        self.last_ok, self.passes, self.actions = _previous(config)

    def __call__(self, result: PassResult, seconds: float) -> None:
        now = time.time()
        if result.ok:
            self.last_ok = now
        self.passes += 1
        self.actions.update(result.outcomes)
        LATEST.set(
            PassFigures(
                records=sorted(result.records.values(), key=lambda r: r.name),
                inventory=self.inventory,
                node=self.config.node,
                revision=_revision(result.records.values()),
                seconds=seconds,
                ok=result.ok,
                now=now,
                last_ok=self.last_ok,
                manifest_errors=len(result.errors),
                drained=_drained(self.config),
                passes=self.passes,
                actions=dict(self.actions),
                git_state=_git_state(self.config, result),
            )
        )
        if self.config.metrics_file is not None:
            # write_atomic, not write_to_textfile: that one neither fsyncs nor sets the
            # mode (node_exporter runs as another user: 0644 whatever our umask)
            try:
                write_atomic(self.config.metrics_file, current().encode(), mode=0o644)
            except OSError as exc:  # metrics must never stop the reconciler
                log.warning(
                    "metrics file not written", path=str(self.config.metrics_file), error=str(exc)
                )


def _previous(config: Config) -> tuple[float, int, Counter[tuple[str, str]]]:
    """The last success and the counters the metrics file holds (0s without one)."""
    actions: Counter[tuple[str, str]] = Counter()
    if config.metrics_file is None:
        return 0.0, 0, actions
    try:
        text = config.metrics_file.read_text()
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    except (OSError, UnicodeDecodeError, ValueError):  # a torn or hand-edited file: from 0
        return 0.0, 0, actions
    last_ok, passes = 0.0, 0
    for s in samples:
        if s.name == ACTIONS:
            actions[(s.labels.get("action", ""), s.labels.get("outcome", ""))] = int(s.value)
        elif s.name == PASSES:
            passes = int(s.value)
        elif s.name == LAST_OK:
            last_ok = s.value
    return last_ok, passes, actions


def _drained(config: Config) -> bool:
    try:
        drain = read_drain(config.state_dir)
    except Exception:  # an unreadable drain file is reported by the pass, not here
        return False
    return drain is not None and drain.active(datetime.now(UTC), bootclock.read())


def _revision(records: Iterable[Record]) -> str:
    revs = sorted({r.revision for r in records if r.revision})
    return ",".join(revs)


def _git_state(config: Config, result: PassResult) -> str | None:
    """The git source's state after this pass (None: no git source, or its file unreadable)."""
    if config.git is None:
        return None
    st = gitsource.read_status(config.state_dir)
    if st is None:
        return None
    return gitsource.state_of(st, [str(r.phase) for r in result.ours()])[0]


# -- the families ----------------------------------------------------------------------------


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


def _build_info() -> GaugeMetricFamily:
    info = GaugeMetricFamily(
        "reconcile_build_info", "The running reconcile's version (always 1).", labels=["version"]
    )
    info.add_metric([__version__], 1)
    return info


class _BeforeFirstPass(Collector):
    """What ``/metrics`` says before the first pass ends: alerts need no ``absent()``."""

    def collect(self) -> Iterator[Metric]:
        yield _build_info()
        yield CounterMetricFamily(PASSES, PASSES_HELP, value=0)
        yield _gauge(LAST_OK, "When a pass last converged (Unix time; 0: not yet).", 0)


def _before_first_pass() -> str:
    return render(_BeforeFirstPass())


@dataclass(frozen=True)
class PassFigures(Collector):
    """One pass's figures (records sorted by name), rendered when scraped."""

    records: list[Record]
    inventory: Inventory
    node: str
    revision: str
    seconds: float
    ok: bool
    now: float
    last_ok: float | None
    manifest_errors: int
    drained: bool
    passes: int = 1
    actions: Tally = field(default_factory=dict)
    git_state: str | None = None

    def collect(self) -> Iterator[Metric]:
        yield _build_info()
        info = GaugeMetricFamily(
            "reconcile_info",
            "This node and the manifests revision its records came from.",
            labels=["node", "revision"],
        )
        info.add_metric([self.node, self.revision], 1)
        yield info
        yield from _instances(self.records)
        yield from _replicas(self.records)
        yield _devices(self.records, self.inventory)
        yield _device_memory(self.records, self.inventory)
        yield from self._pass()
        yield from self._state()

    def _pass(self) -> Iterator[Metric]:
        yield _gauge(
            "reconcile_last_pass_duration_seconds",
            "How long the last pass took.",
            round(self.seconds, 6),
        )
        yield CounterMetricFamily(PASSES, PASSES_HELP, value=self.passes)
        actions = CounterMetricFamily(
            ACTIONS,
            "Actions applied, by action and outcome (ok, failed).",
            labels=["action", "outcome"],
        )
        for (action, outcome), count in sorted(self.actions.items()):
            actions.add_metric([action, outcome], count)
        yield actions
        yield _gauge(
            "reconcile_last_pass_ok",
            "1 when the last pass converged: valid manifests, nothing Pending or Failed.",
            int(self.ok),
        )
        yield _gauge(
            "reconcile_last_pass_timestamp_seconds",
            "When the last pass ended (Unix time).",
            round(self.now, 3),
        )
        yield _gauge(
            LAST_OK,
            "When a pass last converged (Unix time; 0: not yet).",
            round(self.last_ok or 0, 3),
        )

    def _state(self) -> Iterator[Metric]:
        yield _gauge(
            "reconcile_manifest_errors",
            "Manifest errors the last pass found.",
            self.manifest_errors,
        )
        yield _gauge("reconcile_node_drained", "1 while the node is drained.", int(self.drained))
        if self.git_state is not None:
            git = GaugeMetricFamily(
                GIT_STATE,
                "1 for the state the git source is in (reconcile source).",
                labels=["state"],
            )
            for state in gitsource.STATES:
                git.add_metric([state], int(state == self.git_state))
            yield git


def exposition(
    *,
    records: Iterable[Record],
    inventory: Inventory,
    node: str,
    revision: str,
    seconds: float,
    ok: bool,
    now: float,
    last_ok: float | None,
    manifest_errors: int,
    drained: bool,
    passes: int = 1,
    actions: Tally | None = None,
    git_state: str | None = None,
) -> str:
    """One pass's metrics as Prometheus text."""
    return render(
        PassFigures(
            records=sorted(records, key=lambda r: r.name),
            inventory=inventory,
            node=node,
            revision=revision,
            seconds=seconds,
            ok=ok,
            now=now,
            last_ok=last_ok,
            manifest_errors=manifest_errors,
            drained=drained,
            passes=passes,
            actions=dict(actions or {}),
            git_state=git_state,
        )
    )


INSTANCE = ["deployment", "instance"]


def _instances(recs: list[Record]) -> Iterator[Metric]:
    """The series of each record: every replica (and rolling ``@next``) is an ``instance``
    of its ``deployment``, so ``sum by (deployment)`` adds its replicas up."""
    deployments = GaugeMetricFamily(
        "reconcile_deployments",
        "Deployment instances (replicas) on this node by phase.",
        labels=["phase"],
    )
    for phase in Phase:
        deployments.add_metric([str(phase)], sum(r.phase is phase for r in recs))
    phases = GaugeMetricFamily(
        "reconcile_deployment_phase",
        "1 for the phase each instance is in.",
        labels=[*INSTANCE, "phase"],
    )
    ready = GaugeMetricFamily(
        "reconcile_deployment_ready", "1 when the instance's engine is Ready.", labels=INSTANCE
    )
    restarts = CounterMetricFamily(
        "reconcile_deployment_restarts_total",
        "Restarts of each instance's engine (its record's count).",
        labels=INSTANCE,
    )
    for rec in recs:
        who = [base_name(rec.name), rec.name]
        for phase in Phase:
            phases.add_metric([*who, str(phase)], int(rec.phase is phase))
        ready.add_metric(who, int(rec.phase is Phase.READY))
        restarts.add_metric(who, rec.restarts)
    yield from (deployments, phases, ready, restarts)


def _replicas(recs: list[Record]) -> Iterator[Metric]:
    """Per deployment, as kube-state-metrics has them: desired and Ready replicas."""
    sets = group(recs)
    desired = GaugeMetricFamily(
        "reconcile_deployment_replicas",
        "Replicas each deployment should run.",
        labels=["deployment"],
    )
    ready = GaugeMetricFamily(
        "reconcile_deployment_ready_replicas",
        "Replicas of each deployment with a Ready instance.",
        labels=["deployment"],
    )
    for rs in sets:
        desired.add_metric([rs.name], rs.desired)
        ready.add_metric([rs.name], rs.ready)
    yield from (desired, ready)


def _devices(recs: list[Record], inventory: Inventory) -> Metric:
    held = {d for r in recs if r.holds for d in r.devices}
    devices = GaugeMetricFamily(
        "reconcile_devices",
        "Devices of the inventory, free or held, by kind.",
        labels=["kind", "state"],
    )
    for kind in sorted({d.kind for d in inventory.devices}):
        keys = [d.key for d in inventory.devices if d.kind == kind]
        taken = sum(k in held for k in keys)
        devices.add_metric([kind, "held"], taken)
        devices.add_metric([kind, "free"], len(keys) - taken)
    return devices


def _device_memory(recs: list[Record], inventory: Inventory) -> Metric:
    """Each device's memory (declared, or NVML's) and what the records lease of it: a
    record with no memory request holds the whole device. Unknown memory: no series."""
    memory = GaugeMetricFamily(
        "reconcile_device_memory_bytes",
        "Device memory in bytes: total, and leased by the instances.",
        labels=["device", "state"],
    )
    for device in inventory.devices:
        if device.memory is None:
            continue
        holders = [r for r in recs if r.holds and device.key in r.devices]
        leased = sum(device.memory if r.memory is None else r.memory for r in holders)
        memory.add_metric([device.key, "total"], device.memory)
        memory.add_metric([device.key, "leased"], min(leased, device.memory))
    return memory
