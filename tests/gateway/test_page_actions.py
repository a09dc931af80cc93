"""The page's API and the CLI on what a drained node and replicas make of them (issue
34, items 8 and 21): a restart a drain would leave down is refused with the way out, and
a replicated deployment shows its worst replica and every replica's restarts."""

from __future__ import annotations

import os
import signal
from typing import Any

from controller.store.config import accesstoken

JSON = {"Content-Type": "application/json"}


def _state(g: Any, token: str) -> dict[str, dict[str, Any]]:
    answer = g.request("GET", f"/ui/api/state?token={token}")
    assert answer.status == 200, answer
    return {item["name"]: item for item in answer.json()["deployments"]}


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
    codes = reconcile("restart", "--help", check=0).out.split("exit codes:")[1]
    assert "the node is drained (refused)" in codes, codes  # its help named no such 1
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


def test_a_replicated_deployment_shows_its_worst_phase_and_every_restart(
    reconcile: Any, gateway: Any
) -> None:
    reconcile.devices = "nvidia:0,nvidia:1"  # room for two of the three replicas
    reconcile.write("web", replicas=3, devices={"count": 1, "kind": "nvidia"})
    g = gateway()
    g.wait_phase("web@2", "Pending")
    pid = g.wait_phase("web@1", "Ready")["pid"]
    os.kill(pid, signal.SIGKILL)
    reconcile.wait_for(
        lambda: (
            (s := reconcile.status("web@1")["web@1"])["restarts"] == 1 and s["phase"] == "Ready"
        ),
        timeout=30,
        what="web@1 restarted and Ready",
    )
    token = accesstoken.read(reconcile.state)
    web = _state(g, token)["web"]
    assert (web["worst_phase"], web["restarts_total"]) == ("Pending", 1), web
    assert (web["phase"], web["restarts"]) == ("Ready", 0), web  # replica 0's, as before
    cli = reconcile("status", "web", "-o", "json", check=0).json()[0]
    assert (cli["worst_phase"], cli["restarts_total"]) == ("Pending", 1), cli
    g.finish()


EMPTY = "no manifest in {} (it is empty): nothing pruned (--allow-empty to prune)"


def test_an_emptied_folder_is_said_on_the_page_and_in_describe(
    reconcile: Any, gateway: Any
) -> None:
    """The page's items lacked `conditions` (and `observed_at`) and describe said nothing
    of them: with its manifest folder emptied, a deployment kept running unpruned and
    only `status` said why; the page and describe showed it as if it were wanted."""
    path = reconcile.write("web")
    g = gateway()
    g.wait_phase("web", "Ready")
    token = accesstoken.read(reconcile.state)
    assert _state(g, token)["web"]["conditions"] == []
    path.unlink()  # the daemon's pass prunes nothing and notes why
    web = reconcile.wait_for(
        lambda: (w := _state(g, token)["web"])["conditions"] and w,
        what="the page says the folder is empty",
    )
    empty = EMPTY.format(reconcile.manifests)
    assert web["conditions"] == [empty] and web["phase"] == "Ready", web
    cli = reconcile("status", "web", "-o", "json", check=0).json()[0]
    assert web["observed_at"] is not None and cli["conditions"] == [empty], (web, cli)
    said = reconcile("describe", "web", check=0).out
    assert f"Conditions:   {empty}" in said, said
    (doc,) = reconcile("describe", "web", "-o", "json", check=0).json()
    assert doc["conditions"] == [empty] and doc["observed_at"], doc
    g.finish()


def test_the_log_of_a_name_nothing_knows_is_a_404(reconcile: Any, gateway: Any) -> None:
    """It was a 200 with no lines: read as an engine that said nothing. A deployment's
    log is there while it has a record, and after `down` (which keeps logs)."""
    reconcile.write("web")
    g = gateway()
    g.wait_phase("web", "Ready")
    token = accesstoken.read(reconcile.state)
    known = g.request("GET", f"/ui/api/logs/web?token={token}")
    assert known.status == 200 and known.json()["name"] == "web", known
    unknown = g.request("GET", f"/ui/api/logs/nosuch?token={token}")
    assert unknown.status == 404, unknown
    said = unknown.json()["error"]
    assert said["code"] == "not_found" and "nosuch" in said["message"], unknown
    g.finish()


