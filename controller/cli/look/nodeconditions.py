"""The node's conditions, as `status -o json` gives them beside each deployment: what the
lines above (and warnings below) `status`'s table tell a person, for a script.

Kubernetes' ``.status.conditions`` shape: ``type``, ``status`` (``"True"``/``"False"``),
``reason`` (one CamelCase word), ``message`` (the words the table's line says), and
``lastTransitionTime`` (ISO 8601; null where the node keeps no such time).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from controller.cli.common import stopped_daemon
from controller.cli.gateway.startlock import stopped
from controller.cli.render.views import drain_line
from controller.core.state import Drain
from controller.errors import ConfigError
from controller.host import bootclock
from controller.store.config.node import IGNORED, Config, read_drain
from controller.store.side import daemonset
from controller.store.statedir import StateDir

# What a daemon stopped (SIGSTOP, a debugger) means for the table: it holds its lock, so
# nothing said "no daemon runs", and its records look as its last pass left them.
STOPPED_DAEMON = "no pass runs until it does: nothing is started, restarted or stopped"
# A git source's states in which the node runs what the branch says (or a rollback's pin).
SOURCE_FINE = ("Synced", "Progressing", "Pinned")


def condition(
    kind: str, holds: bool, reason: str, message: str, at: datetime | None = None
) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if holds else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": at.astimezone(UTC).isoformat() if at is not None else None,
    }


def node_conditions(cfg: Config, unread: dict[str, str]) -> list[dict[str, Any]]:
    """The node's conditions now. ``unread``: record -> its set's condition when its last
    pass read no manifest (the empty-folder guard: nothing pruned), as `status` read it."""
    found = [_node_config(cfg), _drained(cfg), _daemon(cfg)]
    source = _source(cfg.state_dir)
    found += [source] if source is not None else []
    for said in sorted(set(unread.values())):
        found.append(condition("ManifestsRead", False, "NothingPruned", said))
    return found


def _node_config(cfg: Config) -> dict[str, Any]:
    """``cfg.labels`` is None only when node.yaml could not be read (`--once` refuses it)."""
    if cfg.labels is not None:
        return condition("NodeConfigReadable", True, "Read", "")
    said = "; ".join(w.removesuffix(IGNORED) for w in cfg.warnings)
    return condition("NodeConfigReadable", False, "Unreadable", said)


def _drained(cfg: Config) -> dict[str, Any]:
    try:
        drain = read_drain(cfg.state_dir)
    except ConfigError as exc:  # `status` warns of it; the node is not known drained
        return condition("Drained", False, "DrainUnreadable", str(exc))
    now = datetime.now(UTC)
    line = drain_line(cfg.node, drain, now, bootclock.read())
    if drain is None or line is None:
        return condition("Drained", False, "NotDrained", "")
    return condition("Drained", True, "Drained", line, _asked_at(drain))


def _asked_at(drain: Drain) -> datetime | None:
    """When the drain was asked: its end less its ttl (a file from before ttls: unknown)."""
    return drain.until - timedelta(seconds=drain.ttl) if drain.ttl is not None else None


def _daemon(cfg: Config) -> dict[str, Any]:
    pid = daemonset.daemon_pid(cfg.state_dir)
    if not pid:
        return condition("DaemonStopped", False, "NoDaemon", "no daemon runs on this state dir")
    if stopped(pid):
        said = f"{stopped_daemon(pid)}: {STOPPED_DAEMON}"
        return condition("DaemonStopped", True, "Stopped", said)
    return condition("DaemonStopped", False, "Running", f"daemon pid {pid} runs")


def _source(state_dir: Path) -> dict[str, Any] | None:
    """The git source's state, as `status`'s line above the table says it (None: none)."""
    if not StateDir(state_dir).git_source.exists():
        return None
    from controller.cli.look.sourceverb import source_state, summary

    seen, line = source_state(state_dir), summary(state_dir)
    if seen is None or line is None:
        return None
    state = seen[1]
    return condition("SourceReady", state in SOURCE_FINE, state, line[0].removeprefix("source: "))
