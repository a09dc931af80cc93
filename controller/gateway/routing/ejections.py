"""What passive health's changes leave behind: a log line, a metric, an event.

An ejection and a return are rare (never per request), so each is journalled in the
deployment's event journal (``reconcile describe`` and ``events`` show it) by a worker
thread: the event loop never waits on the disk. The journal is appended to with one
``O_APPEND`` write, so the gateway's lines and the daemon's never tear each other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from controller.gateway.accounting.metrics import GatewayMetrics
from controller.gateway.routing.health import RotationChange
from controller.logsetup import get_logger
from controller.store.instances.events import Journal

log = get_logger("reconcile")


def recorder(state_dir: Path, metrics: GatewayMetrics) -> Callable[[RotationChange], None]:
    """``Health.notify`` for the gateway: call on its event loop."""
    journal = Journal(state_dir)

    def record(change: RotationChange) -> None:
        action = "eject" if change.ejected else "readmit"
        if change.ejected:
            metrics.ejected(change.deployment, change.instance)
        say = log.warning if change.ejected else log.info
        say(
            f"instance {'ejected' if change.ejected else 'back in the rotation'}",
            deployment=change.deployment,
            instance=change.instance,
            reason=change.reason,
        )
        asyncio.get_running_loop().run_in_executor(None, _append, journal, change, action)

    return record


def _append(journal: Journal, change: RotationChange, action: str) -> None:
    try:
        journal.append(
            change.deployment,
            action,
            change.reason,
            "ok",
            instance=change.instance,
            nonce=change.nonce,
        )
    except (OSError, ValueError) as exc:  # a full disk must not stop routing
        log.warning("gateway event not journalled", deployment=change.deployment, error=str(exc))
