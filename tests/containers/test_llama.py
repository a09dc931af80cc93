"""The real llama.cpp server in a container, answering a chat completion through the
gateway (marker ``llama``), on podman and docker.

The image is built here: the cached ``llama-server`` (scripts/build-llama-server) and the
libraries ``ldd`` names, at their paths, imported as a root filesystem. The model is the
tiny random-weight GGUF (tests/fixtures/tiny_gguf.py) in the test's tmp folder, which the
container gets read-only at the same path because spec.model names a file there.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from containers.conftest import Engine
from procs import free_ports

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.fixtures.tiny_gguf import write_tiny_llama_gguf  # noqa: E402

if TYPE_CHECKING:
    from conftest import Reconcile

pytestmark = pytest.mark.llama
CHAT_WAIT = 180.0  # seconds until the gateway listens and the engine answers (a cold start)
PROGRAM = "/app/llama-server"


@pytest.fixture(scope="session")
def llama_rootfs() -> bytes:
    """A tar of llama-server at /app and every library ldd names, at its own path."""
    build = subprocess.run(
        [str(REPO / "scripts" / "build-llama-server")], capture_output=True, text=True, timeout=3600
    )
    assert build.returncode == 0, build.stderr[-4000:]
    binary = Path(build.stdout.strip().splitlines()[-1])
    libs = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(binary, arcname=PROGRAM.lstrip("/"))
        for line in libs.stdout.splitlines():
            path = next((p for p in line.split() if p.startswith("/")), None)
            if path is not None:  # linux-vdso has none: the kernel maps it
                tar.add(os.path.realpath(path), arcname=path.lstrip("/"))
        info = tarfile.TarInfo("tmp")
        info.type, info.mode = tarfile.DIRTYPE, 0o1777
        tar.addfile(info)
    return buf.getvalue()


@pytest.fixture
def llama_image(engine: Engine, llama_rootfs: bytes) -> str:
    """The image on this runtime; built once per runtime (removed with the session's)."""
    tag = f"localhost/reconcile-test/llama:{engine.name}-{os.getpid()}"
    if tag not in engine.images:
        engine.cli("import", "-", tag, input=llama_rootfs)
        engine.images.append(tag)
    return tag


def chat(port: int, model: str) -> tuple[int, dict[str, Any]]:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        reply: dict[str, Any] = json.loads(answer.read())
        return answer.status, reply


@pytest.mark.timeout(400)  # a cold llama.cpp start on a loaded 2-core box, then the stop
def test_llama_server_in_a_container_answers_through_the_gateway(
    rc: Reconcile, engine: Engine, llama_image: str, tmp_path: Path
) -> None:
    model = write_tiny_llama_gguf(tmp_path / "models" / f"tiny-{uuid.uuid4().hex[:6]}.gguf")
    doc = rc.deployment(
        "tiny",
        engine="llama-cpp",
        command=None,
        model=str(model),
        executable=PROGRAM,
        args=["--threads", "1", "--ctx-size", "256", "--parallel", "1"],
        basePort=rc.port,
        readiness={"httpGet": {"path": "/health"}, "deadlineSeconds": 120, "periodSeconds": 0.5},
        container={"image": llama_image, "runtime": engine.name},
    )
    rc.write_text("tiny.yaml", rc.dump_yaml(doc))
    listen = free_ports(1)
    daemon = rc.popen("--listen", str(listen))
    try:
        status, reply = _first_chat(daemon, listen, "tiny")
        assert status == 200, reply
        assert isinstance(reply["choices"][0]["message"]["content"], str), reply
        assert reply["usage"]["completion_tokens"] > 0, reply
        record = rc.record("tiny")
        assert record is not None and record["container"]["runtime"] == engine.name
        assert engine.ours(rc.state) == [record["container"]["id"]]
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
        rc("down", "--gateway", check=0)
    assert engine.ours(rc.state) == []


def _first_chat(daemon: subprocess.Popen[bytes], port: int, model: str) -> tuple[int, Any]:
    deadline = time.monotonic() + CHAT_WAIT
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
