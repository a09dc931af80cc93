"""Prometheus metrics: a textfile-collector file after each pass, and ``/metrics``.

``--metrics-file PATH`` (``*.prom`` in node_exporter's ``--collector.textfile.directory``)
is rewritten after every pass: temp file, fsync, rename, so the collector never reads
half a file. ``--metrics-port [HOST:]PORT`` makes the daemon serve the same text at
``/metrics`` (default host 127.0.0.1: there is no authentication). The text format is
written here (a dozen gauges need no client library); tests read it back with
``prometheus_client.parser``.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from controller import __version__
from controller.core.devices.inventory import Inventory
from controller.core.manifest.names import base_name
from controller.core.promtext import PromText
from controller.core.replicaset import group
from controller.core.state import Phase, Record
from controller.host import bootclock
from controller.logsetup import get_logger
from controller.store import gitsource
from controller.store.documents import write_atomic
from controller.store.node import Config, read_drain

if TYPE_CHECKING:
    from controller.reconciler.run import PassResult

log = get_logger("reconcile")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LAST_OK = "reconcile_last_successful_pass_timestamp_seconds"
PASSES = "reconcile_passes_total"
ACTIONS = "reconcile_actions_total"
GIT_STATE = "reconcile_git_source_state"  # one series per state of `reconcile source`
PASSES_HELP = "Passes this process (with --metrics-file: the file) counted."
_ACTION_LINE = re.compile(rf'^{ACTIONS}{{action="([^"]*)",outcome="([^"]*)"}} (\S+)$', re.M)

Tally = Mapping[tuple[str, str], int]  # (action, outcome) -> count


class _Latest:
    """The newest rendering, shared with the HTTP server's threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.text: str | None = None  # before the first pass: _before_first_pass()

    def set(self, text: str) -> None:
        with self.lock:
            self.text = text

    def get(self) -> str:
        with self.lock:
            return self.text if self.text is not None else _before_first_pass()


LATEST = _Latest()
# More text to append (the gateway's counters), registered by whoever wires the daemon.
SOURCES: list[Callable[[], str]] = []


def add_source(render: Callable[[], str]) -> None:
    SOURCES.append(render)


def current() -> str:
    """The last pass's metrics plus every registered source, rendered now."""
    return LATEST.get() + "".join(render() for render in SOURCES)


def exporters(config: Config, inventory: Inventory) -> list[Exporter]:
    """The after-pass hooks the configuration asks for (none without a metrics flag)."""
    return [Exporter(config, inventory)] if config.metrics_file or config.metrics_port else []


class Exporter:
    """The after-pass hook: render, write the textfile, publish for ``/metrics``."""

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
        text = exposition(
            passes=self.passes,
            actions=self.actions,
            records=result.records.values(),
            inventory=self.inventory,
            node=self.config.node,
            revision=_revision(result.records.values()),
            seconds=seconds,
            ok=result.ok,
            now=now,
            last_ok=self.last_ok,
            manifest_errors=len(result.errors),
            drained=_drained(self.config),
            git_state=_git_state(self.config, result),
        )
        LATEST.set(text)
        if self.config.metrics_file is not None:
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
    except (OSError, UnicodeDecodeError):
        return 0.0, 0, actions
    for action, outcome, count in _ACTION_LINE.findall(text):
        actions[(action, outcome)] = int(_float(count))
    return _float(_single(text, LAST_OK)), int(_float(_single(text, PASSES))), actions


def _single(text: str, name: str) -> str:
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return match.group(1) if match else "0"


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:  # a hand-edited or torn file: start the count again
        return 0.0


def _drained(config: Config) -> bool:
    try:
        drain = read_drain(config.state_dir)
    except Exception:  # an unreadable drain file is reported by the pass, not here
        return False
    return drain is not None and drain.active(datetime.now(UTC), bootclock.read())


def _revision(records: Iterable[Record]) -> str:
    revs = sorted({r.revision for r in records if r.revision})
    return ",".join(revs)


# -- the text format ---------------------------------------------------------------------------


def _before_first_pass() -> str:
    """What ``/metrics`` says before the first pass ends: alerts need no ``absent()``."""
    out = PromText()
    _build_info(out)
    out.family(
        PASSES, "Passes this process (or, with --metrics-file, the file) counted.", "counter"
    )
    out.sample(PASSES, 0)
    out.family(LAST_OK, "When a pass last converged (Unix time; 0: not yet).")
    out.sample(LAST_OK, 0)
    return "\n".join(out.lines) + "\n"


