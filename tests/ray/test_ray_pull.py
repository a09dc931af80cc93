"""Model pulls on Ray: the file is pulled on the node that runs the engine, into that
node's cache, by a pull actor that holds no GPU (a real local cluster, a real file
server with Range)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from modelservers import FileServer, HubServer, serving
from procs import alive, wait_for
from rayhelp import engines_gone, ours, ray

from controller.backends.ray import pullactor
from controller.core.state import backoff
from controller.store.models import modelcache

GPU = {"count": 1, "kind": "nvidia"}
ENGINE = [sys.executable, "-m", "controller.demo.engine", "--port", "{port}", "--host", "{host}"]
MODEL = [*ENGINE, "--model", "{model}"]
MiB = 1 << 20
SLACK = 64 * 1024  # what a process killed mid-write may not have written yet
Reconcile = Any  # the `reconcile` fixture of tests/conftest.py


def pull_actors() -> list[dict[str, str]]:
    return [a for a in ours() if a["namespace"].endswith("-pulls")]


@pytest.fixture
def rc(cluster: Any, reconcile: Reconcile) -> Iterator[Reconcile]:
    """The real CLI on the ray backend; at the end nothing of ours is left on the cluster."""
    r = reconcile
    r.env.update(RECONCILE_BACKEND="ray", RECONCILE_RAY_ADDRESS=cluster.address)
    r.node_entries = set()  # the node cache entries the test's engines ran from
    try:
        yield r
    finally:
        r("down", check=None)
        for folder in r.node_entries:  # the nodes' caches are outside the test's tmp
            shutil.rmtree(folder, ignore_errors=True)
        left = pull_actors()
        for a in left:  # a failed test's: ended, so the next test starts clean
            ray.kill(ray.get_actor(a["name"], namespace=a["namespace"]), no_restart=True)
        wait_for(lambda: not ours(), timeout=30, what="our actors gone")
        engines_gone()
    assert not left, f"pull actors outlived their pulls: {left}"


def pulled(rc: Reconcile, name: str, at_least: int) -> dict[str, Any]:
    """Passes until ``status`` shows the pull of ``name`` past ``at_least`` bytes."""

    def look() -> dict[str, Any] | None:
        rc.once(check=0)  # Pulling is progress: exit 0
        item = rc.status(name, cli=True)[name]
        assert item["phase"] == "Pulling", item
        pull = item.get("pull") or {}
        return item if pull.get("bytes_done", 0) >= at_least else None

    found: dict[str, Any] = wait_for(look, timeout=60, what=f"{name}'s pull past {at_least}")
    return found


def the_pull() -> tuple[Any, Any]:
    """The one pull actor and its answer."""
    (actor,) = pull_actors()
    handle = ray.get_actor(actor["name"], namespace=actor["namespace"])
    return handle, ray.get(handle.look.remote(), timeout=30)


def model_arg(rc: Reconcile, pid: int) -> Path:
    """The engine's ``{model}``; its cache entry is removed at the end of the test."""
    path = Path(rc.cmdline(pid).rpartition("--model ")[2])
    entry = next(p for p in path.parents if modelcache.KEY.match(p.name))
    rc.node_entries.add(entry)
    return path


