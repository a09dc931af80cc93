"""The ray backend against a real local cluster (three one-GPU nodes): no mocks of Ray."""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from olderhost import WORKER_ENV, OlderHost
from procs import alive, cmdline, wait_for
from rayhelp import end_ours, engines_gone, ours, ray

from controller.backends.ray import naming
from controller.backends.ray.actor import EngineJob
from controller.store.sources.manifests import load

REPO = Path(__file__).resolve().parents[2]
GPU = {"count": 1, "kind": "nvidia"}
ENGINE = [sys.executable, "-m", "controller.demo.engine", "--port", "{port}", "--host", "{host}"]
SECRET_MODEL = "https://user:s3cr3t@models.example/m"  # a URL password: redacted when we print it
Reconcile = Any  # the `reconcile` fixture of tests/conftest.py


@pytest.fixture
def rc(cluster: Any, reconcile: Reconcile) -> Iterator[Reconcile]:
    """The real CLI on the ray backend (status and records as on one node)."""
    r = reconcile
    r.env.update(RECONCILE_BACKEND="ray", RECONCILE_RAY_ADDRESS=cluster.address)
    yield r
    end_ours()
    wait_for(lambda: not ours(), timeout=30, what="our actors gone")
    engines_gone()


def answers(item: dict[str, Any]) -> bool:
    url = f"http://{item['host']}:{item['port']}/health"
    with urllib.request.urlopen(url, timeout=2) as resp:
        return bool(resp.status == 200)


