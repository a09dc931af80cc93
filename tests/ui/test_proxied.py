"""The page behind nginx, as README's reverse proxy runs it (``proxy_set_header Host
localhost``: a keyless loopback gateway answers only a loopback name), in a real headless
Chromium: its buttons act there, and another site's posts are still refused."""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path
from typing import Any

import missing
from uipage import WAIT, Page

from controller.store.config import accesstoken

NGINX_CONF = """
daemon off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log;
events {{ worker_connections 64; }}
http {{
  access_log {tmp}/nginx-access.log;
  client_body_temp_path {tmp}/nginx-body;
  proxy_temp_path {tmp}/nginx-proxy;
  fastcgi_temp_path {tmp}/nginx-fastcgi;
  uwsgi_temp_path {tmp}/nginx-uwsgi;
  scgi_temp_path {tmp}/nginx-scgi;
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://127.0.0.1:{upstream};
      proxy_set_header Host localhost;
    }}
  }}
}}
"""


def _nginx(reconcile: Any, port: int, upstream: int) -> None:
    """nginx in front of the gateway on ``port``, listening when this returns; killed at
    teardown with its process group (its worker too)."""
    binary = shutil.which("nginx") or missing.skip("nginx", "apt-get install nginx")
    conf = reconcile.tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=reconcile.tmp, port=port, upstream=upstream))
    errors = reconcile.tmp / "nginx-error.log"
    proc = reconcile.spawn([binary, "-c", str(conf), "-e", str(errors)])
    deadline = time.monotonic() + WAIT
    while True:
        assert proc.poll() is None, f"nginx exited {proc.returncode}: {_text(errors)}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nginx not listening in {WAIT}s"
            time.sleep(0.1)


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else "(no log)"


def test_the_buttons_act_behind_nginx_that_sends_host_localhost(
    reconcile: Any, gateway: Any, page: Page
) -> None:
    reconcile.write("web")
    g = gateway()
    pid = g.wait_phase("web", "Ready")["pid"]
    front = reconcile.port + 13  # in the test's block, beside its engines and gateway
    _nginx(reconcile, front, g.port)
    token = accesstoken.read(reconcile.state)
    page.open(f"http://127.0.0.1:{front}/ui?token={token}")
    page.wait(lambda: page.rows().get("web", {}).get("phase") == "Ready", "web Ready")
    # The browser's Origin is nginx's address, its Host `localhost`: the restart was
    # refused as "from another origin" though it came from the page itself.
    page.click("#deployments button[data-action=restart][data-name=web]")
    said = page.wait(lambda: page.shown("notice") and page.text("notice"), "the action's notice")
    assert "restart of web asked by the web page" in said, said
    reconcile.wait_for(
        lambda: (
            (s := reconcile.status("web").get("web", {})).get("pid") not in (None, pid)
            and s["phase"] == "Ready"
        ),
        timeout=30,
        what="a new Ready instance of web",
    )
    # Another site's page in the same browser, posting to the page's API as a form or a
    # no-cors fetch can (a JSON one first asks CORS, which grants nothing): refused.
    other = f"http://localhost:{front}"  # another origin and site for the browser
    page.open(f"{other}/healthz")  # no CSP there to keep its script in
    for kind in ("text/plain", "application/json"):
        status = page.driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0], {method: 'POST', mode: 'no-cors', body: '{}',"
            " headers: {'Content-Type': arguments[1]}}).then((r) => done(r.type),"
            " (e) => done(String(e)));",
            f"http://127.0.0.1:{front}/ui/api/drain?token={token}",
            kind,
        )
        assert status == "opaque", (kind, status)  # sent, its answer hidden from the site
    assert not (reconcile.state / "drain.json").exists()
    assert "drain" not in [e["action"] for e in reconcile.events("web")]
    # Both reached the gateway (nginx logs a request once it has answered it).
    reconcile.wait_for(
        lambda: _text(reconcile.tmp / "nginx-access.log").count("POST /ui/api/drain") == 2,
        timeout=WAIT,
        what="both posts in nginx's access log",
    )
    page.open("about:blank")
    assert token not in page.driver.page_source
    g.finish()
