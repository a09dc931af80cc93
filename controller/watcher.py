"""The daemon: a pass at start, then one every ``resync`` seconds until SIGTERM/SIGINT.

Engines outlive it: stopping the daemon leaves them running for the next one.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import structlog

from controller.errors import LockTimeout
from controller.node import Config
from controller.reconciler import Reconciler

log = structlog.get_logger("reconcile")


def run_daemon(config: Config, *, resync: float = 5.0) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    reconciler = Reconciler(config)
    while not stop.is_set():
        try:
            reconciler.run_pass(lock_timeout=resync)
        except LockTimeout as exc:
            log.warning("pass skipped", reason=str(exc))
        stop.wait(resync)
    log.info("daemon stopped; engines left running")
    return 0
