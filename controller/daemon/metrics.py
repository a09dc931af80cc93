"""Prometheus metrics: a textfile-collector file after each pass, and ``/metrics``.

``--metrics-file PATH`` (``*.prom`` in node_exporter's ``--collector.textfile.directory``)
is rewritten after every pass: temp file, fsync, rename, so the collector never reads
half a file. ``--metrics-port [HOST:]PORT`` makes the daemon serve the same text at
``/metrics`` (``metricsserver.py``). Each pass leaves a ``PassFigures``, a
prometheus-client collector read at scrape time; ``generate_latest`` writes the text.
No global registry: a collector is rendered on its own, so nothing leaks between tests.
Every family is declared once in ``FAMILIES``; a collector names it and its samples.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
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
from controller.store.sources.git import source as gitsource

if TYPE_CHECKING:
    from controller.reconciler.run import PassResult

log = get_logger("reconcile")

# version=0.0.4, not the library's 1.0.0: what Prometheus and node_exporter of any age read
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LAST_OK = "reconcile_last_successful_pass_timestamp_seconds"
PASSES = "reconcile_passes_total"
ACTIONS = "reconcile_actions_total"
GIT_STATE = "reconcile_git_source_state"  # one series per state of `reconcile source`
# Whether the gateway's series are live, as Prometheus' `up` and node_exporter's
# node_textfile_mtime_seconds say of a target and a file: its file outlives a stopped or
# hung gateway, and flat counters read from it looked like an idle, healthy one.
GATEWAY_UP = "reconcile_gateway_up"
GATEWAY_AT = "reconcile_gateway_metrics_timestamp_seconds"
# every replica (and `@next`) of its deployment, on its node: the series carry their own
# `instance` (scraped with honor_labels), so without `node` two nodes running one
# deployment name would be one series in a job that scrapes both
INSTANCE = ("node", "deployment", "instance")

# fmt: off
FAMILIES: dict[str, tuple[str, tuple[str, ...], str]] = {  # name: type, label names, HELP
    "reconcile_build_info": ("gauge", ("version",), "The running reconcile's version (always 1)."),
    "reconcile_info": ("gauge", ("node", "revision"),
        "This node and the manifests revision its records came from."),
    "reconcile_deployments": ("gauge", ("phase",),
        "Deployment instances (replicas) on this node by phase."),
    "reconcile_deployment_phase": ("gauge", (*INSTANCE, "phase"),
        "1 for the phase each instance is in."),
    "reconcile_deployment_ready": ("gauge", INSTANCE, "1 when the instance's engine is Ready."),
    "reconcile_deployment_restarts_total": ("counter", INSTANCE,
        "Restarts of each instance's engine (its record's count)."),
    "reconcile_deployment_replicas": ("gauge", ("deployment",),
        "Replicas each deployment should run."),
    "reconcile_deployment_ready_replicas": ("gauge", ("deployment",),
        "Replicas of each deployment with a Ready instance."),
    "reconcile_devices": ("gauge", ("kind", "state"),
        "Devices of the inventory, free or held, by kind."),
    "reconcile_device_memory_bytes": ("gauge", ("device", "state"),
        "Device memory in bytes: total, and leased by the instances."),
    "reconcile_last_pass_duration_seconds": ("gauge", (), "How long the last pass took."),
    PASSES: ("counter", (), "Passes this process (or, with --metrics-file, the file) counted."),
    ACTIONS: ("counter", ("action", "outcome"),
        "Actions applied, by action and outcome (ok, failed)."),
    "reconcile_last_pass_ok": ("gauge", (),
        "1 when the last pass converged (--once exits 0): nothing Pending, Failed, looping."),
    "reconcile_last_pass_timestamp_seconds": ("gauge", (), "When the last pass ended (Unix time)."),
    LAST_OK: ("gauge", (), "When a pass last converged (Unix time; 0: not yet)."),
    "reconcile_manifest_errors": ("gauge", (), "Manifest errors the last pass found."),
    "reconcile_node_drained": ("gauge", (), "1 while the node is drained."),
    GIT_STATE: ("gauge", ("state",), "1 for the state the git source is in (reconcile source)."),
    "reconcile_notifications_total": ("counter", ("result",),  # daemon/webhooks.py
        "Notifications this daemon posted, by result."),
    GATEWAY_UP: ("gauge", (),
        "1 when the gateway answered this scrape; 0: it did not (stopped, hung, gone) and "
        "its series are those of its metrics file."),
    GATEWAY_AT: ("gauge", (),
        "When the gateway's series were rendered (Unix time): this scrape's when it "
        "answered, else its metrics file's last write (0: none)."),
}
# fmt: on

Tally = Mapping[tuple[str, str], int]  # (action, outcome) -> count
Series = Iterable[tuple[Sequence[str], float]]  # (label values, value) per sample


def family(name: str, series: Series | float) -> Metric:
    """``name``'s family as ``FAMILIES`` declares it, one sample per item of ``series``
    (a number: the one sample of a family without labels)."""
    kind, labels, help_text = FAMILIES[name]
    metric = Metric(name.removesuffix("_total"), help_text, kind)
    for values, value in [((), series)] if isinstance(series, int | float) else series:
        metric.add_sample(name, dict(zip(labels, values, strict=True)), value)
    return metric


def render(collector: Collector) -> str:
    return generate_latest(collector).decode()


class Families(Collector):
    """Families already built, as a collector of their own (to render them alone)."""

    def __init__(self, *families: Metric) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


class BeforeFirstPass(Collector):
    """What ``/metrics`` says before the first pass ends: alerts need no ``absent()``."""

    def collect(self) -> Iterator[Metric]:
        yield family("reconcile_build_info", [((__version__,), 1)])
        yield family(PASSES, 0)
        yield family(LAST_OK, 0)


@dataclass(frozen=True)
class PassFigures(Collector):
    """One pass's figures, rendered when scraped."""

    records: Sequence[Record]
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
        recs = sorted(self.records, key=lambda r: r.name)
        yield family("reconcile_build_info", [((__version__,), 1)])
        yield family("reconcile_info", [((self.node, self.revision), 1)])
        yield from _instances(recs, self.node)
        sets = group(recs)  # per deployment, as kube-state-metrics has them
        yield family("reconcile_deployment_replicas", [((rs.name,), rs.desired) for rs in sets])
        yield family("reconcile_deployment_ready_replicas", [((rs.name,), rs.ready) for rs in sets])
        yield family("reconcile_devices", _devices(recs, self.inventory))
        yield family("reconcile_device_memory_bytes", _device_memory(recs, self.inventory))
        yield from self._figures()

    def _figures(self) -> Iterator[Metric]:
        yield family("reconcile_last_pass_duration_seconds", round(self.seconds, 6))
        yield family(PASSES, self.passes)
        yield family(ACTIONS, sorted(self.actions.items()))
        yield family("reconcile_last_pass_ok", int(self.ok))
        yield family("reconcile_last_pass_timestamp_seconds", round(self.now, 3))
        yield family(LAST_OK, round(self.last_ok or 0, 3))
        yield family("reconcile_manifest_errors", self.manifest_errors)
        yield family("reconcile_node_drained", int(self.drained))
        if self.git_state is not None:
            states = gitsource.STATES
            yield family(GIT_STATE, [((s,), int(s == self.git_state)) for s in states])