def test_an_action_with_no_deployment_name_is_a_400_saying_so(reconcile: Any, gateway: Any) -> None:
    """A deployment action whose body names none (``{}``) or names it with no string
    (``{"name": 5}``) is the caller's mistake, a 400 saying what to send: it was a 404, "no
    deployment named ''" (or '5'), read as a deployment that is gone. Nothing is done."""
    reconcile.write("web")
    g = gateway()
    pid = g.wait_phase("web", "Ready")["pid"]
    token = accesstoken.read(reconcile.state)
    for body, said in (
        ({}, 'restart needs a deployment: send {"name": NAME}'),
        ({"name": ""}, 'restart needs a deployment: send {"name": NAME}'),
        ({"name": 5}, "`name` must be a deployment's name, a string"),
    ):
        answer = g.request("POST", f"/ui/api/restart?token={token}", body, JSON)
        assert answer.status == 400, (body, answer)
        assert answer.json()["error"]["message"] == said, (body, answer)
    nosuch = g.request("POST", f"/ui/api/restart?token={token}", {"name": "nosuch"}, JSON)
    assert nosuch.status == 404, nosuch  # a name nothing knows stays a 404
    _still_running(reconcile, pid)
    g.finish()


def test_the_page_sends_an_operators_headers_and_refuses_another_sites_post(
    reconcile: Any, gateway: Any
) -> None:
    reconcile.write("web")
    g = gateway()
    g.wait_phase("web", "Ready")
    token = accesstoken.read(reconcile.state)
    for path in ("/ui", "/ui/app.js", f"/ui/api/state?token={token}"):
        answer = g.request("GET", path)
        assert answer.status == 200, (path, answer)
        said = {k.lower(): v for k, v in answer.headers.items()}
        assert said["x-frame-options"] == "DENY", (path, said)
        assert "frame-ancestors 'none'" in said["content-security-policy"], (path, said)
        assert said["x-content-type-options"] == "nosniff", (path, said)
        assert said["cache-control"] == "no-store", (path, said)
        assert "strict-transport-security" not in said, (path, said)  # plain HTTP: none
    # Its refusals too: a 401, a 404 and a 400 of the page's API.
    refusals = [
        ("GET", "/ui/api/state", 401),
        ("GET", f"/ui/api/logs/nothing?token={token}", 404),
        ("POST", f"/ui/api/restart?token={token}", 400),
    ]
    for method, path, status in refusals:
        answer = g.request(method, path, b"[]", JSON)
        assert answer.status == status, (path, answer)
        said = {k.lower(): v for k, v in answer.headers.items()}
        assert said.get("x-content-type-options") == "nosniff", (path, said)
        assert said.get("cache-control") == "no-store", (path, said)
    drain = f"/ui/api/drain?token={token}"
    # A browser's word that another site sent it, with no Origin: refused all the same.
    for site in ("cross-site", "same-site"):
        answer = g.request("POST", drain, b"{}", {**JSON, "Sec-Fetch-Site": site})
        assert answer.status == 403, (site, answer)
        assert f"Sec-Fetch-Site: {site}" in answer.json()["error"]["message"], answer
    assert not (reconcile.state / "drain.json").exists()
    # The page's own call behind a proxy that sends its own Host: Origin differs, the
    # browser says same-origin, and that is what counts.
    own = {**JSON, "Origin": "https://gpu.example.org", "Sec-Fetch-Site": "same-origin"}
    answer = g.request("POST", drain, b"{}", {**own, "Host": "localhost"})
    assert answer.status == 200, answer
    assert (reconcile.state / "drain.json").exists()
    g.finish()
