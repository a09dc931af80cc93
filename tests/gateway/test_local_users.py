"""Another local user of the machine, at a keyless gateway on loopback (issue 34, items 2
and 5): every path of the page's API and the daemon's /metrics wants the state dir's
access token (a 0600 file only its owner reads), and a rebound host name gets 403 on
every path, the OpenAI ones included."""

from __future__ import annotations

import html
import http.client
import os
import stat
from pathlib import Path
from typing import Any

from gateway.conftest import Answer

from controller.gateway.ui import actions
from controller.store.config import accesstoken

METRICS = 14  # the metrics port: the test's port block + 14 (the gateway's is + 15)


def _request(
    port: int, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> Answer:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body or None, headers=headers or {})
        resp = conn.getresponse()
        return Answer(resp.status, dict(resp.getheaders()), resp.read())
    finally:
        conn.close()


def _page_api(name: str) -> list[tuple[str, str, bytes]]:
    """Every path and method of the page's API: its two reads and each action."""
    reads = [("GET", "/ui/api/state", b""), ("GET", f"/ui/api/logs/{name}", b"")]
    posts = [
        ("POST", f"/ui/api/{action}", f'{{"name": "{name}"}}'.encode())
        for action in (*actions.DEPLOYMENT_ACTIONS, *actions.NODE_ACTIONS)
    ]
    return reads + posts


def test_without_the_token_nothing_is_read_or_done(reconcile: Any, gateway: Any) -> None:
    reconcile.write("web", activation="OnDemand", idleTimeout="10m")
    metrics = reconcile.port + METRICS
    g = gateway("--metrics-port", str(metrics))
    g.wait_phase("web", "Idle")
    token_file = accesstoken.path(reconcile.state)
    info = token_file.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid(), info
    token = accesstoken.read(reconcile.state)
    assert len(token) >= 40, "a secrets-grade token"
    json_post = {"Content-Type": "application/json"}
    refused: list[str] = []
    wrong = [{}, {"Authorization": "Bearer nope"}, {"Authorization": f"Bearer {token[:-1]}"}]
    for headers in wrong:
        for method, path, body in _page_api("web"):
            for query in ("", "?token=nope"):
                sent = {**headers, **(json_post if method == "POST" else {})}
                answer = g.request(method, path + query, body or None, sent)
                assert answer.status == 401, (method, path, query, headers, answer)
                assert answer.json()["error"]["code"] == "invalid_token", answer
                assert b"web" not in answer.body and token.encode() not in answer.body
                refused.append(f"{method} {path}{query}")
        for method in ("GET", "HEAD"):
            for query in ("", "?token=nope"):
                answer = _request(metrics, method, f"/metrics{query}", headers)
                assert answer.status == 401, (method, query, headers, answer)
                assert b"web" not in answer.body
                refused.append(f"{method} /metrics{query}")
    assert len(refused) == 3 * (2 * len(_page_api("web")) + 4), refused
    # Nothing was done: no activation, restart or drain written, the engine never started.
    for folder in ("activation", "restart"):
        assert not list((reconcile.state / folder).glob("web*")), folder
    assert not (reconcile.state / "drain.json").exists()
    assert not [e for e in reconcile.events("web") if "key" in e], reconcile.events("web")
    assert reconcile.status("web")["web"]["phase"] == "Idle" and not reconcile.pids("web")
    # With the token, as ?token= (the page's URL) or Bearer: the same paths answer.
    state = g.request("GET", f"/ui/api/state?token={token}")
    assert state.status == 200 and [d["name"] for d in state.json()["deployments"]] == ["web"]
    bearer = {"Authorization": f"Bearer {token}"}
    assert g.request("GET", "/ui/api/logs/web", headers=bearer).status == 200
    load = g.request("POST", "/ui/api/load", {"name": "web"}, {**bearer, **json_post})
    assert load.status == 200, load
    g.wait_phase("web", "Ready")
    for action in ("drain", "uncordon"):
        done = g.request("POST", f"/ui/api/{action}?token={token}", {}, json_post)
        assert done.status == 200, done
    scraped = _request(metrics, "GET", f"/metrics?token={token}")
    assert scraped.status == 200 and b'deployment="web"' in scraped.body, scraped
    assert _request(metrics, "GET", "/metrics", bearer).status == 200
    assert _request(metrics, "HEAD", "/metrics", bearer).status == 200
    url = reconcile("ui", check=0).out.strip()
    assert url == f"http://127.0.0.1:{g.port}/ui?token={token}"
    # --open hands the browser a 0600 file that leads there: no token on a command line.
    opened, browser = reconcile.tmp / "opened.txt", reconcile.tmp / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$1" > {opened}\n')
    browser.chmod(0o755)
    reconcile("ui", "--open", check=0, env={"BROWSER": f"{browser} %s"})
    given = opened.read_text().strip()
    assert given.startswith("file://") and token not in given, given
    opener = Path(given.removeprefix("file://"))
    assert stat.S_IMODE(opener.stat().st_mode) == 0o600
    assert html.escape(url, quote=True) in opener.read_text()
    g.finish()
    # The token itself is in no log, event, status or record: only in its own file.
    said = {"daemon log": g.text(), "status": reconcile("status", "-o", "json", check=0).out}
    for path in reconcile.state.rglob("*"):
        if path.is_file() and path not in (token_file, opener):
            said[str(path)] = path.read_bytes().decode("latin-1")
    assert [where for where, text in said.items() if token in text] == []


