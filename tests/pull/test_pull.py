"""The pull machinery against real local servers: Range resume, sha256, the hub client,
the entry lock, and a pull process killed with SIGKILL mid-way."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import signal
import threading
from collections import namedtuple
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from disks import tmpfs
from modelservers import HostileServer, HubServer, serving
from procs import alive, cmdline, kill_marked, wait_for, wait_gone

from controller.core.manifest.sources import Source
from controller.host.procscan import EnvironScan
from controller.pull import launch, worker
from controller.pull.host import HostPuller
from controller.pull.job import JOB_ENV, Job
from controller.store.config import stateid
from controller.store.instances.events import Journal
from controller.store.models import modelcache
from controller.store.models.modelcache import CacheEntry

MB = 1 << 20
DATA = os.urandom(3 * MB + 12345)
DIGEST = hashlib.sha256(DATA).hexdigest()


def url_job(tmp_path: Path, url: str, digest: str = DIGEST, **extra: object) -> Job:
    source = Source.model_validate({"url": url, "sha256": digest})
    return Job(
        source=source,
        cache=tmp_path / "models",
        state_dir=tmp_path,
        deployments=("web",),
        **extra,  # type: ignore[arg-type]
    )


def entry_of(job: Job) -> CacheEntry:
    return CacheEntry.of(job.cache, job.source.key)


def test_a_url_is_pulled_checked_and_named_by_its_file(tmp_path: Path) -> None:
    with serving({"tiny.gguf": DATA}) as server:
        job = url_job(tmp_path, server.url("tiny.gguf"))
        assert worker.run(job) == 0
    entry = entry_of(job)
    assert entry.model_path() == entry.folder / "tiny.gguf"
    assert (entry.folder / "tiny.gguf").read_bytes() == DATA
    assert not list(entry.folder.glob("*.partial"))
    progress = entry.progress()
    assert progress is not None and progress.bytes_done == progress.bytes_total == len(DATA)
    done = [e for e in Journal(tmp_path).read("web") if e.get("outcome") == "done"]
    assert done and done[-1]["sha256"] == DIGEST


def test_a_wrong_sha256_leaves_nothing_to_use(tmp_path: Path) -> None:
    with serving({"tiny.gguf": DATA}) as server:
        job = url_job(tmp_path, server.url("tiny.gguf"), digest="0" * 64)
        assert worker.run(job) == 1
    entry = entry_of(job)
    assert entry.model_path() is None
    assert not list(entry.folder.glob("tiny.gguf*"))  # neither the file nor the partial
    result = entry.result()
    assert result is not None and result["kind"] == "checksum"
    assert DIGEST in result["message"] and "0" * 64 in result["message"]
    view = modelcache.look(entry, running=False)
    assert view.failure is not None and view.failure.attempts == 1
    # the bytes were dropped: the retry starts from nothing, and says so (no "resuming")
    assert view.progress is not None and view.progress.bytes_done == 0, view.progress


def test_a_cut_connection_resumes_with_a_range_request(tmp_path: Path) -> None:
    with serving({"tiny.gguf": DATA}, cut_after=MB) as server:
        job = url_job(tmp_path, server.url("tiny.gguf"))
        assert worker.run(job) == 1  # the cut: an error that keeps the partial file
        entry = entry_of(job)
        assert (entry.folder / "tiny.gguf.partial").stat().st_size >= MB
        result = entry.result()  # said before any retry ran: it will resume, not "resumed"
        assert result is not None and "the next try resumes from" in result["message"]
        assert not result["message"].endswith("resumed"), result["message"]
        assert worker.run(job) == 0
        assert server.ranges and server.ranges[-1].startswith("bytes=")
        resent = server.sent - len(DATA)
    assert resent <= MB  # only what the cut lost (nothing, here) is sent again
    assert entry.model_path() is not None


def test_a_resumed_pull_counts_only_its_new_bytes_in_its_rate(tmp_path: Path) -> None:
    """A trial's resume from 8.3 MB at 2 MB/s showed ``395.6 MB/s ETA 0s``: the partial's
    bytes counted as read in the first instants. Held before its first new byte, the
    resumed pull shows the partial's bytes done and no rate at all."""
    with serving({"tiny.gguf": DATA}, hold=0) as server:
        job = url_job(tmp_path, server.url("tiny.gguf"))
        entry = entry_of(job)
        entry.folder.mkdir(parents=True, exist_ok=True)
        (entry.folder / "tiny.gguf.partial").write_bytes(DATA[: 2 * MB])
        runner = threading.Thread(target=worker.run, args=(job,))
        runner.start()
        try:
            shown = wait_for(
                lambda: (p := entry.progress()) is not None and p.bytes_done == 2 * MB and p,
                timeout=60,
                what="the resumed pull's first figure",
            )
            assert shown.bytes_total == len(DATA) and shown.rate == 0.0, shown
        finally:
            server.release()
            runner.join()
        assert server.ranges == [f"bytes={2 * MB}-"]
    assert entry.model_path() is not None


