"""Real podman and docker for the container tests; every test runs on both (``engine``).

Set-up this box needs, kept here and never in the product (a normal host needs none):

- podman: ``CONTAINERS_CONF`` names a file with ``default_ulimits = []`` (the default
  ulimits cannot be set in this sandbox) and the ``runc`` runtime (crun refuses its
  cgroup layout). The file is the session's, passed to the CLI through its environment.
- docker: a daemon. When none answers, the session starts a private ``dockerd`` of its
  own (its socket, data root and exec root in a tmp folder; no bridge, no iptables: the
  engines use the host's network) and stops it at the end; ``DOCKER_HOST`` points there.

Images are built here, never pulled: ``import`` of a root filesystem holding a static
busybox, whose ``httpd`` is the stand-in engine (``/health``, ``/v1/models``). One image
per runtime per session, removed at the end. A test that leaves a container of its
state dir behind fails (``leftovers``).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from missing import skip
from procs import free_ports, wait_for

from controller.backends.local.container import PullJob
from controller.host.containers import STATE_LABEL

if TYPE_CHECKING:
    from conftest import Reconcile

PODMAN_CONF = '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n'
DOCKERD_START = 60.0  # seconds for a fresh dockerd to answer (it starts its containerd)
CLI_TIMEOUT = 120.0
# The stand-in engine: busybox's httpd on the leased port, saying who it is first. sh is
# the container's PID 1, so it traps TERM itself (PID 1 has no default action for it).
STANDIN = [
    "/bin/busybox",
    "sh",
    "-c",
    'trap "exit 0" TERM; echo "engine $RECONCILE_NAME on port $PORT"; '
    "/bin/busybox httpd -f -p {host}:{port} -h /www & wait",
]


@dataclass
class Engine:
    """One container runtime as the tests drive it: its CLI, environment and image."""

    name: str
    env: dict[str, str]
    image: str = ""
    images: list[str] = field(default_factory=list)

    def cli(self, *args: str, check: bool = True, input: bytes | None = None) -> str:
        done = subprocess.run(
            [self.name, *args],
            capture_output=True,
            input=input,
            timeout=CLI_TIMEOUT,
            env={**os.environ, **self.env},
        )
        if check:
            assert done.returncode == 0, f"{self.name} {' '.join(args)}: {done.stderr.decode()}"
        return done.stdout.decode()

    def ours(self, state: Path) -> list[str]:
        """Every container (any state) labelled with this state dir."""
        label = f"label={STATE_LABEL}={state.resolve()}"
        out = self.cli("ps", "-a", "-q", "--no-trunc", "--filter", label)
        return out.split()

    def inspect(self, cid: str) -> dict[str, Any]:
        data: list[dict[str, Any]] = json.loads(self.cli("container", "inspect", cid))
        return data[0]

    def build(self, tag: str, *, extra: bytes = b"", env: str = "") -> str:
        """``import`` the stand-in's root filesystem as ``tag``; removed at session end.
        ``extra``: a file /extra, so the image is another one (its own id and digest);
        ``env``: ``KEY=VALUE``, an ENV of the image's (as a Dockerfile's)."""
        change = ("--change", f"ENV {env}") if env else ()
        self.cli("import", *change, "-", tag, input=_rootfs(extra))
        self.images.append(tag)
        return tag


# The stand-in that answers a POST too (busybox httpd only serves files): ``nc -ll`` runs
# this script per connection; it reads the request (its body too: closing on unread bytes
# resets the connection) and answers /health, /v1/models and a chat completion.
ANSWER = b"""#!/bin/busybox sh
CR=$(printf '\\r')
read -r method path rest
len=0
while IFS= read -r line; do
  line=${line%"$CR"}
  [ -z "$line" ] && break
  case "$line" in [Cc]ontent-[Ll]ength:*) len=${line#*:}; len=${len# } ;; esac
done
[ "$len" -gt 0 ] && /bin/busybox head -c "$len" >/dev/null
case "$path" in
  /health) body='ok' ;;
  /v1/models) body='{"object":"list","data":[]}' ;;
  /v1/chat/completions) body='{"id":"standin","object":"chat.completion","choices":[{"index":0,\
"message":{"role":"assistant","content":"hello from a container"},"finish_reason":"stop"}]}' ;;
  *) printf 'HTTP/1.0 404 Not Found\\r\\nContent-Length: 0\\r\\n\\r\\n'; exit 0 ;;