def test_an_unsafe_token_file_is_refused_at_start(reconcile: Any) -> None:
    reconcile.state.mkdir(mode=0o700)
    token_file = accesstoken.path(reconcile.state)
    token_file.write_text("readable-by-all\n")
    token_file.chmod(0o644)
    result = reconcile("--listen", str(reconcile.port + 15), check=1)
    assert str(token_file) in result.err and "0644" in result.err, result
    assert "readable-by-all" not in result.err + result.out


def test_a_rebound_host_name_gets_403_on_every_path(reconcile: Any, gateway: Any) -> None:
    reconcile.write("lazy", activation="OnDemand", idleTimeout="10m")
    metrics = reconcile.port + METRICS
    g = gateway("--metrics-port", str(metrics))
    g.wait_phase("lazy", "Idle")
    token = accesstoken.read(reconcile.state)
    evil = {"Host": "evil.example", "Content-Type": "text/plain"}
    chat = b'{"model": "lazy", "messages": [{"role": "user", "content": "hi"}]}'
    asks = [
        ("POST", "/v1/chat/completions", chat),
        ("GET", "/v1/models", b""),
        ("GET", "/v1/models/lazy", b""),
        ("GET", "/healthz", b""),
        ("GET", "/ui", b""),
        ("GET", f"/ui/api/state?token={token}", b""),
        ("POST", f"/ui/api/load?token={token}", b'{"name": "lazy"}'),
    ]
    for method, path, body in asks:
        for host in ("evil.example", "evil.example:80", f"127.0.0.1.nip.io:{g.port}"):
            answer = _request(g.port, method, path, {**evil, "Host": host}, body)
            assert answer.status == 403, (method, path, host, answer)
            assert answer.json()["error"]["code"] == "forbidden", answer
            assert b"lazy" not in answer.body
            # ... with the next move (a trial's nginx in front sent its own Host)
            assert "send `Host: localhost`" in answer.json()["error"]["message"], answer
    answer = _request(metrics, "GET", f"/metrics?token={token}", evil)
    assert answer.status == 403 and b"lazy" not in answer.body, answer
    assert b"send `Host: localhost`" in answer.body, answer
    # Nothing started, nothing asked; a loopback name still gets in.
    assert reconcile.status("lazy")["lazy"]["phase"] == "Idle" and not reconcile.pids("lazy")
    assert not list((reconcile.state / "activation").glob("lazy*"))
    for host in (f"127.0.0.1:{g.port}", f"localhost:{g.port}", "[::1]"):
        assert _request(g.port, "GET", "/v1/models", {"Host": host}).status == 200, host
    assert _request(metrics, "GET", f"/metrics?token={token}").status == 200
    g.finish()


def test_with_keys_a_key_gets_in_whatever_the_host(reconcile: Any, gateway: Any) -> None:
    key = "sk-Hq4ZxWcVbNmLkJpOiUyT"
    keys = reconcile.tmp / "keys.txt"
    keys.write_text(key + "\n")
    keys.chmod(0o600)
    reconcile.write("web")
    g = gateway("--api-keys", str(keys))
    g.wait_phase("web", "Ready")
    named = {"Host": "gpu-box.lan", "Authorization": f"Bearer {key}"}
    assert _request(g.port, "GET", "/v1/models", named).status == 200
    assert _request(g.port, "GET", "/ui/api/state", named).status == 200
    token = accesstoken.read(reconcile.state)  # not a key: with keys the page wants one
    assert g.request("GET", f"/ui/api/state?token={token}").status == 401
    g.finish()


def test_the_token_on_an_api_path_never_reaches_the_engine(reconcile: Any, gateway: Any) -> None:
    """README: the token "is accepted as ``?token=`` on any page or API path" and "never
    appears in logs": the gateway keeps it, and the engine gets the rest of the query as
    sent (the demo engine logs each request line, which `reconcile logs` shows)."""
    reconcile.write("web")
    g = gateway()
    g.wait_phase("web", "Ready")
    token = accesstoken.read(reconcile.state)
    chat = {"model": "web", "messages": [{"role": "user", "content": "hi"}]}
    sent = {
        f"?token={token}&x=1": "?x=1",
        f"?a=%2F&token={token}&b=2&b=3": "?a=%2F&b=2&b=3",
        f"?%74oken={token}": "",  # the name as a browser may encode it is the same name
        f"?token={token}": "",
    }
    for query in sent:
        answer = g.request("POST", f"/v1/chat/completions{query}", chat)
        assert answer.status == 200, (query, answer)
    engine_log = "\n".join(reconcile("logs", "web", "--tail", "100", check=0).out.splitlines())
    lines = [line for line in engine_log.splitlines() if "POST /v1/chat/completions" in line]
    assert [line.split('"')[1] for line in lines] == [
        f"POST /v1/chat/completions{kept} HTTP/1.1" for kept in sent.values()
    ], engine_log
    g.finish()
    token_file = accesstoken.path(reconcile.state)
    said = {"daemon log": g.text()}
    for path in reconcile.state.rglob("*"):
        if path.is_file() and path != token_file:
            said[str(path)] = path.read_bytes().decode("latin-1")
    assert [where for where, text in said.items() if token in text] == []
