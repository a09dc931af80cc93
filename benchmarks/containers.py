"""12. An engine in a container: manifest written → engine answering, next to the same
``podman run`` typed by hand (``python -m benchmarks --only containers``; needs podman).

Ours: from writing a manifest with ``spec.container`` into the folder a running daemon
watches until the stand-in engine (busybox's httpd in an image imported here, never
pulled) answers GET /health. By hand, the same command reconcile runs: ``podman run --rm
--network host`` of the same image and argv in the foreground, its output into a file
(as vLLM's and TGI's own docs type their ``docker run``; reconcile runs it attached so
that the engine's output reaches the deployment's log and the runtime's exit is seen),
until the same GET answers: both sides poll with the same loop. A second row, with no
goal, times ``podman run -d`` by hand: detached, the client returns before the engine
runs, ~8 ms sooner here, which reconcile pays for its log and its exit code. (An
earlier version timed ``reconcile --once --wait``: a new interpreter per trial, not what
a user runs, so not the same thing as a ``podman run``.) Trials alternate; all are torn
down after each trial and the image is removed at the end.

The podman configuration is the benchmark's own (``runc``, no default ulimits: what this
project's sandbox needs, as tests/containers/conftest.py says); both sides use it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.common import (
    HTTP_READY,
    Row,
    Workspace,
    free_port_block,
    reconcile_argv,
    run,
    stop,
    wait_for,
    workspace,
)

PODMAN_CONF = '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n'
STANDIN = [
    "/bin/busybox",
    "sh",
    "-c",
    'trap "exit 0" TERM; /bin/busybox httpd -f -p {port} -h /www & wait',
]


def answers(port: int) -> bool:
    """GET /health answered 200 (busybox's httpd answers a 1.0 request in HTTP/1.1)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            head = s.recv(16)
    except OSError:
        return False
    return head.startswith(b"HTTP/1.") and head[8:13] == b" 200 "


def _rootfs() -> bytes:
    busybox = shutil.which("busybox")
    assert busybox is not None, "the benchmark's image needs a static busybox (busybox-static)"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(busybox, arcname="bin/busybox")
        info = tarfile.TarInfo("www/health")
        info.size, info.mode = 3, 0o644
        tar.addfile(info, io.BytesIO(b"ok\n"))
    return buf.getvalue()


class _Ours:
    """Reconcile's daemon, already running and watching its folder (as a user's is):
    each trial writes one manifest and waits for its engine to answer, then deletes it
    and waits until its container is gone, so no pass is in flight at the next trial."""

    def __init__(self, ws: Workspace, env: dict[str, str]) -> None:
        self.ws = ws
        self.env = {**ws.env(), **env}
        self.log = ws.root / "daemon.log"
        # --allow-empty: a trial's deletion of the only manifest removes its deployment.
        argv = [*reconcile_argv(), *ws.common(), "--resync", "60s", "--allow-empty"]
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                argv, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=err,
            )  # fmt: skip
        wait_for(lambda: self.log.stat().st_size > 0, 60, "the daemon's first log line", 0.02)
        self.trial = 0

    def once(self, image: str) -> float:
        self.trial += 1
        name = f"box{self.trial}"
        port = free_port_block(4, 26000)
        spec = {
            "engine": "command",
            "command": STANDIN,
            "basePort": port,
            "readiness": HTTP_READY,
            "stopGracePeriodSeconds": 2,
            "container": {"image": image, "runtime": "podman"},
        }
        doc = {"apiVersion": "reconcile/v1", "kind": "Deployment", "metadata": {"name": name}}
        path = self.ws.manifests / f"{name}.yaml"
        start = time.perf_counter()
        path.write_text(json.dumps({**doc, "spec": spec}) + "\n")
        wait_for(lambda: answers(port), 60, "the engine answering", poll=0.005)
        took = time.perf_counter() - start
        path.unlink()
        record = self.ws.state / "instances" / f"{name}.json"
        wait_for(lambda: not record.exists() and not answers(port), 60, f"{name} removed", 0.02)
        return took * 1000

    def close(self) -> None:
        stop(self.proc, signal.SIGTERM)
        run([*reconcile_argv(), "down", *self.ws.common()], env=self.env, timeout=120)


def _by_hand(image: str, env: dict[str, str], out: Path, *, detached: bool) -> float:
    port = free_port_block(4, 27000)
    name = f"bench-{uuid.uuid4().hex[:8]}"
    program, *args = [a.replace("{port}", str(port)) for a in STANDIN]
    argv = ["podman", "run", *(["-d"] if detached else []), "--rm", "--name", name]
    argv += ["--network", "host", "--entrypoint", program, image, *args]
    full = {**os.environ, **env}
    client = None
    start = time.perf_counter()
    if detached:
        run(argv, env=full, timeout=120)
    else:
        with open(out, "ab") as log:
            client = subprocess.Popen(
                argv, env=full, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
    wait_for(lambda: answers(port), 60, "the container answering", poll=0.005)
    took = time.perf_counter() - start
    subprocess.run(
        ["podman", "rm", "-f", "-t", "0", name], env=full, capture_output=True, check=False
    )
    if client is not None:
        client.wait(60)
    return took * 1000


def bench(trials: int) -> list[Row]:
    if shutil.which("podman") is None:
        return [
            Row("12. containers", "manifest → engine answering (podman not installed)", "ms", [])
        ]
    folder = Path(tempfile.mkdtemp(prefix="reconcile-bench-podman-"))
    (folder / "containers.conf").write_text(PODMAN_CONF)
    env = {"CONTAINERS_CONF": str(folder / "containers.conf")}
    image = f"localhost/reconcile-bench/engine:{uuid.uuid4().hex[:8]}"
    full = {**os.environ, **env}
    subprocess.run(
        ["podman", "import", "-", image], input=_rootfs(), env=full, capture_output=True, check=True
    )
    ours: list[float] = []
    theirs: list[float] = []
    detached: list[float] = []
    try:
        with workspace("containers") as ws:
            daemon = _Ours(ws, env)
            try:
                for _ in range(trials):
                    ours.append(daemon.once(image))
                    theirs.append(_by_hand(image, env, folder / "out", detached=False))
                    detached.append(_by_hand(image, env, folder / "out", detached=True))
            finally:
                daemon.close()
    finally:
        subprocess.run(["podman", "rmi", "-f", image], env=full, capture_output=True, check=False)
        shutil.rmtree(folder, ignore_errors=True)
    metric = "manifest written → engine answering (podman)"
    row = Row(
        section="12. containers",
        metric=metric,
        unit="ms",
        ours=ours,
        theirs=theirs,
        alt="the same `podman run` by hand",
        goal="≤ 1.2x",
    )
    row.met = row.ratio is not None and row.ratio <= 1.2
    against_d = Row("12. containers", metric, "ms", ours, detached, "`podman run -d` by hand")
    return [row, against_d]