def test_the_node_pulls_once_into_its_own_cache_holding_no_gpu(rc: Reconcile) -> None:
    data = os.urandom(4 * MiB)
    digest = hashlib.sha256(data).hexdigest()
    with serving({"tiny.gguf": data}, hold=MiB) as server:
        source = {"url": server.url("tiny.gguf"), "sha256": digest}
        rc.write("g", command=MODEL, devices=GPU, source=source)  # one GPU
        rc.write("r", command=MODEL, replicas=2, source=source)  # no GPU: two replicas
        item = pulled(rc, "g", MiB)  # the server holds the rest: mid-way
        assert item["pull"]["bytes_total"] == 4 * MiB, item
        assert rc.status("r", cli=True)["r"]["phase"] == "Pulling"
        # Only the pull actor is on the cluster, and it holds no GPU: all three are free.
        assert len(pull_actors()) == 1 and len(ours()) == 1, ours()
        assert ray.available_resources().get("GPU") == 3
        _, answer = the_pull()
        assert answer.view.running and answer.path is None
        server.release()
        rc.converge(timeout="120s")
        assert server.requests == 1, "one download for the three engines"
    g = rc.status("g")["g"]
    replicas = rc.status("r", cli=True)["r"]["instances"]
    assert g["phase"] == "Ready" and len(replicas) == 2
    # All three run on the node that pulled it, from that node's cache, not this host's.
    assert {i["node"] for i in replicas} == {g["node"]} == {answer.node_id}
    key = f"sha256-{digest}"
    for pid in [g["pid"], *(i["pid"] for i in replicas)]:
        path = model_arg(rc, pid)
        assert path.parent.name == key and path.name == "tiny.gguf", path
        assert not path.is_relative_to(rc.state), path
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert not (rc.state / "models" / key / "tiny.gguf").exists()
    assert not pull_actors(), "a done pull's actor is ended once its copy is noted"
    listing = rc("models", check=0).out  # the host's note says where the file is
    assert "tiny.gguf" in listing and answer.node_id[:8] in listing, listing
    events = rc("events", "g", check=0).out
    assert "pull" in events and "done" in events, events


def test_a_killed_pull_is_resumed_where_it_stopped(rc: Reconcile) -> None:
    data = os.urandom(4 * MiB)
    digest = hashlib.sha256(data).hexdigest()
    server: FileServer
    with serving({"tiny.gguf": data}, hold=MiB) as server:
        source = {"url": server.url("tiny.gguf"), "sha256": digest}
        rc.write("k", command=MODEL, devices=GPU, source=source)
        pulled(rc, "k", MiB)  # the server holds after 1 MiB (and 1 MiB into each resume)
        # kill -9 of the pull's process: Ray brings the actor back on its node, which
        # resumes the partial file with a Range request.
        _, answer = the_pull()
        pid = answer.view.progress.pid
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not alive(pid), what="the pull actor's process gone")
        pulled(rc, "k", 2 * MiB - SLACK)
        # The actor ended for good: the next pass starts another on that node, resuming.
        ray.kill(the_pull()[0], no_restart=True)
        wait_for(lambda: not pull_actors(), what="the pull actor gone")
        pulled(rc, "k", 3 * MiB - 2 * SLACK)
        server.release()
        rc.converge(timeout="120s")
        starts = [int(r.removeprefix("bytes=").rstrip("-")) for r in server.ranges]
    # Each resume asked for what the partial file held (less what a kill -9 left in a
    # write buffer): nothing was downloaded twice beyond that.
    assert len(starts) == 2, server.ranges
    assert MiB - SLACK <= starts[0] <= MiB, starts
    assert starts[0] + MiB - SLACK <= starts[1] <= starts[0] + MiB, starts
    item = rc.status("k")["k"]
    assert item["phase"] == "Ready" and item["node"] == answer.node_id
    path = model_arg(rc, item["pid"])
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert not pull_actors()


@pytest.mark.slow  # ~20 s on Ray: the default run's budget
def test_a_hub_source_is_pulled_on_the_node_with_this_hosts_endpoint(rc: Reconcile) -> None:
    """HF_ENDPOINT set where reconcile runs reaches the node's pull (the nodes of this
    cluster were started without it)."""
    data = os.urandom(MiB)
    repo = f"acme/tiny-{uuid.uuid4().hex[:8]}"  # a key of its own: no earlier run's copy
    with HubServer(repo, {"tiny.gguf": data, "README.md": b"hi"}) as hub:
        rc.env["HF_ENDPOINT"] = hub.endpoint
        source = {"huggingFace": {"repo": repo, "files": ["*.gguf"]}}
        rc.write("h", command=MODEL, devices=GPU, source=source)
        rc.converge(timeout="120s")
        assert hub.downloads == ["tiny.gguf"], hub.downloads
    item = rc.status("h")["h"]
    path = model_arg(rc, item["pid"])
    assert path.name == "tiny.gguf" and not path.is_relative_to(rc.state), path
    assert path.read_bytes() == data
    assert not pull_actors()