def _instances(recs: list[Record], node: str) -> Iterator[Metric]:
    """Each record's series: ``sum by (deployment)`` adds a deployment's replicas up."""
    who = [((node, base_name(r.name), r.name), r) for r in recs]
    by_phase = [((str(p),), sum(r.phase is p for r in recs)) for p in Phase]
    yield family("reconcile_deployments", by_phase)
    phases = [((*w, str(p)), int(r.phase is p)) for w, r in who for p in Phase]
    yield family("reconcile_deployment_phase", phases)
    yield family("reconcile_deployment_ready", [(w, int(r.phase is Phase.READY)) for w, r in who])
    yield family("reconcile_deployment_restarts_total", [(w, r.restarts) for w, r in who])


def _devices(recs: list[Record], inventory: Inventory) -> Series:
    held = {d for r in recs if r.holds for d in r.devices}
    for kind in sorted({d.kind for d in inventory.devices}):
        keys = [d.key for d in inventory.devices if d.kind == kind]
        taken = sum(k in held for k in keys)
        yield (kind, "held"), taken
        yield (kind, "free"), len(keys) - taken


def _device_memory(recs: list[Record], inventory: Inventory) -> Series:
    """Each device's memory (declared, or NVML's) and what the records lease of it: a
    record with no memory request holds the whole device. Unknown memory: no series."""
    for device in inventory.devices:
        if (total := device.memory) is None:
            continue
        holders = [r for r in recs if r.holds and device.key in r.devices]
        leased = sum(total if r.memory is None else r.memory for r in holders)
        yield (device.key, "total"), total
        yield (device.key, "leased"), min(leased, total)


