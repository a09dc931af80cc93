"""End to end against the real CLI and a real llama.cpp server (marker: ``llama``).

Two ``engine: llama-cpp`` deployments of a tiny random-weight GGUF on a node with no
devices: both come up Ready on different ports and answer completions; a SIGKILLed
engine is replaced by the next pass; a removed manifest's engine and record go away;
``reconcile down`` leaves nothing behind.

The ``llama-server`` binary comes from ``scripts/build-llama-server`` (cached after the
first build, which takes minutes). If it cannot be built this test FAILS: it never
skips. Every process it starts carries ``RECONCILE_INSTANCE=<node>/...`` with a node
name unique to the test, and teardown kills whatever still carries it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # plain `pytest` puts only this folder on sys.path
    sys.path.insert(0, str(REPO))

from tests.fixtures.tiny_gguf import write_tiny_llama_gguf  # noqa: E402

pytestmark = pytest.mark.llama

BUILD_SCRIPT = REPO / "scripts" / "build-llama-server"
CLI_TIMEOUT = 240  # seconds for one CLI call (a pass waits at most --timeout 120s)


@pytest.fixture(scope="session")
def llama_server() -> Path:
    """The cached llama-server binary; builds it (minutes) on first use."""
    try:
        proc = subprocess.run(
            [str(BUILD_SCRIPT)],
            capture_output=True,
            text=True,
            timeout=3600,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"scripts/build-llama-server did not run: {exc}")
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        pytest.fail(
            f"scripts/build-llama-server failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    binary = Path(lines[-1])
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        pytest.fail(f"scripts/build-llama-server printed {binary}, which is not an executable")
    return binary


def marked_pids(prefix: str) -> set[int]:
    """Live processes whose environment has RECONCILE_INSTANCE starting with ``prefix``."""
    needle = f"RECONCILE_INSTANCE={prefix}".encode()
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:  # gone, or not ours to read
            continue
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":  # a zombie is no engine
            continue
        if any(var.startswith(needle) for var in environ.split(b"\0")):
            found.add(int(entry.name))
    return found


@pytest.fixture
def node() -> Iterator[str]:
    """A node name unique to this test; teardown kills anything still carrying it."""
    name = f"e2e-{uuid.uuid4().hex[:10]}"
    yield name
    for pid in marked_pids(f"{name}/"):
        with contextlib.suppress(OSError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


MANIFEST = """\
apiVersion: reconcile/v1
kind: Deployment
metadata:
  name: {name}
spec:
  engine: llama-cpp
  model: {model}
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


class Cli:
    def __init__(self, manifests: Path, state: Path, node: str) -> None:
        self.common = ["--state-dir", str(state), "--devices", "none", "--node", node]
        self.manifests = manifests

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "controller", *args, *self.common],
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
            cwd=REPO,
        )

    def ok(self, *args: str) -> subprocess.CompletedProcess[str]:
        proc = self.run(*args)
        assert proc.returncode == 0, (
            f"reconcile {' '.join(args)} exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
        )
        return proc

    def converge(self, *extra: str) -> None:
        self.ok("-f", str(self.manifests), "--once", "--wait", "--timeout", "120s", *extra)

    def status(self) -> dict[str, dict[str, Any]]:
        items = json.loads(self.ok("status", "-o", "json").stdout)
        assert isinstance(items, list)
        return {item["name"]: item for item in items}


def complete(port: int, prompt: str = "hello") -> dict[str, Any]:
    body = json.dumps({"prompt": prompt, "n_predict": 8}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        reply: dict[str, Any] = json.loads(resp.read())
    return reply


def assert_ready(item: dict[str, Any]) -> None:
    assert item["phase"] == "Ready", item
    assert item["ready"] is True, item
    assert item["spec_valid"] is True, item
    assert isinstance(item["pid"], int) and item["pid"] > 0, item
    assert isinstance(item["port"], int), item
    assert item["devices"] == [], item


def wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            return
        if state == "Z":
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} still alive after SIGKILL")