@pytest.mark.slow  # ~20 s on Ray: the default run's budget
def test_a_start_the_holding_node_has_no_room_for_pulls_to_a_node_that_has(
    rc: Reconcile,
) -> None:
    """The file is on the node whose one GPU "a" holds: "b" (one GPU, the same file) is
    Pulling (not Pending: the wait goes on) while a node with room gets it, then runs
    there."""
    data = os.urandom(MiB)
    digest = hashlib.sha256(data).hexdigest()
    with serving({"tiny.gguf": data}) as server:
        source = {"url": server.url("tiny.gguf"), "sha256": digest}
        rc.write("a", command=MODEL, devices=GPU, source=source)
        rc.converge(timeout="120s")
        rc.write("b", command=MODEL, devices=GPU, source=source)
        rc.converge(timeout="120s")
        # The nodes of this one-box cluster share /tmp, so the node cache too: the second
        # node's pull finds the file there and is done without a download (as on a cache
        # every node mounts).
        assert server.requests == 1
    a, b = rc.status("a")["a"], rc.status("b")["b"]
    assert a["phase"] == b["phase"] == "Ready" and a["node"] != b["node"], (a, b)
    paths = {model_arg(rc, a["pid"]), model_arg(rc, b["pid"])}
    assert all(p.read_bytes() == data for p in paths)
    events = rc.events("b")
    waited = [e for e in events if e["outcome"] == "pulling"]
    assert waited and "pulling them to node" in waited[0]["error"], events
    assert any(e["action"] == "pull" and e["outcome"] == "done" for e in events), events
    assert not pull_actors()


def test_plan_puts_a_start_where_its_files_are_and_the_pass_runs_it_there(
    rc: Reconcile,
) -> None:
    """The file is on one node only, not the first of the free ones: `keep-1` and
    `keep-2` held the others while `m` pulled it (there, the one node with room). Once
    all are gone, `m2` (the same file, one GPU) was planned on the first free node in
    device order, while the launch pinned it to the node holding the file: `plan` said
    one node and the pass used another. The plan puts it where the files are now (the
    pull's note of its nodes, ``PullView.nodes``), and the pass runs it there."""
    data = os.urandom(MiB)
    digest = hashlib.sha256(data).hexdigest()
    with serving({"tiny.gguf": data}) as server:
        source = {"url": server.url("tiny.gguf"), "sha256": digest}
        for name in ("keep-1", "keep-2"):
            rc.write(name, command=ENGINE, devices=GPU)
        rc.converge(timeout="120s")
        rc.write("m", command=MODEL, devices=GPU, source=source)
        rc.converge(timeout="120s")
        m = rc.status("m")["m"]
        model_arg(rc, m["pid"])
        first = min(rc.status("keep-1", "keep-2").values(), key=lambda k: k["node"])
        assert m["node"] > first["node"], (m, first)  # the file is not on the first node
        for name in ("keep-1", "keep-2", "m"):
            (rc.manifests / f"{name}.yaml").unlink()
        rc.write("m2", command=MODEL, devices=GPU, source=source, replicas=0)
        rc.converge(timeout="120s")  # all gone: every GPU free
        assert ray.available_resources().get("GPU") == 3
        rc.write("m2", command=MODEL, devices=GPU, source=source)
        planned = [line for line in rc("plan", check=2).out.splitlines() if "m2" in line]
        assert len(planned) == 1 and f"nvidia:{m['node'][:8]}/0" in planned[0], planned
        rc.converge(timeout="120s")
        assert server.requests == 1, "no second download"
    m2 = rc.status("m2")["m2"]
    assert m2["phase"] == "Ready" and m2["node"] == m["node"], (m2, m)
    assert model_arg(rc, m2["pid"]).read_bytes() == data


def node_entry(actor: dict[str, str], key: str) -> Path:
    """The key's entry in the node's cache (the nodes of this cluster share /tmp)."""
    return pullactor.node_cache(actor["namespace"].removesuffix("-pulls")) / key