class _Latest:
    """The newest pass's figures, read by the HTTP server's threads: the pass swaps the
    reference whole (one store), so a reader needs no lock."""

    figures: Collector = BeforeFirstPass()


LATEST = _Latest()
# More text to append (the gateway's counters, rendered by its own process), registered
# by whoever wires the daemon.
SOURCES: list[Callable[[], str]] = []


def add_source(text: Callable[[], str]) -> None:
    SOURCES.append(text)


def gateway_series(text: str, answered: bool, at: float) -> str:
    """The gateway's text (``handover.Scraped``'s fields) and the two gauges that say
    whether it is live: ``GATEWAY_UP`` and ``GATEWAY_AT``."""
    said = Families(family(GATEWAY_UP, int(answered)), family(GATEWAY_AT, round(at, 3)))
    return text + render(said)


def current() -> str:
    """The last pass's metrics plus every registered source, rendered now."""
    return render(LATEST.figures) + "".join(text() for text in SOURCES)


def exporters(
    config: Config, inventory: Inventory, before: Iterable[object] = ()
) -> list[Exporter]:
    """The after-pass hooks the configuration asks for (none without a metrics flag).
    ``before``: the hooks of the reconciler a reload (SIGHUP) replaces; its exporter's
    counters run on in the new one (a counter resets only when its process restarts)."""
    if not (config.metrics_file or config.metrics_port):
        return []
    old = next((hook for hook in before if isinstance(hook, Exporter)), None)
    return [Exporter(config, inventory, old)]


class Exporter:
    """The after-pass hook: the pass's figures for ``/metrics``, and the textfile."""

    def __init__(
        self, config: Config, inventory: Inventory, before: Exporter | None = None
    ) -> None:
        self.config = config
        self.inventory = inventory
        # A reload in this process: its counters run on. A cron pass is a new process:
        # counters and the last success carry over the file.
        self.last_ok, self.passes, self.actions = (
            _previous(config) if before is None else before.counts()
        )

    def counts(self) -> tuple[float, int, Counter[tuple[str, str]]]:
        """The last success and the counters so far (a copy)."""
        return self.last_ok, self.passes, Counter(self.actions)

    def __call__(self, result: PassResult, seconds: float) -> None:
        now = time.time()
        converged = result.converged  # as --once's exit: a crash loop is no success
        if converged:
            self.last_ok = now
        self.passes += 1
        self.actions.update(result.outcomes)
        records = list(result.records.values())
        LATEST.figures = PassFigures(
            records=records,
            inventory=self.inventory,
            node=self.config.node,
            revision=",".join(sorted({r.revision for r in records if r.revision})),
            seconds=seconds,
            ok=converged,
            now=now,
            last_ok=self.last_ok,
            manifest_errors=len(result.errors),
            drained=_drained(self.config),
            passes=self.passes,
            actions=dict(self.actions),
            git_state=_git_state(self.config, result),
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
    try:
        text = config.metrics_file.read_text() if config.metrics_file else ""
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    except (OSError, UnicodeDecodeError, ValueError):  # a torn or hand-edited file: from 0
        samples = []
    last = {s.name: s.value for s in samples}
    actions = {
        (s.labels.get("action", ""), s.labels.get("outcome", "")): int(s.value)
        for s in samples
        if s.name == ACTIONS
    }
    return last.get(LAST_OK, 0.0), int(last.get(PASSES, 0)), Counter(actions)


def _drained(config: Config) -> bool:
    try:
        drain = read_drain(config.state_dir)
    except Exception:  # an unreadable drain file is reported by the pass, not here
        return False
    return drain is not None and drain.active(datetime.now(UTC), bootclock.read())


def _git_state(config: Config, result: PassResult) -> str | None:
    """The git source's state after this pass (None: no git source, or its file unreadable)."""
    if config.git is None:
        return None
    st = gitsource.peek_status(config.state_dir)  # a damaged file: the pass said so
    if st is None:
        return None
    return gitsource.state_of(st, gitsource.phases_of(result.ours()))[0]