def test_missing_file_says_what_to_check(tmp_path: Path) -> None:
    with serving({}) as server:
        job = url_job(tmp_path, server.url("gone.gguf"))
        assert worker.run(job) == 1
    result = entry_of(job).result()
    assert result is not None and "HTTP 404" in result["message"]
    assert "check source.url" in result["message"]


def test_a_url_with_user_and_password_is_pulled_with_basic_auth(tmp_path: Path) -> None:
    """As curl (the exported initContainer) and wget do; urllib alone took
    ``user:password@127.0.0.1`` for the host ("Name or service not known")."""
    with serving({"tiny.gguf": DATA}, auth="puller:pass word") as server:
        url = server.url("tiny.gguf").replace("://", "://puller:pass%20word@")
        job = url_job(tmp_path, url)
        assert worker.run(job) == 0, entry_of(job).result()
    assert (entry_of(job).folder / "tiny.gguf").read_bytes() == DATA


def test_a_urls_credentials_are_not_sent_on_to_a_redirects_host(tmp_path: Path) -> None:
    """A mirror that redirects to a CDN (a pre-signed URL) must not be handed the
    password: the header is the first host's alone, as curl's --location does."""
    with serving({"tiny.gguf": DATA}) as cdn:

        class Redirect(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(302)
                self.send_header("Location", cdn.url("tiny.gguf"))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        with _handled_by(Redirect) as port:
            job = url_job(tmp_path, f"http://puller:hunter2@127.0.0.1:{port}/tiny.gguf")
            assert worker.run(job) == 0, entry_of(job).result()
        assert cdn.authorizations == [None]


def test_a_urls_credentials_follow_a_redirect_to_the_same_host(tmp_path: Path) -> None:
    """A trial: a mirror whose ``/latest.gguf`` points at its own file answered 401 past
    the redirect, the header dropped; curl and requests send it on to the same host."""
    asked: list[tuple[str, str | None]] = []
    basic = "Basic " + base64.b64encode(b"puller:hunter2").decode()

    class Mirror(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append((self.path, self.headers.get("Authorization")))
            if self.headers.get("Authorization") != basic:
                self.send_response(401)
                self.send_header("Content-Length", "0")
            elif self.path == "/latest.gguf":
                self.send_response(302)
                self.send_header("Location", "/tiny.gguf")
                self.send_header("Content-Length", "0")
            else:
                self.send_response(200)
                self.send_header("Content-Length", str(len(DATA)))
            self.end_headers()
            if self.path == "/tiny.gguf" and self.headers.get("Authorization") == basic:
                self.wfile.write(DATA)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    with _handled_by(Mirror) as port:
        job = url_job(tmp_path, f"http://puller:hunter2@127.0.0.1:{port}/latest.gguf")
        assert worker.run(job) == 0, entry_of(job).result()
    assert asked == [("/latest.gguf", basic), ("/tiny.gguf", basic)]
    assert (entry_of(job).folder / "latest.gguf").read_bytes() == DATA


@contextlib.contextmanager
def _handled_by(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """A server of ``handler`` on a free port of 127.0.0.1, its port; shut at the end."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_wrong_password_is_a_401_saying_where_credentials_go(tmp_path: Path) -> None:
    with serving({"tiny.gguf": DATA}, auth="puller:right") as server:
        job = url_job(tmp_path, server.url("tiny.gguf").replace("://", "://puller:wrong@"))
        assert worker.run(job) == 1
    result = entry_of(job).result()
    assert result is not None and "HTTP 401" in result["message"]
    assert "as user:password@ before its host" in result["message"]
    assert "wrong" not in result["message"]


def test_a_stall_is_an_error_naming_the_wait(tmp_path: Path) -> None:
    with serving({"tiny.gguf": DATA}, hold=MB) as server:
        job = url_job(tmp_path, server.url("tiny.gguf"), stall_seconds=0.5)
        assert worker.run(job) == 1
    result = entry_of(job).result()
    assert result is not None and result["kind"] == "stall"
    assert "no byte from" in result["message"] and "0.5s" in result["message"]


def test_too_little_disk_names_the_path_and_both_sizes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A full disk is not something a test box can be made into: the free figure is faked.
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr("shutil.disk_usage", lambda _: usage(10 * MB, 10 * MB - 1000, 1000))
    with serving({"tiny.gguf": DATA}) as server:
        job = url_job(tmp_path, server.url("tiny.gguf"))
        assert worker.run(job) == 1
    result = entry_of(job).result()
    assert result is not None and result["kind"] == "disk"
    assert str(entry_of(job).folder) in result["message"]
    assert "3.2 MB still to download, 1.0 kB free" in result["message"]


def test_a_second_pull_of_one_file_waits_and_downloads_nothing(tmp_path: Path) -> None:
    with serving({"tiny.gguf": DATA}, hold=MB) as server:
        job = url_job(tmp_path, server.url("tiny.gguf"))
        first = threading.Thread(target=worker.run, args=(job,))
        first.start()
        wait_for(lambda: server.sent >= MB, what="the first pull under way")
        second = threading.Thread(target=worker.run, args=(job,))
        second.start()  # blocks on the entry's lock
        server.release()
        first.join()
        second.join()
        assert server.requests == 1
    assert entry_of(job).model_path() is not None


@pytest.fixture
def pulls(tmp_path: Path) -> Iterator[Path]:
    """The cache root; any pull process left at the end is killed (and fails the test)."""
    root = tmp_path / "models"
    yield root
    left = kill_marked(str(root), marker=launch.MARKER)
    assert not left, f"pull processes left running: {left}"


def test_kill_9_mid_way_then_a_new_pull_resumes(tmp_path: Path, pulls: Path) -> None:
    with serving({"tiny.gguf": DATA}, hold=MB) as server:
        job = url_job(tmp_path, server.url("tiny.gguf"))
        pid = launch.spawn(job)
        entry = entry_of(job)
        assert wait_for(lambda: launch.running(pulls).get(entry.key) == pid, what="marker")
        wait_for(lambda: server.sent >= MB, what="a first MB sent")
        wait_for(lambda: (p := entry.progress()) and p.bytes_total == len(DATA), what="progress")
        assert modelcache.look(entry, running=False).running  # its lock says so, too
        partial = entry.folder / "tiny.gguf.partial"  # bytes on disk: what a resume asks past
        wait_for(lambda: partial.exists() and partial.stat().st_size > 0, what="a partial file")
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid)
        # The kernel drops the lock once the last of its threads (the meter's) has gone,
        # a moment after the main one shows as a zombie.
        wait_for(lambda: not modelcache.look(entry, running=False).running, what="the lock")
        server.release()
        again = launch.spawn(job)
        wait_for(lambda: entry.model_path() is not None, what="the resumed pull")
        wait_for(lambda: not alive(again), what="the pull process to exit")
        assert server.ranges, "the second pull did not resume with Range"
    assert (entry.folder / "tiny.gguf").read_bytes() == DATA


def test_a_puller_kept_between_passes_finds_a_pull_started_after_its_first_look(
    tmp_path: Path, pulls: Path
) -> None:
    """A daemon's puller keeps its /proc scan from pass to pass (a process read without
    the marker is not read again): a pull spawned after a first look is still found."""
    puller = HostPuller(pulls, tmp_path, 60.0)
    assert not launch.running(pulls, puller.scan)  # every process here read once, unmarked
    assert puller.observe() == {}
    with serving({"tiny.gguf": DATA}, hold=MB) as server:
        job = url_job(tmp_path, server.url("tiny.gguf"))
        pid = launch.spawn(job)
        entry = entry_of(job)

        def found() -> int | None:
            return launch.running(pulls, puller.scan).get(entry.key)

        assert wait_for(lambda: found() == pid, what="the pull by its marker")
        assert puller.observe()[entry.key].running
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid)
        server.release()
        assert found() is None


class _Counted(EnvironScan):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __call__(self, needle: bytes) -> Iterator[tuple[int, bytes]]:
        self.calls += 1
        return super().__call__(needle)


def test_a_cache_nothing_was_pulled_into_is_looked_at_without_a_process_scan(
    tmp_path: Path, pulls: Path
) -> None:
    """Every pass scanned /proc for pull processes (every process's environment read,
    ~4 ms of a `--once` on a busy box), on nodes that never pulled a model too. A pull
    makes its cache entry before it starts: with none, none runs, and nothing is read."""
    scan = _Counted()
    puller = HostPuller(pulls, tmp_path, 60.0, scan)
    assert puller.observe() == {} and scan.calls == 0
    with serving({"tiny.gguf": DATA}, hold=MB) as server:
        job = url_job(tmp_path, server.url("tiny.gguf"))
        pid = launch.spawn(job)
        try:
            key = entry_of(job).key
            assert wait_for(lambda: puller.observe()[key].running, what="the pull seen")
            assert scan.calls >= 1  # an entry: its pull looked for
        finally:
            os.kill(pid, signal.SIGKILL)
            wait_gone(pid)
            server.release()


def test_a_pull_just_spawned_is_running_to_the_next_look_so_no_second_one_starts(
    tmp_path: Path, pulls: Path
) -> None:
    """Popen returns once the exec has begun; the kernel gives the program its environment
    (the marker) a moment later, so a /proc read at once finds none about half the time: a
    daemon pass's next round saw no pull and started a second one of the same file (two
    `pull started` events for one edit of a Ready engine's source). The process that
    spawned it knows it runs."""
    puller = HostPuller(pulls, tmp_path, 60.0)
    cpus = os.sched_getaffinity(0)
    # On one CPU the child finishes its exec only once this process yields it the CPU.
    os.sched_setaffinity(0, {min(cpus)})
    try:
        with serving({"tiny.gguf": DATA}, hold=MB) as server:
            job = url_job(tmp_path, server.url("tiny.gguf"))
            for attempt in range(50):
                pid = launch.spawn(job)
                try:
                    view = puller.observe()[job.source.key]
                    assert view.running, f"attempt {attempt}: pid {pid} not seen running"
                finally:
                    os.kill(pid, signal.SIGKILL)
                    wait_gone(pid)
            server.release()
    finally:
        os.sched_setaffinity(0, cpus)


class _BeforeItsExec(EnvironScan):
    """/proc as a read finds it in the moment after Popen returns: no environment yet."""

    def __call__(self, needle: bytes) -> Iterator[tuple[int, bytes]]:
        return iter(())


def test_a_pull_this_process_spawned_runs_though_its_environment_reads_empty(
    tmp_path: Path,
) -> None:
    """The window above, held open: the spawning process counts its own pull running."""
    with serving({"tiny.gguf": DATA}, hold=MB) as server:
        job = url_job(tmp_path, server.url("tiny.gguf"))
        pid = launch.spawn(job)
        try:
            found = launch.running(job.cache, _BeforeItsExec())
            assert list(found.values()) == [pid], found
        finally:
            os.kill(pid, signal.SIGKILL)
            wait_gone(pid)
        server.release()
    assert launch.running(job.cache, _BeforeItsExec()) == {}  # ended: not counted


def test_the_hub_client_pulls_a_glob_through_hf_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {"model-q4_k_m.gguf": os.urandom(MB), "model-f16.gguf": b"x" * 10, "README.md": b"#"}
    with HubServer("acme/tiny", files) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        source = Source.model_validate(
            {"huggingFace": {"repo": "acme/tiny", "files": ["*q4_k_m.gguf"]}}
        )
        job = Job(source=source, cache=tmp_path / "models", state_dir=tmp_path, deployments=())
        assert worker.run(job) == 0
        assert hub.downloads == ["model-q4_k_m.gguf"]
    path = entry_of(job).model_path()
    assert path is not None and path.name == "model-q4_k_m.gguf"
    assert path.read_bytes() == files["model-q4_k_m.gguf"]


def test_a_hub_file_longer_than_listed_is_cut_off_and_its_partial_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pulls: Path
) -> None:
    files = {"model-q4_k_m.gguf": os.urandom(MB)}  # listed at 1 MiB, streamed for ever
    with HubServer("acme/tiny", files, endless=True) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        source = Source.model_validate({"huggingFace": {"repo": "acme/tiny"}})
        job = Job(source=source, cache=pulls, state_dir=tmp_path, deployments=())
        pid = launch.spawn(job)
        # without the guard it streams until the client's stall limit, which never comes
        wait_for(lambda: not alive(pid), what="the pull process to stop", timeout=120)
        assert hub.streamed > MB  # it did send more than it listed
    result = entry_of(job).result()
    assert result is not None and result["status"] == "failed", result
    assert result["message"].startswith("acme/tiny@main: the server sent more than"), result
    assert "the size the hub listed" in result["message"]
    left = entry_of(job).folder / "files"
    assert not list(left.rglob("*.incomplete")), "the partial was kept"


def test_a_missing_hub_repo_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with HubServer("acme/tiny", {}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        source = Source.model_validate({"huggingFace": {"repo": "acme/other"}})
        job = Job(source=source, cache=tmp_path / "models", state_dir=tmp_path, deployments=())
        assert worker.run(job) == 1
    result = entry_of(job).result()
    assert result is not None and "acme/other@main was not found" in result["message"]
    assert "set HF_TOKEN" in result["message"]
    assert "check source.huggingFace.repo" in result["message"]


def test_a_gated_hub_repo_says_to_set_hf_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {"model-q4_k_m.gguf": os.urandom(MB // 4)}
    with HubServer("acme/gated", files, gated=True) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        source = Source.model_validate({"huggingFace": {"repo": "acme/gated"}})
        job = Job(source=source, cache=tmp_path / "models", state_dir=tmp_path, deployments=())
        assert worker.run(job) == 1
        result = entry_of(job).result()
        assert result is not None and result["kind"] == "http"
        assert "acme/gated@main is gated" in result["message"]
        assert "set HF_TOKEN" in result["message"]
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")  # the next move the message names
        assert worker.run(job) == 0
        assert hub.downloads == ["model-q4_k_m.gguf"]


def test_several_hub_files_make_model_the_snapshot_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {"config.json": b"{}", "model.safetensors": os.urandom(MB // 2), "README.md": b"#"}
    with HubServer("acme/st", files) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        globs = ["*.json", "*.safetensors"]
        source = Source.model_validate({"huggingFace": {"repo": "acme/st", "files": globs}})
        job = Job(source=source, cache=tmp_path / "models", state_dir=tmp_path, deployments=())
        assert worker.run(job) == 0
        assert sorted(hub.downloads) == ["config.json", "model.safetensors"]
    path = entry_of(job).model_path()
    assert path == entry_of(job).folder / "files"  # {model}: the folder, as vLLM takes it
    assert (path / "model.safetensors").read_bytes() == files["model.safetensors"]
    assert not (path / "README.md").exists()


def test_a_stream_of_unannounced_size_stops_at_the_most_a_pull_may_take(
    tmp_path: Path,
) -> None:
    with HostileServer("endless") as server:
        url = server.url()
        job = url_job(tmp_path, url, max_bytes=2 * MB)
        assert worker.run(job) == 1
    result = entry_of(job).result()
    assert result is not None and result["kind"] == "http"
    assert url in result["message"] and "RECONCILE_PULL_MAX_BYTES" in result["message"]
    assert "more than 2.1 MB" in result["message"]
    assert not list(entry_of(job).folder.glob("*.partial"))  # dropped, not kept to resume


@pytest.mark.parametrize("reserve", [8 * MB, 0], ids=["stops-at-the-reserve", "enospc"])
def test_a_stream_that_fills_the_disk_drops_its_partial_and_says_where(
    tmp_path: Path, reserve: int
) -> None:
    with tmpfs(tmp_path / "small", "20m") as small, HostileServer("endless") as server:
        url = server.url()
        job = url_job(small, url, reserve_bytes=reserve)
        assert worker.run(job) == 1
        result = entry_of(job).result()
        assert result is not None and result["kind"] == "disk", result
        partial = entry_of(job).folder / "tiny.gguf.partial"
        assert not partial.exists()
        free = shutil.disk_usage(small).free
        assert free > 15 * MB  # what the download took is given back
    message = result["message"]
    assert url in message and str(partial) in message and "filled up after" in message
    assert "MB free" in message or "kB free" in message or "B free" in message
    assert "RECONCILE_DISK_RESERVE" in message


def test_a_trickle_under_the_minimum_rate_is_a_stall(tmp_path: Path) -> None:
    data = b"x" * 200  # 20 bytes/s: each read beats the socket's timeout, the pull never ends
    with HostileServer("trickle", data, every=0.05) as server:
        url = server.url()
        job = url_job(tmp_path, url, hashlib.sha256(data).hexdigest(), stall_seconds=0.5)
        assert worker.run(job) == 1
    result = entry_of(job).result()
    assert result is not None and result["kind"] == "stall", result
    assert url in result["message"] and "under 1000 bytes/s" in result["message"]


def test_a_redirect_to_another_scheme_is_refused(tmp_path: Path) -> None:
    with HostileServer("ftp") as server:
        url = server.url()
        job = url_job(tmp_path, url)
        assert worker.run(job) == 1
    result = entry_of(job).result()
    assert result is not None and result["kind"] == "http"
    assert f"{url}: the server redirects to ftp://127.0.0.1:1/tiny.gguf" in result["message"]
    assert "follows http and https only" in result["message"]


def test_a_range_answer_from_another_byte_is_dropped_not_appended(tmp_path: Path) -> None:
    with HostileServer("bad-range", DATA) as server:
        job = url_job(tmp_path, server.url())
        entry = entry_of(job)
        entry.ensure()
        partial = entry.folder / "tiny.gguf.partial"
        partial.write_bytes(DATA[:MB])  # a pull cut after its first MB
        assert worker.run(job) == 1
        result = entry.result()
        assert result is not None and result["kind"] == "http", result
        assert (
            f"asked for the bytes from {MB}, the server sent bytes from {MB // 2}"
            in (result["message"])
        )
        assert not partial.exists()
        progress = modelcache.look(entry, running=False).progress
        assert progress is not None and progress.bytes_done == 0, progress  # not "resuming"
        assert worker.run(job) == 0  # from zero: a whole answer
    assert (entry.folder / "tiny.gguf").read_bytes() == DATA


def test_a_range_answer_from_byte_zero_is_the_whole_file(tmp_path: Path) -> None:
    with HostileServer("range-from-zero", DATA) as server:
        job = url_job(tmp_path, server.url())
        entry = entry_of(job)
        entry.ensure()
        (entry.folder / "tiny.gguf.partial").write_bytes(DATA[:MB])
        assert worker.run(job) == 0
    assert (entry.folder / "tiny.gguf").read_bytes() == DATA


@pytest.mark.parametrize(
    ("mode", "extra"),
    [
        ("missing", {}),
        ("ftp", {}),
        ("endless", {"max_bytes": MB}),
        ("trickle", {"stall_seconds": 0.5}),
        ("bad-range", {}),
        ("whole", {"reserve_bytes": 1 << 60}),  # no room: refused before the body
        ("whole", {"digest": "0" * 64}),
    ],
    ids=["404", "ftp", "endless", "trickle", "bad-range", "no-room", "checksum"],
)
def test_every_pull_error_names_the_url_and_never_its_token(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], mode: str, extra: dict[str, Any]
) -> None:
    secret = "s3cret-Value"
    data = b"x" * 200 if mode == "trickle" else DATA  # a trickle of 3 MB: a day
    with HostileServer(mode, data, every=0.05) as server:
        url = f"{server.url()}?v=1&token={secret}"
        digest = extra.pop("digest", DIGEST)
        job = url_job(tmp_path, url, digest, **extra)
        if mode == "bad-range":
            entry_of(job).ensure()
            (entry_of(job).folder / "tiny.gguf.partial").write_bytes(DATA[:MB])
        assert worker.run(job) == 1
    result = entry_of(job).result()
    assert result is not None
    assert f"{server.url()}?v=1&token=<redacted>: " in result["message"], result
    journal = (tmp_path / "events" / "web.jsonl").read_text()
    shown = capfd.readouterr()
    for text in (json.dumps(result), journal, shown.out, shown.err):
        assert secret not in text


def test_a_pull_process_shows_no_token_in_its_command_line(tmp_path: Path, pulls: Path) -> None:
    secret = "s3cret-Value"
    with serving({"tiny.gguf": DATA}, hold=MB) as server:
        job = url_job(tmp_path, f"{server.url('tiny.gguf')}?token={secret}")
        pid = launch.spawn(job)
        wait_for(lambda: server.sent >= MB, what="the pull under way")  # it has its job
        assert "controller.pull" in cmdline(pid)  # what `ps` shows every local user
        assert secret not in cmdline(pid)
        server.release()
        wait_for(lambda: entry_of(job).model_path() is not None, what="the pull")
        wait_for(lambda: not alive(pid), what="the pull process to exit")


def test_a_pull_whose_state_dir_was_swapped_before_it_ran_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started by a state dir whose disk was then unmounted (the folder at its path left
    empty): its first write made its cache entry's folders in that empty folder, another
    state dir's to be (a cold start at load ~23 came after the swap). It writes nothing
    and says why, and what to do."""
    from controller.pull.__main__ import main

    monkeypatch.setenv(launch.STATE_ID, "the-state-dir-that-started-it")
    with serving({"tiny.gguf": DATA}) as server:
        monkeypatch.setenv(JOB_ENV, url_job(tmp_path, server.url("tiny.gguf")).to_json())
        assert main([]) == 1
        assert server.sent == 0
    assert list(tmp_path.iterdir()) == [], "nothing written"


def test_a_pull_whose_state_dir_is_swapped_mid_way_stops_writing_and_says_why_once(
    tmp_path: Path,
) -> None:
    """A real pull, started by a pass's state dir, is half-way when another state dir
    takes its path (the first moved away, as a disk unmounted and another mounted
    there), one with its own unfinished pull of the same file. Nothing lands in it: no
    progress, result or journal, and its partial file never takes the model's name
    unchecked (as it did: the rename is by path); the log, in the first, says why once."""
    state, moved = tmp_path / "state", tmp_path / "moved"
    state.mkdir()
    stateid.ensure(state)
    try:
        with serving({"tiny.gguf": DATA}, hold=MB) as server:
            job = replace(url_job(tmp_path, server.url("tiny.gguf")), state_dir=state)
            job = replace(job, cache=state / "models")
            pid = launch.spawn(job)
            entry = entry_of(job)
            wait_for(lambda: server.sent >= MB, timeout=60, what="a first MB sent")
            wait_for(lambda: (p := entry.progress()) and p.bytes_done > 0, timeout=60)
            state.rename(moved)
            theirs = entry.folder / "tiny.gguf.partial"  # the other state dir's own pull
            theirs.parent.mkdir(parents=True)
            theirs.write_bytes(DATA[:MB])
            new_id = stateid.ensure(state)
            server.release()
            wait_for(lambda: not alive(pid), timeout=120, what="the pull process to exit")
    finally:
        kill_marked(str(state / "models"), marker=launch.MARKER)
        kill_marked(str(moved / "models"), marker=launch.MARKER)
    assert sorted(p.name for p in state.iterdir()) == ["id", "models"], "no journal there"
    assert [p.name for p in entry.folder.iterdir()] == ["tiny.gguf.partial"], "no progress"
    assert theirs.read_bytes() == DATA[:MB] and stateid.peek(state) == new_id
    first = CacheEntry.of(moved / "models", job.source.key)
    assert first.result() is None and not (first.folder / "tiny.gguf").exists()
    assert not Journal(moved).read("web"), "no outcome journaled: the pull did not end"
    log = (first.folder / "pull.log").read_text()
    assert log.count("pull stopped:") == 1, log
    assert f"{state} is no longer the state dir that started it" in log


def test_a_hub_pull_whose_state_dir_is_swapped_mid_way_stops_and_leaves_the_new_one_alone(
    tmp_path: Path,
) -> None:
    """The hub's download runs in the library's threads, metered by a watcher: the swap
    is seen by the watcher's look, which stops the library as a full disk does. Nothing
    lands in the new state dir, its own files of that entry left as they were."""
    state, moved = tmp_path / "state", tmp_path / "moved"
    state.mkdir()
    stateid.ensure(state)
    data = os.urandom(3 * MB)
    source = Source.model_validate({"huggingFace": {"repo": "acme/tiny"}})
    job = Job(source=source, cache=state / "models", state_dir=state, deployments=("web",))
    entry = entry_of(job)
    try:
        with HubServer("acme/tiny", {"model.gguf": data}, hold=MB) as hub:
            settings = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf")}
            pid = launch.spawn(job, settings)
            wait_for(lambda: hub.sent >= MB, timeout=60, what="a first MB sent")
            state.rename(moved)
            theirs = entry.folder / "files" / "notes.txt"  # the other state dir's own
            theirs.parent.mkdir(parents=True)
            theirs.write_text("theirs")
            new_id = stateid.ensure(state)
            log = moved / "models" / entry.key / "pull.log"
            wait_for(lambda: "pull stopped:" in log.read_text(), timeout=60, what="the stop")
            hub.release()
            wait_for(lambda: not alive(pid), timeout=120, what="the pull process to exit")
    finally:
        kill_marked(str(state / "models"), marker=launch.MARKER)
        kill_marked(str(moved / "models"), marker=launch.MARKER)
    assert sorted(p.name for p in state.iterdir()) == ["id", "models"], "no journal there"
    assert [p.name for p in entry.folder.iterdir()] == ["files"], "no progress or result"
    assert [p.name for p in theirs.parent.iterdir()] == ["notes.txt"] and stateid.peek(
        state
    ) == new_id
    said = log.read_text()
    assert said.count("pull stopped:") == 1 and "Traceback" not in said, said
    first = CacheEntry.of(moved / "models", job.source.key)
    assert first.result() is None and not Journal(moved).read("web")
