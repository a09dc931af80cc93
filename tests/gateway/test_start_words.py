"""The two limits on a gateway's start say which one ran out.

The daemon's wait for a new gateway process's answer (keeper.START_WAIT) and that
process's own wait for its server thread (app.START_WAIT) both said "the gateway did not
start in time": a CI failure under load could not tell which had fired.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from procs import free_ports

from controller.errors import ConfigError
from controller.gateway.lifecycle import app, keeper
from controller.gateway.settings import Settings


def test_a_gateway_process_that_never_answers_is_named_with_the_wait() -> None:
    ready_r, ready_w = os.pipe()
    try:
        said = keeper._read_answer(ready_r, 0.05)
    finally:
        os.close(ready_r)
        os.close(ready_w)
    assert said == "error: the gateway process did not answer within 0.05s of its start"


def test_a_server_thread_that_fails_before_its_loop_runs_says_why_at_once(tmp_path: Path) -> None:
    """The server thread started the request log's writer before the guard that reports
    its failures: a writer the host refused (`can't start new thread`, at its thread
    limit under load) killed the server thread unreported, and `start` waited out its
    whole limit to say the server "did not start within 10s", as a load flake of
    test_ended once did. Any failure of the thread is said at once, with its own words.
    A thread starts once: the writer, started here first, fails there for real."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    gateway = app.Gateway(Settings(host="127.0.0.1", port=free_ports(1), state_dir=state))
    gateway.requests.start()
    try:
        with pytest.raises(ConfigError, match="cannot serve: threads can only be started once"):
            gateway.start(lambda: None)
    finally:
        gateway.requests.close()
        gateway.loop.close()