def test_llama_cpp_lifecycle(llama_server: Path, node: str, tmp_path: Path) -> None:
    model = write_tiny_llama_gguf(tmp_path / "models" / "tiny.gguf")
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    state = tmp_path / "state"
    base_port = free_port()
    for name in ("tiny-a", "tiny-b"):
        # One model path per deployment: each spec.model reaches its own engine here (a
        # shared one would be a pool the gateway balances over; DESIGN: the gateway).
        mine = model.with_name(f"{name}.gguf")
        os.link(model, mine)
        (manifests / f"{name}.yaml").write_text(
            MANIFEST.format(name=name, model=mine, binary=llama_server, base_port=base_port)
        )
    cli = Cli(manifests, state, node)

    # 1. One pass brings both up, Ready, on different ports.
    cli.converge()
    status = cli.status()
    assert set(status) == {"tiny-a", "tiny-b"}, status
    for item in status.values():
        assert_ready(item)
    assert status["tiny-a"]["port"] != status["tiny-b"]["port"]
    assert status["tiny-a"]["pid"] != status["tiny-b"]["pid"]
    assert marked_pids(f"{node}/tiny-a/") == {status["tiny-a"]["pid"]}
    assert marked_pids(f"{node}/tiny-b/") == {status["tiny-b"]["pid"]}

    # 2. Both serve completions.
    for item in status.values():
        reply = complete(item["port"])
        assert reply["tokens_predicted"] > 0, reply
        assert isinstance(reply["content"], str) and reply["content"].strip(), reply

    # 3. SIGKILL one engine: the next pass replaces it.
    old_pid = status["tiny-a"]["pid"]
    os.kill(old_pid, signal.SIGKILL)
    wait_gone(old_pid)
    cli.converge()
    status = cli.status()
    assert_ready(status["tiny-a"])
    assert status["tiny-a"]["pid"] != old_pid
    assert status["tiny-a"]["restarts"] >= 1, status["tiny-a"]
    assert status["tiny-b"]["pid"] != old_pid
    assert complete(status["tiny-a"]["port"])["tokens_predicted"] > 0

    # 4. Remove one manifest: one pass tears its engine down and drops its record.
    (manifests / "tiny-b.yaml").unlink()
    cli.ok("-f", str(manifests), "--once")
    status = cli.status()
    assert set(status) == {"tiny-a"}, status
    assert marked_pids(f"{node}/tiny-b/") == set()
    assert_ready(status["tiny-a"])

    # 5. down: nothing left, neither records nor processes.
    cli.ok("down", "-f", str(manifests))
    assert cli.status() == {}
    assert marked_pids(f"{node}/") == set()


def chat(port: int, model: str) -> tuple[int, dict[str, Any]]:
    """One OpenAI chat completion through the gateway on ``port``."""
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        reply: dict[str, Any] = json.loads(resp.read())
        return resp.status, reply


def test_llama_cpp_through_the_gateway(llama_server: Path, node: str, tmp_path: Path) -> None:
    """The daemon with --listen: one chat completion by model name, no port known."""
    model = write_tiny_llama_gguf(tmp_path / "models" / "tiny.gguf")
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "tiny.yaml").write_text(
        MANIFEST.format(name="tiny", model=model, binary=llama_server, base_port=free_port())
    )
    cli = Cli(manifests, tmp_path / "state", node)
    listen = free_port()
    argv = [sys.executable, "-m", "controller", "-f", str(manifests), "--listen", str(listen)]
    with open(tmp_path / "daemon.log", "wb") as log:
        daemon = subprocess.Popen([*argv, *cli.common], stderr=log, cwd=REPO)
    try:
        # The gateway holds the request until the engine is Ready (its readiness deadline).
        status, reply = _first_chat(daemon, listen, "tiny")
        assert status == 200, reply
        content = reply["choices"][0]["message"]["content"]
        assert isinstance(content, str), reply
        assert reply["usage"]["completion_tokens"] > 0, reply
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:  # stuck: killed, or it would start what down stops
            daemon.kill()
            daemon.wait()
        cli.ok("down", "--gateway", "-f", str(manifests))  # the gateway outlives the daemon
    assert marked_pids(f"{node}/") == set()


def _first_chat(daemon: subprocess.Popen[bytes], port: int, model: str) -> tuple[int, Any]:
    deadline = time.monotonic() + CLI_TIMEOUT
    while True:  # until the gateway listens: then one request, held until Ready
        assert daemon.poll() is None, f"daemon exited {daemon.returncode}"
        try:
            return chat(port, model)
        except urllib.error.HTTPError:
            raise  # the gateway answered: an error is the test's failure
        except urllib.error.URLError:  # not listening yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