esac
head='HTTP/1.0 200 OK\\r\\nContent-Type: application/json\\r\\n'
printf "$head"'Content-Length: %s\\r\\n\\r\\n%s' "${#body}" "$body"
"""
ANSWERING = [
    "/bin/busybox",
    "sh",
    "-c",
    'trap "exit 0" TERM; echo "engine $RECONCILE_NAME on port $PORT"; '
    "/bin/busybox nc -ll -p {port} -e /answer & wait",
]


def _rootfs(extra: bytes = b"") -> bytes:
    """A tar of /bin/busybox (static), /www (what httpd serves) and /answer (ANSWERING)."""
    busybox = shutil.which("busybox")
    if busybox is None:
        skip("a static busybox", "apt-get install busybox-static")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(busybox, arcname="bin/busybox")
        files = {"www/health": b"ok\n", "www/v1/models": b'{"object":"list","data":[]}\n'}
        if extra:
            files["extra"] = extra
        files["answer"] = ANSWER
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            info.mode = 0o755 if name == "answer" else 0o644
            tar.addfile(info, io.BytesIO(body))
    return buf.getvalue()


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    if shutil.which("podman") is None or shutil.which("runc") is None:
        skip("podman and runc", "apt-get install podman runc")
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text(PODMAN_CONF)
    engine = Engine("podman", {"CONTAINERS_CONF": str(conf)})
    yield from _with_image(engine)


@pytest.fixture(scope="session")
def docker() -> Iterator[Engine]:
    if shutil.which("docker") is None or shutil.which("dockerd") is None:
        skip("docker and dockerd", "apt-get install docker.io")
    probe = subprocess.run(["docker", "info"], capture_output=True, timeout=CLI_TIMEOUT)
    if probe.returncode == 0:  # a daemon answers (a CI runner's): use it
        yield from _with_image(Engine("docker", {}))
        return
    # A short path: the daemon's sockets live under it (a unix socket path is <108 bytes).
    root = Path(tempfile.mkdtemp(prefix="rdk", dir="/tmp"))
    daemon = _start_dockerd(root)
    try:
        engine = Engine("docker", {"DOCKER_HOST": f"unix://{root}/docker.sock"})
        yield from _with_image(engine)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(timeout=10)
        _unmount_under(root)  # dockerd leaves its exec root's netns bind-mounted
        shutil.rmtree(root)


def _unmount_under(root: Path) -> None:
    """Unmount every mount below ``root``, deepest first."""
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for point in sorted((m for m in mounts if m.startswith(f"{root}/")), reverse=True):
        subprocess.run(["umount", point], capture_output=True, check=False, timeout=30)


def _start_dockerd(root: Path) -> subprocess.Popen[bytes]:
    argv = ["dockerd", "-H", f"unix://{root}/docker.sock", "--data-root", f"{root}/data"]
    argv += ["--exec-root", f"{root}/exec", "--pidfile", f"{root}/dockerd.pid"]
    argv += ["--bridge=none", "--iptables=false", "--ip6tables=false"]
    log = open(root / "dockerd.log", "wb")  # noqa: SIM115 (the daemon writes it)
    daemon = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    env = {**os.environ, "DOCKER_HOST": f"unix://{root}/docker.sock"}
    deadline = time.monotonic() + DOCKERD_START
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            break
        done = subprocess.run(["docker", "version"], capture_output=True, env=env, timeout=30)
        if done.returncode == 0:
            return daemon
        time.sleep(0.2)  # polling a daemon that is starting: no event to wait on
    daemon.kill()
    daemon.wait(timeout=10)
    said = (root / "dockerd.log").read_text(errors="replace")[-2000:]
    pytest.fail(f"dockerd did not start:\n{said}")


def _with_image(engine: Engine) -> Iterator[Engine]:
    engine.image = engine.build(f"localhost/reconcile-test/engine:{uuid.uuid4().hex[:10]}")
    try:
        yield engine
    finally:
        for image in engine.images:
            engine.cli("rmi", "-f", image, check=False)


@pytest.fixture(params=["podman", "docker"])
def engine(request: pytest.FixtureRequest) -> Engine:
    """Each test once per runtime."""
    chosen: Engine = request.getfixturevalue(request.param)
    return chosen


@pytest.fixture
def rc(reconcile: Reconcile, engine: Engine) -> Iterator[Reconcile]:
    """The real CLI with the runtime's environment; no container may outlive the test."""
    reconcile.env.update(engine.env)
    yield reconcile
    # No `--rm`: a container stays until a pass removes it, so none may be left now.
    left = engine.ours(reconcile.state)
    if left:
        for cid in left:
            engine.cli("rm", "-f", cid, check=False)
        pytest.fail(f"{engine.name} containers of {reconcile.state} were left: {left}")


def write(rc: Reconcile, engine: Engine, name: str, **spec: Any) -> Path:
    """A Deployment of the stand-in engine in ``engine``'s image and runtime."""
    container = {"image": engine.image, "runtime": engine.name, **spec.pop("container", {})}
    spec.setdefault("command", STANDIN)
    return rc.write(name, container=container, **spec)


# -- a registry on loopback (docker-registry), for pulls ---------------------------------

REGISTRY_CONF = """\
version: 0.1
log: {{level: warn}}
storage:
  filesystem: {{rootdirectory: {root}}}
http: {{addr: "127.0.0.1:{port}"}}
"""


