"""The gateway's records watch (``GatewayProcess.poll``) ends when its stop cancels it,
even when the cancel comes as a change wakes it: Python 3.11's ``asyncio.wait_for``
returned the event's result then, the cancel was lost, and the watch ran on, so the stop
that awaits it never ended (CI: ``reconcile down --gateway`` out of time after
tests/gateway/test_clock_idle.py, the engines' records removed as the gateway stopped).
In process: the watch's task on a started gateway's loop, the change and the cancel in
the order that lost it, turn by turn."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from procs import free_ports

from controller.gateway.lifecycle import process, registry
from controller.gateway.lifecycle.app import Gateway
from controller.gateway.settings import Settings
from controller.store.statedir import StateDir


def test_a_cancel_as_the_records_change_ends_the_watch(reconcile: Any) -> None:
    state = reconcile.state
    registry.ensure(state)
    StateDir(state).instances.mkdir(parents=True, exist_ok=True)
    settings = Settings(host="127.0.0.1", port=free_ports(1), state_dir=state)
    watcher = process.GatewayProcess(settings, "t1")
    watcher._routed = True  # past the daemon's first pass: the first look fills the table
    gateway = watcher.gateway = Gateway(settings)
    gateway.start(lambda: None)
    listening = gateway._listener
    assert listening is not None
    inode = os.fstat(listening.sockets[0].fileno()).st_ino
    watcher._listening = ("127.0.0.1", frozenset({inode}))  # as open() sets it (its guard)
    try:

        async def cancel_as_it_changes() -> bool:
            task = asyncio.get_running_loop().create_task(watcher.poll())
            front = gateway.front
            assert front is not None
            async with asyncio.timeout(10):  # its first look done, it waits for a change
                await front.table.loaded.wait()
                while watcher._changed.is_set():
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            watcher._changed.set()  # a record written (the watch's thread does this)
            await asyncio.sleep(0)  # the event's waiter is done, the watch not yet resumed
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=5)
            return bool(done) and task.cancelled()

        ended = asyncio.run_coroutine_threadsafe(cancel_as_it_changes(), gateway.loop)
        assert ended.result(timeout=30), "the watch ran on after its cancel"
    finally:
        gateway.stop()
        watcher._wake.close()
