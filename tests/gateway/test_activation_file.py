"""An ``activation/`` that is a file: a request for an OnDemand deployment is answered
at once (nothing can wake it), and the log names the file."""

from __future__ import annotations

from typing import Any


def test_an_activation_folder_that_is_a_file_is_answered_at_once(
    reconcile: Any, gateway: Any
) -> None:
    reconcile.write("lazy", activation="OnDemand", idleTimeout="3s")
    g = gateway()
    g.wait_phase("lazy", "Idle")
    folder = reconcile.state / "activation"
    if folder.is_dir():
        folder.rmdir()
    folder.write_text("")  # a stray file where the gateway keeps its demand
    answer = g.post("lazy")
    assert answer.status == 503, answer
    message = answer.json()["error"]["message"]
    assert "cannot be started: its demand could not be written" in message, message
    assert str(folder) not in message  # a path is the operator's, not the client's
    named = f"{folder} is not a folder"
    reconcile.wait_for(lambda: named in g.text(), what="the log naming the file")
    assert not reconcile.pids("lazy")
    folder.unlink()
    assert g.post("lazy").status == 200  # the folder is made again: it starts
    g.finish()