@dataclass
class Registry:
    address: str  # 127.0.0.1:<port>
    digest: str  # the pushed image's manifest digest
    registries_conf: Path  # podman: these loopback registries speak plain HTTP

    @property
    def tagged(self) -> str:
        return f"{self.address}/reconcile-test/engine:1"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, podman: Engine) -> Iterator[Registry]:
    if shutil.which("docker-registry") is None:
        skip("docker-registry", "apt-get install docker-registry")
    root = tmp_path_factory.mktemp("registry")
    port = free_ports(2)
    (root / "config.yml").write_text(REGISTRY_CONF.format(root=root / "data", port=port))
    server = subprocess.Popen(
        ["docker-registry", "serve", str(root / "config.yml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: _answers(port), timeout=30, what="the registry")
        conf = root / "registries.conf"
        lines = [
            f'[[registry]]\nlocation = "127.0.0.1:{p}"\ninsecure = true\n' for p in (port, port + 1)
        ]
        conf.write_text("\n".join(lines))
        address = f"127.0.0.1:{port}"
        digest_file = root / "digest"
        target = f"{address}/reconcile-test/engine:1"
        # An image no store here holds (as a registry's would be): pushed, then removed.
        pushed = podman.build(f"localhost/reconcile-test/pushed:{port}", extra=str(port).encode())
        podman.cli("push", "--tls-verify=false", "--format", "v2s2", "--digestfile",
                   str(digest_file), pushed, target)  # fmt: skip
        podman.cli("rmi", "-f", pushed)
        yield Registry(address, digest_file.read_text().strip(), conf)
    finally:
        server.terminate()
        server.wait(timeout=10)


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def after_pulls(rc: Reconcile) -> None:
    """Wait until no image pull of the state dir runs. A test that loops passes until a
    pull's outcome calls it between them: a pass while the pull runs moves nothing, and
    each runs the runtime (~0.5 s of CPU)."""
    wait_for(
        lambda: not any(job.running() for job in PullJob.found(rc.state)),
        timeout=90,
        what="the image pulls' end",
    )


def forget_pulled(engine: Engine, registry: Registry) -> None:
    """Remove every image of the registry this runtime holds, by reference and by id."""
    refs = [registry.tagged, f"{registry.address}/reconcile-test/engine@{registry.digest}"]
    out = _images(engine)
    ids = [line.split()[1] for line in out.splitlines() if line.startswith(registry.address)]
    for ref in [*refs, *ids]:
        engine.cli("rmi", "-f", ref, check=False)
    for ref in refs:
        assert engine.cli("image", "inspect", ref, check=False) == "" or not _held(engine, ref)


def _images(engine: Engine) -> str:
    """``images --digests``: podman 4.3 fails a listing while another worker removes an
    image sharing its layers (CI: a teardown's listing, exit 125), with "image not known"
    or, for an image whose parent is going, "retrieving parent of image ...: layer not
    known" (CI, a setup's listing); asked again until it answers."""

    def listed() -> tuple[str] | None:
        args = ("images", "--digests", "--format", "{{.Repository}} {{.ID}}")
        done = subprocess.run([engine.name, *args], capture_output=True, timeout=CLI_TIMEOUT,
                              env={**os.environ, **engine.env})  # fmt: skip
        if done.returncode == 0:
            return (done.stdout.decode(),)
        said = done.stderr.decode()
        assert "image not known" in said or "layer not known" in said, said
        return None

    found: tuple[str] = wait_for(listed, timeout=60, what=f"{engine.name} images to answer")
    return found[0]


def _held(engine: Engine, ref: str) -> bool:
    done = subprocess.run([engine.name, "image", "inspect", ref], capture_output=True,
                          env={**os.environ, **engine.env}, timeout=60)  # fmt: skip
    return done.returncode == 0


# The runtime, but the first ``times`` calls of one subcommand answer as podman 4.3 does
# for what it holds while another image sharing its layers is imported or removed
# (scripts/flakes found it): "image not known", "no such container".
MISTAKEN = """#!/bin/sh
if [ "$1 $2" = "{first} {second}" ]; then
  n=$(cat "{count}" 2>/dev/null || echo 0)
  echo $((n + 1)) > "{count}"
  if [ "$n" -lt {times} ]; then
    eval "last=\\${{$#}}"
    echo "Error: $last: {said}" >&2
    exit {code}
  fi
fi
exec {runtime} "$@"
"""


def mistaken(
    engine: Engine,
    folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    call: str,
    said: str,
    *,
    times: int = 2,
    code: int = 125,
) -> Path:
    """``engine``'s CLI on PATH (its environment set) with its first ``times`` answers to
    ``call`` (``"image inspect"``) replaced by ``said`` on stderr and exit ``code``; the
    file that counts the calls. Called again with another ``folder``, it wraps the last."""
    count = folder / f"{call.replace(' ', '-')}.count"
    wrapper = folder / "bin" / engine.name
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    first, second = call.split()
    runtime = shutil.which(engine.name)
    text = MISTAKEN.format(first=first, second=second, count=count, times=times, said=said,
                           code=code, runtime=runtime)  # fmt: skip
    wrapper.write_text(text)
    wrapper.chmod(0o755)
    for key, value in engine.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    return count