def test_plan_leaves_a_done_pull_as_it_was_and_the_next_pass_settles_it(rc: Reconcile) -> None:
    data = os.urandom(MiB)
    digest = hashlib.sha256(data).hexdigest()
    key = f"sha256-{digest}"
    with serving({"tiny.gguf": data}) as server:
        rc.write(
            "p",
            command=MODEL,
            devices=GPU,
            source={"url": server.url("tiny.gguf"), "sha256": digest},
        )
        rc.once()  # starts the pull
        (actor,) = pull_actors()
        rc.node_entries.add(node_entry(actor, key))
        wait_for(lambda: the_pull()[1].path is not None, timeout=60, what="the pull done")
        note = modelcache.cache_root(rc.state) / key / "nodes.json"
        before = note.read_bytes()
        rc("plan", check=2)  # 2: a change to make; plan computes it and writes nothing
        assert note.read_bytes() == before
        assert pull_actors() == [actor], "plan ends no actor"
        rc.converge(timeout="120s")  # the next pass notes the copy and ends the actor
    assert rc.status("p")["p"]["phase"] == "Ready"
    assert note.read_bytes() != before and not pull_actors()


def test_a_pull_failing_again_on_ray_makes_once_exit_1(rc: Reconcile) -> None:
    """The count of failures in a row is this host's: the retry's actor (here with a
    cache that lost the last result, as another node's has none) goes on from it."""
    data = os.urandom(MiB)
    right, wrong = hashlib.sha256(data).hexdigest(), "0" * 64
    with serving({"tiny.gguf": data}) as server:
        rc.write(
            "w",
            command=MODEL,
            devices=GPU,
            source={"url": server.url("tiny.gguf"), "sha256": wrong},
        )
        rc.once()  # starts the pull
        (actor,) = pull_actors()
        entry = node_entry(actor, f"sha256-{wrong}")
        rc.node_entries.add(entry)
        failure = wait_for(lambda: the_pull()[1].view.failure, timeout=60, what="a failure")
        rc.once()  # one failure: noted, retried after its back-off (exit 0)
        (entry / "result.json").unlink()  # the retry's cache knows of no failure before
        # Its back-off over now (its length is tests/core's): the host's note of the
        # failure dated a back-off earlier, as once that long has passed (no pass retries
        # before the back-off's end). Passes from then, each a Ray client.
        note = modelcache.cache_root(rc.state) / f"sha256-{wrong}" / "nodes.json"
        noted = json.loads(note.read_text())
        ago = failure.at - timedelta(seconds=backoff(failure.attempts))
        assert noted["failure"]["at"] == failure.at.isoformat(), noted
        note.write_text(
            json.dumps({**noted, "failure": {**noted["failure"], "at": ago.isoformat()}})
        )
        again = wait_for(
            lambda: (r := rc.once(check=None)).code == 1 and r, timeout=90, what="exit 1"
        )
    assert "w: its pull keeps failing (2 attempts in a row" in again.err, again.err
    assert right in again.err and wrong in again.err, again.err


@pytest.mark.slow  # ~20 s on Ray: the default run's budget
def test_a_model_file_gone_from_its_node_is_pulled_again(rc: Reconcile) -> None:
    data = os.urandom(MiB)
    digest = hashlib.sha256(data).hexdigest()
    with serving({"tiny.gguf": data}) as server:
        rc.write(
            "v",
            command=MODEL,
            devices=GPU,
            source={"url": server.url("tiny.gguf"), "sha256": digest},
        )
        rc.converge(timeout="120s")
        path = model_arg(rc, rc.status("v")["v"]["pid"])
        rc.down()
        path.unlink()  # removed from the node's cache behind reconcile's back
        rc.converge(timeout="120s")
        assert server.requests == 2, "pulled again"
    item = rc.status("v")["v"]
    assert item["phase"] == "Ready", item
    assert model_arg(rc, item["pid"]).read_bytes() == data
    assert not pull_actors()