def once_until(rc: Reconcile, what: str, pred: Any, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        rc("--once", check=None)
        got = rc.status()
        if pred(got):
            return got
        assert time.monotonic() < deadline, f"{what}: {got}"
        rc.end_backoff()  # a Ray pass in a back-off moves nothing, at ~1 s of CPU
        time.sleep(0.5)


def test_deployments_land_on_distinct_gpus_then_crash_pending_and_removal(rc: Reconcile) -> None:
    for name in ("a", "b"):
        rc.write(name, command=ENGINE, devices=GPU)
    rc.write("c", command=[*ENGINE, "--model", SECRET_MODEL], devices=GPU)
    rc.converge(timeout="120s")
    items = rc.status()
    assert {i["backend"] for i in items.values()} == {"ray"}
    pairs = {(i["node"], tuple(i["devices"])) for i in items.values()}
    assert len({p[0] for p in pairs}) == 3, f"one node each: {items}"
    assert all(answers(i) for i in items.values())
    assert all(len(i["node"]) == 56 for i in items.values()), "the full Ray node id"
    table = rc("status", check=0).out
    assert items["a"]["node"][:8] in table
    assert rc("plan", check=0).code == 0  # in sync, seen through Ray
    # `devices` lists the cluster's GPUs, each held by its deployment (this host's
    # inventory, empty, called every one "not in the inventory").
    devices = rc("devices", "-o", "json", check=0).json()
    assert devices["source"] == "ray" and devices["outside_inventory"] == [], devices
    held = {d["device"]: d["held_by"] for d in devices["devices"]}
    assert {n: held.get(items[n]["devices"][0]) for n in "abc"} == {n: [n] for n in "abc"}
    assert "Ray cluster" in rc("devices", check=0).out

    # An actor of ours with no record (a record lost by hand) is reaped like a marker process.
    b_pid = items["b"]["pid"]
    rc.record_path("b").unlink()
    rc.once(check=0)
    wait_for(lambda: not alive(b_pid), timeout=15, what="b's orphaned engine gone")
    assert len([x for x in ours() if x["name"].startswith("b.")]) == 1, "only the new b"
    once_until(rc, "a new b Ready", lambda s: s["b"]["phase"] == "Ready")
    assert any(e["action"] == "reap" for e in rc.events("b")), rc.events("b")

    # A 4th does not fit: Pending, saying what is missing; nothing hangs.
    rc.write("d", command=ENGINE, devices=GPU)
    started = time.monotonic()
    rc.once(check=1)
    assert time.monotonic() - started < 30
    d = rc.status()["d"]
    assert d["phase"] == "Pending"
    assert "no capacity" in d["message"] or "no Ray node" in d["message"], d

    # kill -9 of an engine: its actor restarts it; the next pass records it and counts it.
    old = items["a"]["pid"]
    os.kill(old, signal.SIGKILL)
    got = once_until(
        rc,
        "a restarted by its actor",
        lambda s: s["a"]["phase"] == "Ready" and s["a"]["pid"] != old,
    )
    assert got["a"]["restarts"] >= 1 and answers(got["a"])

    # An actor killed outright takes its engine with it (PDEATHSIG); the next passes start
    # a new instance (a new actor) and count the restart.
    a_now = rc.status()["a"]
    (actor,) = [x for x in ours() if x["name"].startswith("a.")]
    ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
    wait_for(lambda: not alive(a_now["pid"]), timeout=15, what="a's engine dies with its actor")
    got = once_until(
        rc,
        "a back in a new actor",
        lambda s: s["a"]["phase"] == "Ready" and s["a"]["pid"] != a_now["pid"],
    )
    assert got["a"]["restarts"] > a_now["restarts"] and answers(got["a"])
    fails = [e["reason"] for e in rc.events("a") if e.get("action") == "fail"]
    assert "engine ended with its actor" in fails[-1], fails  # not "not our child"

    # logs and describe read through the actor; the actor's start line hides a secret argument
    assert "demo engine" in rc("logs", "a", check=0).out
    assert "demo engine" in rc("describe", "a", check=0).out
    started = [line for line in rc("logs", "c", check=0).out.splitlines() if " reconcile: " in line]
    assert started and all("models.example" in line for line in started), started
    assert not [line for line in started if "s3cr3t" in line], started

    # manifest removed: actor and engine gone, record dropped
    c_pid = items["c"]["pid"]
    (rc.manifests / "c.yaml").unlink()
    (rc.manifests / "d.yaml").unlink()
    rc.once(check=0)
    assert "c" not in rc.status()
    wait_for(lambda: not alive(c_pid), timeout=10, what="c's engine gone")
    assert not [x for x in ours() if x["name"].startswith("c.")]

    rc.down()
    assert not ours(), "down leaves no named actor of ours"


def test_more_gpus_than_any_node_has_is_refused_by_plan_and_pass_alike(rc: Reconcile) -> None:
    """Two GPUs on three one-GPU nodes: `plan` said "create" on two nodes' GPUs (exit 2),
    then the pass found no node and said "stop a deployment", which cannot help. Both
    say now that an actor's GPUs are on one node, and the two moves that help."""
    rc.write("wide", command=ENGINE, devices={"count": 2, "kind": "nvidia"})
    said = "no node has 2 devices: an engine's devices are on one node, and the most one has is 1"
    plan = rc("plan", check=1)
    assert said in plan.out and "lower spec.devices.count, or add a node with 2 GPUs" in plan.out
    assert "0 to create" in plan.out, plan.out
    got = rc("--once", check=1)
    assert said in got.err and "Traceback" not in got.err, got.err
    wide = rc.status()["wide"]
    assert wide["phase"] == "Pending" and said in wide["message"], wide
    assert not ours(), "no actor started for what no node can hold"


def test_a_pending_ray_deployment_is_on_no_node(rc: Reconcile) -> None:
    """NODE said the controller's host name (`vm`) for a deployment no Ray node holds,
    as if it ran there; `status` and `describe` say `-`, as for its devices and port."""
    rc.write("nowhere", command=ENGINE, devices=GPU, nodeSelector={"gpu": "b200"})
    rc("--once", check=1)
    (row,) = [
        ln.split() for ln in rc("status", check=0).out.splitlines() if ln.startswith("nowhere ")
    ]
    assert row[2:6] == ["-", "-", "-", "Pending"], row
    assert "\nNode:         -\n" in rc("describe", "nowhere", check=0).out


def test_node_loss_moves_the_deployment(rc: Reconcile, cluster: Any, held_cluster: Any) -> None:
    rc.write("m", command=ENGINE, devices=GPU)
    rc.converge(timeout="120s")
    before = rc.status()["m"]
    node = next(n for n in cluster.worker_nodes if n.node_id == before["node"])
    started = time.monotonic()
    cluster.remove_node(node)
    try:
        got = once_until(
            rc,
            "m Ready on another node",
            lambda s: s["m"]["phase"] == "Ready" and s["m"]["node"] != before["node"],
            timeout=90,
        )
        took = time.monotonic() - started
        assert took < 60, f"moved in {took:.0f}s"
        assert got["m"]["restarts"] >= 1 and answers(got["m"])
        wait_for(lambda: not alive(before["pid"]), timeout=10, what="the old engine gone")
        print(f"node loss -> Ready elsewhere in {took:.1f}s")
    finally:
        # A worker in the lost one's place: left with two, the cluster did not fit the next
        # module that asks for one (tests/ray/conftest.py), which started another (a start
        # and stop: ~10 s of CPU, 30 s of the Ray unit's chain under load).
        cluster.add_node(num_cpus=1, num_gpus=1, object_store_memory=80 << 20)
        cluster.wait_for_nodes()
    assert held_cluster.fits(held_cluster.env), "the cluster whole for the next module"


def test_an_actor_ray_cannot_bring_back_by_its_deadline_says_so_not_a_refused_probe(
    rc: Reconcile, cluster: Any
) -> None:
    """The only node a selector allows lost: Ray restarts the actor, which waits for a
    node. At the readiness deadline the restart said "not ready ... (last probe: GET
    /health: ... Connection refused)", the lost engine's old address, as if the engine
    had failed to start; it says the backend's words now."""
    node = cluster.add_node(
        num_cpus=1, num_gpus=1, object_store_memory=80 << 20, labels={"gpu": "a100"}
    )
    cluster.wait_for_nodes()
    try:
        ready = {"httpGet": {"path": "/health"}, "deadlineSeconds": 5, "periodSeconds": 0.5}
        rc.write("lone", command=ENGINE, devices=GPU, nodeSelector={"gpu": "a100"}, readiness=ready)
        once_until(rc, "lone Ready", lambda s: s["lone"]["phase"] == "Ready", timeout=120)
    finally:
        cluster.remove_node(node)

    def failed() -> list[str]:
        return [e["reason"] for e in rc.events("lone") if e.get("action") == "fail"]

    once_until(rc, "lone retried at its deadline", lambda _: bool(failed()), timeout=90)
    reason = failed()[0]
    assert reason.startswith("not back by its readiness deadline: Ray is restarting its actor")
    assert "probe" not in reason and "{host}" not in reason, reason


def test_after_a_rolling_update_logs_and_down_reach_the_new_actor(rc: Reconcile) -> None:
    """The new instance's actor keeps its launch's name (`roll@next.<nonce>`) once the
    record is `roll`: `logs` and `down` asked for `roll.<nonce>`, found none, and said
    "stopped roll" while the actor and its engine ran on."""
    rc.write("roll", command=ENGINE, devices=GPU, strategy="RollingUpdate")
    rc.converge(timeout="120s")
    old = rc.status()["roll"]
    rc.write("roll", command=[*ENGINE, "--model", "v2"], devices=GPU, strategy="RollingUpdate")
    rc.converge(timeout="120s")
    new = rc.status()["roll"]
    assert new["phase"] == "Ready" and new["pid"] != old["pid"] and answers(new), new
    assert [a["name"].partition(".")[0] for a in ours()] == ["roll@next"], ours()
    assert "demo engine" in rc("logs", "roll", check=0).out
    rc.down()
    assert not ours(), "down leaves no actor of ours"
    wait_for(lambda: not alive(new["pid"]), timeout=30, what="the rolled engine gone")


def test_the_daemon_runs_ray_deployments(rc: Reconcile) -> None:
    rc.write("w", command=ENGINE, devices=GPU)
    daemon = rc.popen("--resync", "1s", "--allow-empty")  # its folder empties below
    got = wait_for(
        lambda: (rc.status().get("w") or {}).get("phase") == "Ready" and rc.status(),
        timeout=90,
        what="w Ready under the daemon",
    )
    assert got["w"]["backend"] == "ray" and answers(got["w"])
    # How old the view is (SEEN): the daemon's pass looked at w through Ray, though w's
    # node is a Ray node's id and the note's the controller's name.
    seen = rc.status("w", cli=True)["w"]["observed_at"]
    assert seen is not None, "status says when the pass looked at a ray record"
    (rc.manifests / "w.yaml").unlink()
    wait_for(lambda: "w" not in rc.status(), timeout=60, what="w stopped by the daemon")
    wait_for(lambda: not ours(), timeout=30, what="w's actor gone")
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(30) == 0


def test_a_state_dir_of_local_records_is_refused_not_run_twice(rc: Reconcile) -> None:
    """The operator's switch: `--backend ray` on the state dir a local run made. The ray
    pass judged the local records as its own, found no actor, and started the engine
    again on Ray, its record rewritten; the local one ran on, lost track of."""
    rc.write("twice", command=ENGINE)
    rc("--once", "--wait", "--backend", "local", check=0)
    local = rc.status()["twice"]
    for verb in ("--once", "down"):
        err = rc(verb, check=1).err
        assert "holds records of the local backend (twice)" in err, err
        assert "`reconcile down --backend local`" in err, err
    assert not ours() and alive(local["pid"]) and rc.status()["twice"] == local
    rc("down", "--backend", "local", check=0)
    wait_for(lambda: not alive(local["pid"]), timeout=15, what="the local engine stopped")


def test_replicas_spread_over_the_nodes_and_each_writes_its_log(rc: Reconcile) -> None:
    # No devices asked: only the backend's choice of node keeps the three replicas apart.
    rc.write("web", command=ENGINE, replicas=3)
    rc.converge(timeout="120s")
    items = rc.status("web", cli=True)["web"]
    assert items["ready_replicas"] == 3, items
    nodes = {i["node"] for i in items["instances"]}
    assert len(nodes) == 3, f"three nodes: {items['instances']}"
    assert all(answers(i) for i in items["instances"])
    # Each replica's log is its own, on its own node (read through its actor).
    pids = {i["replica"]: i["pid"] for i in items["instances"]}
    for replica, pid in pids.items():
        text = rc("logs", "web", "--replica", str(replica), check=0).out
        assert str(pid) in text, text
    every = rc("logs", "web", check=0).out.splitlines()  # all of them, each line prefixed
    for replica, name in enumerate(("web", "web@1", "web@2")):
        mine = [line for line in every if line.startswith(f"{name:<5} | ")]
        assert mine and any(str(pids[replica]) in line for line in mine), every


def test_the_log_of_an_actor_gone_since_the_last_look_is_empty(cluster: Any, tmp_path: Any) -> None:
    """An actor whose node was lost between a pass's look and its Fail's event (which
    asks for the log tail): no log, no AttributeError. The namespace cluster found it: a
    killed host's actor took the daemon down with a traceback."""
    from controller.backends.ray.backend import RayBackend, SeenActor

    backend = RayBackend(cluster.address, str(tmp_path), "owner")
    backend._seen = {("nowhere", "n1"): SeenActor("nowhere", "web.n1", "web", "n1", None)}
    assert backend.log_tail("web", 10) == []


def test_an_actor_whose_class_the_driver_cannot_load_is_read_and_stopped(rc: Reconcile) -> None:
    """An older reconcile's actor after an upgrade: its class (EngineHost with the methods
    nodeengine.py has now) does not load in the new driver, whose calls then take keywords
    only. `logs` and `down` still read its engine's log and stop it (positional calls were
    a TypeError traceback, and the engine left running)."""
    rc.write("a", command=ENGINE, devices=GPU)
    rc.converge(timeout="120s")
    first = rc.status()["a"]
    (found,) = ours()
    ns, name = found["namespace"], found["name"]
    ray.kill(ray.get_actor(name, namespace=ns), no_restart=True)
    wait_for(lambda: not ours(), timeout=30, what="a's actor gone")
    wait_for(lambda: not alive(first["pid"]), timeout=30, what="a's engine dies with its actor")
    entry = load([rc.manifests], backend="ray").entries["a"]
    parsed = naming.parse(name)
    assert parsed is not None
    job = EngineJob(entry=entry, nonce=parsed[1], state_key=ns, base_port=first["port"], record="a")
    older = (
        ray.remote(OlderHost)
        .options(
            name=name,
            namespace=ns,
            lifetime="detached",
            num_gpus=1,
            max_concurrency=4,
            runtime_env=WORKER_ENV,
        )
        .remote(job)
    )
    ref = ray.get(older.status.remote(), timeout=90).ref
    assert ref is not None, "the older actor started its engine"
    assert "demo engine" in rc("logs", "a", check=0).out
    rc.down()
    wait_for(lambda: not alive(ref.pid), timeout=30, what="the older actor's engine stopped")
    wait_for(lambda: not ours(), timeout=30, what="the older actor killed")


@pytest.fixture
def h100(cluster: Any) -> Iterator[str]:
    """A one-GPU node labelled ``gpu=h100`` (`ray start --labels`; the others carry no
    label of ours), for one test: its id. Removed after the test's own teardown."""
    node = cluster.add_node(
        num_cpus=1, num_gpus=1, object_store_memory=80 << 20, labels={"gpu": "h100"}
    )
    cluster.wait_for_nodes()
    try:
        yield str(node.node_id)
    finally:
        cluster.remove_node(node)


def test_a_node_selector_chooses_ray_nodes_by_their_labels(h100: str, rc: Reconcile) -> None:
    # The controller's own node.yaml matches none of the selectors: on Ray it is not asked
    # (every deployment is the cluster's; the Ray nodes' labels choose).
    rc.state.mkdir(mode=0o700, exist_ok=True)
    (rc.state / "node.yaml").write_text("labels: {gpu: a10}\n")
    rc.write("pinned", command=ENGINE, devices=GPU, nodeSelector={"gpu": "h100"})
    rc.write("cpu", command=ENGINE, nodeSelector={"gpu": "h100"})  # no GPU: labels alone
    rc.write("nowhere", command=ENGINE, nodeSelector={"gpu": "b200"})
    got = once_until(
        rc,
        "pinned and cpu Ready",
        lambda s: all(s.get(n, {}).get("phase") == "Ready" for n in ("pinned", "cpu")),
        timeout=120,
    )
    assert got["pinned"]["node"] == h100 and got["cpu"]["node"] == h100, got
    assert answers(got["pinned"]) and answers(got["cpu"])
    nowhere = got["nowhere"]  # a selector no Ray node matches: Pending, saying so
    assert nowhere["phase"] == "Pending" and nowhere["pid"] is None, nowhere
    assert "no Ray node matches nodeSelector gpu=b200" in nowhere["message"], nowhere
    assert "gpu=h100 (1)" in nowhere["message"], nowhere  # and what the nodes do carry
    out = rc.once(check=1)
    assert "nowhere" in out.out + out.err and "skipped" not in out.out, out

    # A plain deployment runs anywhere; a second one for the labelled node's only GPU
    # waits there, though unlabelled nodes have GPUs free.
    rc.write("plain", command=ENGINE, devices=GPU)
    rc.write("second", command=ENGINE, devices=GPU, nodeSelector={"gpu": "h100"})
    got = once_until(rc, "plain Ready", lambda s: s["plain"]["phase"] == "Ready", timeout=120)
    assert got["plain"]["node"] != h100 and answers(got["plain"]), got
    second = got["second"]
    assert second["phase"] == "Pending" and not second["devices"], second
    said = "0 free on the nodes matching nodeSelector gpu=h100 — held by pinned"
    assert said in second["message"], second
    assert got["pinned"]["node"] == h100 and got["pinned"]["phase"] == "Ready", got

    # The labelled node's GPU freed: the second one lands there, and only there.
    (rc.manifests / "pinned.yaml").unlink()
    got = once_until(rc, "second Ready", lambda s: s["second"]["phase"] == "Ready", timeout=120)
    assert "pinned" not in got and got["second"]["node"] == h100 and answers(got["second"])


def test_the_shipped_demo_runs_on_ray(rc: Reconcile) -> None:
    """README's "Outgrown one GPU box?" with the shipped manifests/: the demo binds
    `{host}` (what the actor sets to every address on its node), so the node's address
    answers; it bound loopback alone, and was restarted forever, never Ready."""
    shipped = str(REPO / "manifests")
    rc("--once", "--wait", "-f", shipped, check=0)
    demo = rc.status()["demo"]
    assert demo["phase"] == "Ready" and demo["backend"] == "ray" and answers(demo), demo
    rc("down", "-f", shipped, check=0)


def test_an_actor_stops_its_engine_as_its_parent(rc: Reconcile) -> None:
    """Why a Ray teardown is never refused as "not proven ours" (docs/design.md): the
    driver signals no pid; the actor stops its engine through the LocalBackend that
    spawned it, its parent, which may signal its unreaped child whatever the child's
    environment lets it read (a local teardown's refusal needs an engine not its own)."""
    rc.write("child", command=ENGINE)
    rc.converge(timeout="90s")
    pid = rc.status()["child"]["pid"]
    parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert cmdline(parent).startswith("ray::EngineHost"), (parent, cmdline(parent))
    rc.down()
    wait_for(lambda: not alive(pid), timeout=30, what="the engine stopped by its actor")


@pytest.fixture
def zones(cluster: Any) -> Iterator[dict[str, str]]:
    """A two-GPU node labelled ``zone=a`` and a one-GPU node labelled ``zone=b``, both
    ``pool=t`` (the module's unlabelled nodes are in no pool), for one test: zone -> its
    node id. Removed after the test's own teardown."""
    added: dict[str, Any] = {}
    try:
        for zone, gpus in (("a", 2), ("b", 1)):
            added[zone] = cluster.add_node(
                num_cpus=1,
                num_gpus=gpus,
                object_store_memory=80 << 20,
                labels={"zone": zone, "pool": "t"},
            )
        cluster.wait_for_nodes()
        yield {zone: str(node.node_id) for zone, node in added.items()}
    finally:
        for node in added.values():
            cluster.remove_node(node)


def test_replicas_go_where_plan_put_them_leaving_a_bound_deployment_its_node(
    zones: dict[str, str], rc: Reconcile
) -> None:
    """The Ray trial's cluster: `plan` put web's two replicas on zone a's two GPUs and
    batch on zone b's only one; the launch spread web@1 onto zone b (a node without a
    sibling), so batch stayed Pending for good and every `--once` exited 1."""
    pool = {"pool": "t"}
    rc.write("web", command=ENGINE, devices=GPU, replicas=2, priority=10, nodeSelector=pool)
    rc.write("batch", command=ENGINE, devices=GPU, priority=1, nodeSelector={"zone": "b"})
    a, b = zones["a"][:8], zones["b"][:8]  # as device keys and tables name a node
    planned = rc("plan", check=2).out
    assert f"nvidia:{a}/0" in planned and f"nvidia:{b}/0" in planned, planned
    for line in planned.splitlines():
        if "batch" in line and "nvidia:" in line:
            assert f"nvidia:{b}/" in line, planned
        elif "web" in line and "nvidia:" in line:
            assert f"nvidia:{a}/" in line and b not in line, planned
    got = once_until(
        rc,
        "web, web@1 and batch Ready",
        lambda s: all(s.get(n, {}).get("phase") == "Ready" for n in ("web", "web@1", "batch")),
        timeout=120,
    )
    assert got["web"]["node"] == got["web@1"]["node"] == zones["a"], got
    assert got["batch"]["node"] == zones["b"] and answers(got["batch"]), got
    rc.once(check=0)  # in sync: the pass exits 0
