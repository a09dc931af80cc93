"""The page's API and the CLI on what a drained node makes of them (issue 34, item 8): a
restart a drain would leave down is refused with the way out."""

from __future__ import annotations

from typing import Any

from controller.store import accesstoken

JSON = {"Content-Type": "application/json"}


def _still_running(reconcile: Any, pid: int) -> None:
    """Nothing was asked: the engine runs on, Ready, with its pid."""
    assert not list((reconcile.state / "restart").glob("web*"))
    item = reconcile.status("web")["web"]
    assert (item["phase"], item["pid"]) == ("Ready", pid) and reconcile.alive(pid), item


def test_restart_on_a_drained_node_is_refused_with_the_way_out(
    reconcile: Any, gateway: Any
) -> None:
    reconcile.write("web")
    g = gateway()
    pid = g.wait_phase("web", "Ready")["pid"]
    token = accesstoken.read(reconcile.state)
    reconcile("drain", "--reason", "swap the fans", check=0)
    refused = reconcile("restart", "web", check=1)
    said = refused.err
    assert "restart refused" in said and "swap the fans" in said, said
    assert "`reconcile uncordon` first" in said, said
    _still_running(reconcile, pid)
    answer = g.request("POST", f"/ui/api/restart?token={token}", {"name": "web"}, JSON)
    assert answer.status == 409, answer
    message = answer.json()["error"]["message"]
    assert "drained" in message and "`reconcile uncordon`" in message, message
    _still_running(reconcile, pid)
    reconcile("uncordon", check=0)
    assert reconcile("restart", "web", check=0).code == 0
    assert reconcile.status("web")["web"]["pid"] != pid
    g.finish()
