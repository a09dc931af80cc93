"""The two limits on a gateway's start say which one ran out.

The daemon's wait for a new gateway process's answer (keeper.START_WAIT) and that
process's own wait for its server thread (app.START_WAIT) both said "the gateway did not
start in time": a CI failure under load could not tell which had fired.
"""

from __future__ import annotations

import os

from controller.gateway.lifecycle import keeper


def test_a_gateway_process_that_never_answers_is_named_with_the_wait() -> None:
    ready_r, ready_w = os.pipe()
    try:
        said = keeper._read_answer(ready_r, 0.05)
    finally:
        os.close(ready_r)
        os.close(ready_w)
    assert said == "error: the gateway process did not answer within 0.05s of its start"
