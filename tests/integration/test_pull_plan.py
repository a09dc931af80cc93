"""What ``plan`` and ``describe`` say of a pull: the bytes to download before it starts
(asked of the server: HEAD for a URL, the hub's own listing for a repo; "unknown size"
when it does not say), what is left once it runs, and describe's bytes, rate and ETA."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from modelservers import HubServer, serving
from procs import free_ports, kill_marked

from controller.pull import launch
from controller.store.models.modelcache import CacheEntry

MB = 1 << 20
DATA = os.urandom(2 * MB)
DIGEST = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def cache(reconcile: Any) -> Iterator[Path]:
    root = reconcile.state / "models"
    yield root
    left = kill_marked(str(root), marker=launch.MARKER)
    assert not left, f"pull processes left running: {left}"


def pull_change(reconcile: Any) -> dict[str, Any]:
    doc = reconcile("plan", "-o", "json", check=2).json()
    (change,) = [c for c in doc["changes"] if c["action"] == "pull"]
    assert isinstance(change, dict)
    return change


def test_plan_shows_the_bytes_a_url_will_download(reconcile: Any) -> None:
    with serving({"tiny.gguf": DATA}) as server:
        reconcile.write("web", source={"url": server.url("tiny.gguf"), "sha256": DIGEST})
        text = reconcile("plan", check=2).out
        change = pull_change(reconcile)
        assert server.requests == 0  # a HEAD only: plan downloads nothing
    assert "(2.1 MB to download)" in text
    assert change["download"] == {"bytes": len(DATA)}


def test_plan_says_unknown_size_when_the_server_does_not_answer(reconcile: Any) -> None:
    nobody = f"http://127.0.0.1:{free_ports()}/tiny.gguf"  # nothing listens there
    reconcile.write("web", source={"url": nobody, "sha256": DIGEST})
    assert "(unknown size)" in reconcile("plan", check=2).out
    assert pull_change(reconcile)["download"] == {"bytes": None}


def test_plan_asks_with_the_urls_credentials_and_never_shows_them(reconcile: Any) -> None:
    """``https://user:password@host/file`` is Basic auth, as for curl and wget: plan's HEAD
    sends it (urllib alone read ``user:password@host`` as the host). A trial's URL with
    no port made plan a traceback (``nonnumeric port: 'password@host'``) printing it."""
    with serving({"tiny.gguf": DATA}, auth="puller:hunter2 x") as server:
        url = server.url("tiny.gguf").replace("://", "://puller:hunter2%20x@")
        reconcile.write("web", source={"url": url, "sha256": DIGEST})
        done = reconcile("plan", check=2)
    assert "(2.1 MB to download)" in done.out, done.out
    portless = "http://puller:hunter2@127.0.0.1/tiny.gguf"  # port 80: nothing answers
    reconcile.write("web", source={"url": portless, "sha256": DIGEST})
    again = reconcile("plan", check=2)
    assert "(unknown size)" in again.out
    for said in (done.out, done.err, again.out, again.err):
        assert "hunter2" not in said and "Traceback" not in said, said


def test_plan_asks_the_hub_for_the_chosen_files_sizes(reconcile: Any, tmp_path: Path) -> None:
    files = {"model-q4_k_m.gguf": os.urandom(MB), "model-f16.gguf": os.urandom(3 * MB)}
    with HubServer("acme/tiny", files) as hub:
        reconcile.env |= {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf")}
        source = {"huggingFace": {"repo": "acme/tiny", "files": ["*q4_k_m.gguf"]}}
        reconcile.write("web", source=source)
        change = pull_change(reconcile)
        assert hub.downloads == []
    assert change["download"] == {"bytes": MB}
    assert "(1.0 MB to download)" in change["reason"]


def test_a_running_pull_shows_what_is_left_and_describe_its_progress(
    reconcile: Any, cache: Path
) -> None:
    with serving({"tiny.gguf": DATA}, hold=MB) as server:
        reconcile.write("web", source={"url": server.url("tiny.gguf"), "sha256": DIGEST})
        reconcile.once()
        entry = CacheEntry.of(cache, f"sha256-{DIGEST}")
        reconcile.wait_for(lambda: (p := entry.progress()) and p.bytes_done >= MB, what="1 MB")
        change = pull_change(reconcile)
        described = reconcile("describe", "web", check=0).out
        server.release()
        reconcile.wait_for(lambda: entry.model_path(), what="the pull")
    assert change["download"] == {"bytes": MB}
    assert "1.0 MB of 2.1 MB left to download" in change["reason"]
    (line,) = [ln for ln in described.splitlines() if ln.startswith("Pull:")]
    assert "1.0 MB of 2.1 MB (50%)" in line and "started" in line and "pid" in line
    reconcile.converge()
    assert "Pull:" not in reconcile("describe", "web", check=0).out  # Ready: no pull to show
    reconcile.down()
