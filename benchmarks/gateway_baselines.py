"""Other proxies in front of the same fake engine, for ``benchmarks.gateway`` to compare.

bare aiohttp, raw python, uvicorn asgi, httptools h1 and the work floors: ``python_proxies.py``,
the gateway's framework with none of its own work (what aiohttp and the loop cost, so the
rest is the gateway's), no framework at all (the floor of any Python proxy on this box),
two other servers with a plain pooled engine client: uvicorn's, and one of its own on
httptools (both the bench extra's), and the gateway's work done flat, on that server of
its own and on the gateway's. nginx: a reverse proxy with keep-alive to the engine,
one worker, a temporary config, run in the foreground (``daemon off;``) and killed after.
LiteLLM: its proxy, from a separate virtual environment (``--litellm PATH/bin/litellm``),
with the engine as an OpenAI-compatible upstream. Each is skipped, with the reason, when it
cannot run here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

# LiteLLM refuses to start without a master key; the load generator sends it to every
# proxy (the others pass it on or ignore it), so each request is the same bytes.
KEY = "sk-gwbench-0123456789abcdef0123456789abcdef"

NGINX_CONF = """
worker_processes 1;
error_log {tmp}/error.log warn;
pid {tmp}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  upstream engine {{ server 127.0.0.1:{upstream}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""

LITELLM_CONF = """
general_settings:
  master_key: {key}
model_list:
  - model_name: hot
    litellm_params:
      model: openai/hot
      api_base: http://127.0.0.1:{upstream}/v1
      api_key: none
"""


@contextlib.contextmanager
def nginx(tmp: Path, upstream: int, port: int) -> Iterator[str | None]:
    """nginx on ``port`` in front of ``upstream``: yields its URL, or None if absent."""
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if exe is None:
        yield None
        return
    folder = tmp / "nginx"
    folder.mkdir(mode=0o755)
    tmp.chmod(0o755)  # its worker (user nobody when run as root) writes its temp folders here
    conf = folder / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=folder, upstream=upstream, port=port))
    with _running([exe, "-c", str(conf), "-g", "daemon off;"], folder / "stderr.log") as proc:
        yield _up(proc, port, "/health")


@contextlib.contextmanager
def python_proxy(kind: str, tmp: Path, upstream: int, port: int) -> Iterator[str | None]:
    """``python_proxies.py --kind KIND`` (``bare`` aiohttp, ``raw``, ``asgi``, ``h1``,
    ``work`` or ``served``) on ``port``; None when it did not start (all but ``bare`` and
    ``raw`` need the bench extra). ``work`` and ``served`` write their request logs in
    ``tmp``."""
    script = Path(__file__).with_name("python_proxies.py")
    argv = [sys.executable, str(script), "--kind", kind, "--port", str(port)]
    if kind in ("work", "served"):
        argv += ["--log-dir", str(tmp)]
    with _running([*argv, "--upstream", str(upstream)], tmp / f"{kind}.log") as proc:
        yield _up(proc, port, "/health")


@contextlib.contextmanager
def litellm(tmp: Path, exe: str | None, upstream: int, port: int) -> Iterator[str | None]:
    """LiteLLM's proxy on ``port`` routing model ``hot`` to ``upstream``; None if absent."""
    if exe is None or not Path(exe).exists():
        yield None
        return
    conf = tmp / "litellm.yaml"
    conf.write_text(LITELLM_CONF.format(upstream=upstream, key=KEY))
    argv = [exe, "--config", str(conf), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--num_workers", "1"]
    with _running(argv, tmp / "litellm.log") as proc:
        yield _up(proc, port, "/health/liveliness", wait=120.0)


@contextlib.contextmanager
def _running(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)  # nginx: fast shutdown
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):  # the group: workers too
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _up(proc: subprocess.Popen[bytes], port: int, path: str, wait: float = 20.0) -> str | None:
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + wait
    while time.monotonic() < end and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + path, timeout=2):
                return url
        except OSError:
            time.sleep(0.2)
    return None