def _build_info(out: PromText) -> None:
    out.family("reconcile_build_info", "The running reconcile's version (always 1).")
    out.sample("reconcile_build_info", 1, version=__version__)


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
    recs = sorted(records, key=lambda r: r.name)
    out = PromText()
    _build_info(out)
    out.family("reconcile_info", "This node and the manifests revision its records came from.")
    out.sample("reconcile_info", 1, node=node, revision=revision)
    _instances(out, recs)
    _replicas(out, recs)
    _devices(out, recs, inventory)
    out.family("reconcile_last_pass_duration_seconds", "How long the last pass took.")
    out.sample("reconcile_last_pass_duration_seconds", round(seconds, 6))
    out.family(
        PASSES, "Passes this process (or, with --metrics-file, the file) counted.", "counter"
    )
    out.sample(PASSES, passes)
    out.family(ACTIONS, "Actions applied, by action and outcome (ok, failed).", "counter")
    for (action, outcome), count in sorted((actions or {}).items()):
        out.sample(ACTIONS, count, action=action, outcome=outcome)
    out.family(
        "reconcile_last_pass_ok",
        "1 when the last pass converged: valid manifests, nothing Pending or Failed.",
    )
    out.sample("reconcile_last_pass_ok", int(ok))
    out.family("reconcile_last_pass_timestamp_seconds", "When the last pass ended (Unix time).")
    out.sample("reconcile_last_pass_timestamp_seconds", round(now, 3))
    out.family(LAST_OK, "When a pass last converged (Unix time; 0: not yet).")
    out.sample(LAST_OK, round(last_ok or 0, 3))
    out.family("reconcile_manifest_errors", "Manifest errors the last pass found.")
    out.sample("reconcile_manifest_errors", manifest_errors)
    out.family("reconcile_node_drained", "1 while the node is drained.")
    out.sample("reconcile_node_drained", int(drained))
    if git_state is not None:
        out.family(GIT_STATE, "1 for the state the git source is in (reconcile source).")
        for state in gitsource.STATES:
            out.sample(GIT_STATE, int(state == git_state), state=state)
    return "\n".join(out.lines) + "\n"


def _git_state(config: Config, result: PassResult) -> str | None:
    """The git source's state after this pass (None: no git source, or its file unreadable)."""
    if config.git is None:
        return None
    st = gitsource.read_status(config.state_dir)
    if st is None:
        return None
    return gitsource.state_of(st, [str(r.phase) for r in result.ours()])[0]


def _instances(out: PromText, recs: list[Record]) -> None:
    """The series of each record: every replica (and rolling ``@next``) is an ``instance``
    of its ``deployment``, so ``sum by (deployment)`` adds its replicas up."""
    out.family("reconcile_deployments", "Deployment instances (replicas) on this node by phase.")
    for phase in Phase:
        out.sample("reconcile_deployments", sum(r.phase is phase for r in recs), phase=str(phase))
    out.family("reconcile_deployment_phase", "1 for the phase each instance is in.")
    for rec in recs:
        for phase in Phase:
            out.sample(
                "reconcile_deployment_phase",
                int(rec.phase is phase),
                **_instance(rec),
                phase=str(phase),
            )
    out.family("reconcile_deployment_ready", "1 when the instance's engine is Ready.")
    for rec in recs:
        out.sample("reconcile_deployment_ready", int(rec.phase is Phase.READY), **_instance(rec))
    restarts = "reconcile_deployment_restarts_total"
    out.family(restarts, "Restarts of each instance's engine (its record's count).", "counter")
    for rec in recs:
        out.sample(restarts, rec.restarts, **_instance(rec))


def _instance(rec: Record) -> dict[str, str]:
    return {"deployment": base_name(rec.name), "instance": rec.name}


def _replicas(out: PromText, recs: list[Record]) -> None:
    """Per deployment, as kube-state-metrics has them: desired and Ready replicas."""
    sets = group(recs)
    out.family("reconcile_deployment_replicas", "Replicas each deployment should run.")
    for rs in sets:
        out.sample("reconcile_deployment_replicas", rs.desired, deployment=rs.name)
    ready = "reconcile_deployment_ready_replicas"
    out.family(ready, "Replicas of each deployment with a Ready instance.")
    for rs in sets:
        out.sample(ready, rs.ready, deployment=rs.name)


def _devices(out: PromText, recs: list[Record], inventory: Inventory) -> None:
    held = {d for r in recs if r.holds for d in r.devices}
    out.family("reconcile_devices", "Devices of the inventory, free or held, by kind.")
    for kind in sorted({d.kind for d in inventory.devices}):
        keys = [d.key for d in inventory.devices if d.kind == kind]
        taken = sum(k in held for k in keys)
        out.sample("reconcile_devices", taken, kind=kind, state="held")
        out.sample("reconcile_devices", len(keys) - taken, kind=kind, state="free")
    _device_memory(out, recs, inventory)


def _device_memory(out: PromText, recs: list[Record], inventory: Inventory) -> None:
    """Each device's memory (declared, or NVML's) and what the records lease of it: a
    record with no memory request holds the whole device. Unknown memory: no series."""
    name = "reconcile_device_memory_bytes"
    out.family(name, "Device memory in bytes: total, and leased by the instances.")
    for device in inventory.devices:
        if device.memory is None:
            continue
        holders = [r for r in recs if r.holds and device.key in r.devices]
        leased = sum(device.memory if r.memory is None else r.memory for r in holders)
        out.sample(name, device.memory, device=device.key, state="total")
        out.sample(name, min(leased, device.memory), device=device.key, state="leased")


# -- /metrics -----------------------------------------------------------------------------------
