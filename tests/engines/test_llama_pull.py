"""The real llama.cpp server, its model pulled through ``spec.source.url`` (marker: ``llama``).

The tiny random-weight GGUF is served by a local HTTP server (with Range, as a mirror
would); the deployment names no ``spec.model``, only the source and its sha256. The
daemon (with ``--listen``) pulls it into the model cache, starts ``llama-server -m
<the cached file>``, and a chat completion by the deployment's name comes back through
the gateway. Needs the ``llama-server`` build (``scripts/build-llama-server``); it fails,
never skips, when that cannot be built.
"""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # plain `pytest` puts only this folder on sys.path
    sys.path.insert(0, str(ROOT))

from tests.engines.test_llama_e2e import (  # noqa: E402, F401 (fixtures)
    REPO,
    Cli,
    chat,
    free_port,
    llama_server,
    marked_pids,
    node,
)
from tests.fixtures.tiny_gguf import write_tiny_llama_gguf  # noqa: E402
from tests.modelservers import serving  # noqa: E402

pytestmark = pytest.mark.llama

MANIFEST = """\
apiVersion: reconcile/v1
kind: Deployment
metadata:
  name: tiny
spec:
  engine: llama-cpp
  source:
    url: {url}
    sha256: {sha256}
  executable: {binary}
  args: ["--threads", "1", "--ctx-size", "256", "--parallel", "1"]
  devices:
    count: 0
  basePort: {base_port}
  readiness:
    httpGet: {{path: /health}}
    deadlineSeconds: 60
    periodSeconds: 1
  stopGracePeriodSeconds: 5
"""
WAIT = 180.0  # seconds for the pull and the engine's start on a busy 2-core box


def wait_ready(cli: Cli, daemon: subprocess.Popen[bytes]) -> dict[str, object]:
    deadline = time.monotonic() + WAIT
    while True:
        assert daemon.poll() is None, f"daemon exited {daemon.returncode}"
        item = cli.status().get("tiny")
        if item is not None and item["phase"] == "Ready":
            return item
        assert time.monotonic() < deadline, f"not Ready after {WAIT}s: {item}"
        time.sleep(0.5)


def test_llama_cpp_pulls_its_gguf_from_a_url_and_serves_through_the_gateway(
    llama_server: Path,  # noqa: F811
    node: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    gguf = write_tiny_llama_gguf(tmp_path / "served" / "tiny.gguf").read_bytes()
    digest = hashlib.sha256(gguf).hexdigest()
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    state = tmp_path / "state"
    cli = Cli(manifests, state, node)
    listen = free_port()
    with serving({"tiny.gguf": gguf}) as server:
        (manifests / "tiny.yaml").write_text(
            MANIFEST.format(
                url=server.url("tiny.gguf"),
                sha256=digest,
                binary=llama_server,
                base_port=free_port(),
            )
        )
        argv = [sys.executable, "-m", "controller", "-f", str(manifests), "--listen", str(listen)]
        with open(tmp_path / "daemon.log", "wb") as log:
            daemon = subprocess.Popen([*argv, *cli.common], stderr=log, cwd=REPO)
        try:
            item = wait_ready(cli, daemon)
            status, reply = chat(listen, "tiny")
            assert status == 200, reply
            assert reply["usage"]["completion_tokens"] > 0, reply
            assert isinstance(reply["choices"][0]["message"]["content"], str), reply
            cached = state / "models" / f"sha256-{digest}" / "tiny.gguf"
            assert cached.read_bytes() == gguf
            pid = item["pid"]
            argv_seen = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert argv_seen[argv_seen.index(b"-m") + 1] == str(cached).encode()
            assert server.requests == 1  # pulled once
        finally:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
            cli.ok("down", "--gateway", "-f", str(manifests))
    assert marked_pids(f"{node}/") == set()
