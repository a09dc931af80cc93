"""A spec.container engine on the ray backend: the actor runs the container on its node.

Real Ray (the local cluster of conftest.py) and real podman and docker (the images, the
podman configuration and the private dockerd of tests/containers/conftest.py). What this
sandbox needs reaches the actors through the environment their raylets inherit, so it is
set before the module's cluster starts (a normal host needs none).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import urllib.request
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest
from containers.conftest import (  # noqa: F401 (fixtures)
    STANDIN,
    Engine,
    Registry,
    docker,
    forget_pulled,
    podman,
    registry,
)
from procs import alive, wait_for
from rayhelp import end_ours, engines_gone, ours, ray

from controller.host.containers import INSTANCE_LABEL, STATE_LABEL

Reconcile = Any  # the `reconcile` fixture of tests/conftest.py
GPU = {"count": 1, "kind": "nvidia"}
BARE = {"storage": "bare"}  # the label of the node whose runtime holds no image (`bare`)
ENGINE = [sys.executable, "-m", "controller.demo.engine", "--port", "{port}", "--host", "{host}"]


@pytest.fixture(scope="module", autouse=True)
def runtimes_env(request: pytest.FixtureRequest) -> Iterator[None]:
    """Before ``cluster`` (an autouse fixture of its scope comes first): Ray's workers
    get the environment the cluster's processes start with (podman's configuration,
    the private dockerd's socket)."""
    env: dict[str, str] = {}
    for name in ("podman", "docker"):
        # A runtime that is not installed: its tests skip, saying what to install.
        with contextlib.suppress(pytest.skip.Exception):
            env.update(request.getfixturevalue(name).env)
    with contextlib.suppress(pytest.skip.Exception):  # podman: the loopback registry's HTTP
        conf = request.getfixturevalue("registry").registries_conf
        env["CONTAINERS_REGISTRIES_CONF"] = str(conf)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(params=["podman", "docker"])
def engine(request: pytest.FixtureRequest) -> Engine:
    """Each test once per runtime."""
    chosen: Engine = request.getfixturevalue(request.param)
    return chosen


@pytest.fixture
def rc(cluster: Any, reconcile: Reconcile, engine: Engine) -> Iterator[Reconcile]:
    r = reconcile
    r.env.update(RECONCILE_BACKEND="ray", RECONCILE_RAY_ADDRESS=cluster.address, **engine.env)
    yield r
    _all_down(r)


def _all_down(r: Reconcile, pids: Collection[int] = ()) -> None:
    """What a test started on the cluster, ended (``end_ours``: a `down` cost a driver's
    start), then its actors and its engines gone (by their marker; ``pids`` by pid: those
    on the ``bare`` node, whose marker names that node's own temp folder)."""
    end_ours()
    wait_for(lambda: not ours(), timeout=30, what="our actors gone")
    engines_gone()
    wait_for(lambda: not any(alive(p) for p in pids), timeout=30, what="engines gone")


def labelled(engine: Engine, label: str) -> list[str]:
    """Every container (any state) carrying ``label`` (``key=value``)."""
    return engine.cli("ps", "-a", "-q", "--no-trunc", "--filter", f"label={label}").split()


def health(host: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=5) as answer:
        body: str = answer.read().decode()
        return body


def test_the_actor_runs_the_container_on_its_node_and_down_removes_it(
    rc: Reconcile, engine: Engine
) -> None:
    container = {"image": engine.image, "runtime": engine.name}
    rc.write("rbox", command=STANDIN, container=container, stopGracePeriodSeconds=2)
    rc.converge(timeout="120s")
    item = rc.status()["rbox"]
    assert item["backend"] == "ray" and item["phase"] == "Ready", item
    assert health(item["host"], item["port"]) == "ok\n"
    record = rc.record("rbox")
    assert record is not None
    kept = record["container"]
    assert kept is not None and kept["runtime"] == engine.name and kept["image"] == engine.image
    assert kept["digest"].startswith("sha256:")
    # The record's pid is the container's main process as the node sees it, with the
    # actor's marker and the labels that make the container ours.
    seen = engine.inspect(kept["id"])
    assert seen["State"]["Pid"] == record["ref"]["pid"]
    labels = seen["Config"]["Labels"]
    marker = labels[INSTANCE_LABEL]
    assert marker == f"{item['node']}/rbox/{record['nonce']}"
    state = labels[STATE_LABEL]
    assert state.startswith("/tmp/reconcile-ray/"), state
    env = rc.environ(record["ref"]["pid"])
    assert env["RECONCILE_INSTANCE"] == marker and env["PORT"] == str(item["port"])
    # The engine's output reaches its log on the node, read through the actor.
    logs = rc("logs", "rbox", check=0)
    assert f"engine rbox on port {item['port']}" in logs.out, str(logs)

    # --once left it running: the next pass adopts it through its actor, unchanged.
    rc.once(check=0)
    kept_on = rc.record("rbox")
    assert kept_on is not None and kept_on["container"] == kept
    assert kept_on["nonce"] == record["nonce"] and kept_on["ref"] == record["ref"]

    # The container's main process killed by hand: the actor runs a new container.
    os.kill(record["ref"]["pid"], signal.SIGKILL)

    def replaced() -> bool:
        rc("--once", check=None)
        now = rc.record("rbox")
        done = bool(now and now["container"] and now["container"]["id"] != kept["id"])
        if not done:
            rc.end_backoff()  # a pass in a back-off moves nothing, at ~1 s of CPU on Ray
        return done

    wait_for(replaced, timeout=90, what="a new container for rbox")
    again = rc.record("rbox")
    assert again is not None
    wait_for(lambda: len(labelled(engine, f"{STATE_LABEL}={state}")) == 1, timeout=30,
             what="the killed container removed")  # fmt: skip

    # Its actor killed outright: the container is the runtime's child and outlives it,
    # until the next actor of the deployment sweeps it on its node, and removes it.
    (actor,) = ours()
    ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)

    def moved_on() -> bool:
        rc("--once", check=None)
        now = rc.record("rbox")
        fresh = bool(
            now and now["container"] and now["container"]["id"] != again["container"]["id"]
        )
        done = fresh and labelled(engine, f"{STATE_LABEL}={state}") == [now["container"]["id"]]
        if not done:
            rc.end_backoff()
        return done

    wait_for(moved_on, timeout=120, what="one container of rbox, a new actor's")

    # down: the actor stops its container, which is then gone (no leak).
    rc("down", check=0)
    wait_for(lambda: not ours(), timeout=30, what="our actors gone")
    assert labelled(engine, f"{STATE_LABEL}={state}") == []


def test_an_image_is_pulled_on_one_node_and_its_engine_runs_there(
    cluster: Any,
    reconcile: Reconcile,
    podman: Engine,  # noqa: F811 (the fixture imported above)
    registry: Registry,  # noqa: F811
) -> None:
    """The node pulling an instance's image runs it: the pull before the placement and
    each launch are pinned there (imagefetch.py), not left to Ray, whose next pick would
    pull it again elsewhere. pullPolicy Always: a second node would start a pull of its
    own, a second event. Twice, with the note of a pull that an earlier pass (a cron's)
    started on one GPU node, then on another: Ray's own pick cannot be both."""
    rc = reconcile
    rc.env.update(RECONCILE_BACKEND="ray", RECONCILE_RAY_ADDRESS=cluster.address, **podman.env)
    gpu_nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU"))
    note = rc.state / "images" / "ray-nodes.json"
    container = {"image": registry.tagged, "runtime": "podman", "pullPolicy": "Always"}
    try:
        for node in (gpu_nodes[0], gpu_nodes[-1]):
            forget_pulled(podman, registry)
            note.parent.mkdir(parents=True, exist_ok=True)
            key = f"podman {registry.tagged}"  # imagefetch.image_key
            note.write_text(json.dumps({"version": 1, "nodes": {key: node}}))
            rc.write("fresh", command=STANDIN, container=container, devices=GPU,
                     stopGracePeriodSeconds=2)  # fmt: skip
            rc.converge(timeout="120s")
            record = rc.record("fresh")
            assert record is not None and record["phase"] == "Ready", record
            assert record["node"] == node, (record, gpu_nodes)
            pulls = [e["error"] for e in rc.events("fresh") if e.get("outcome") == "pulling"]
            assert pulls and all(p.endswith(f"on Ray node {node[:8]}") for p in pulls), pulls
            assert key not in json.loads(note.read_text())["nodes"]  # running: forgotten
            rc.down()
            wait_for(lambda: not ours(), timeout=30, what="our actors gone")
            (rc.state / "events" / "fresh.jsonl").unlink()
    finally:
        _all_down(rc)
        forget_pulled(podman, registry)


def backed_off(rc: Reconcile, name: str, count: int) -> dict[str, Any]:
    """Passes until ``name`` backs off after its ``count``-th retry failed too (its
    back-off ended at once: what the retry does is checked, not the wait's length). A
    back-off left by the last call ends first, so the first pass is the retry (a pass in
    a back-off moves nothing, at a few seconds of CPU on Ray)."""
    last = rc.record(name)
    if last is not None and last["phase"] == "BackOff":
        rc.end_backoff(name)

    def failed_again() -> dict[str, Any] | None:
        rc.once(check=None)
        rec = rc.record(name)
        backing_off = rec is not None and rec["phase"] == "BackOff"
        if backing_off and rec["restarts"] >= count:
            return rec
        if backing_off:
            rc.end_backoff(name)
        return None

    found: dict[str, Any] = wait_for(failed_again, timeout=180, what=f"{name}'s retry {count}")
    return found


def test_a_higher_priority_start_whose_image_fails_to_pull_preempts_no_ray_engine(
    cluster: Any,
    reconcile: Reconcile,
    podman: Engine,  # noqa: F811 (the fixture imported above)
    registry: Registry,  # noqa: F811
) -> None:
    """Every GPU node runs a lower-priority engine; `high` (priority 5, one GPU) comes
    with an image that cannot be pulled (a tag its registry does not have: said at once,
    where a registry nobody answers at costs podman's own retries, a pass more per pull
    on Ray). Its pull runs first, on the node it would run on, holding no GPU (there is
    none free), and fails: `high` backs off naming the pull's error and that node,
    holding nothing, and so does its retry; every engine runs on, the same one, Ready.
    It was placed first (one `low` preempted), and only then did its actor find the
    image missing, on every retry."""
    rc = reconcile
    rc.env.update(RECONCILE_BACKEND="ray", RECONCILE_RAY_ADDRESS=cluster.address, **podman.env)
    gpu_nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")]
    lows = [f"low-{i}" for i in range(len(gpu_nodes))]
    image = f"{registry.address}/reconcile-test/engine:high"  # a tag it does not have
    container = {"image": image, "runtime": "podman", "pullPolicy": "Always"}
    try:
        for name in lows:
            rc.write(name, command=ENGINE, devices=GPU)
        rc.converge(timeout="120s")
        before = {name: rc.record(name) for name in lows}
        assert all(r is not None and r["phase"] == "Ready" for r in before.values()), before
        rc.write("high", command=STANDIN, container=container, devices=GPU, priority=5,
                 stopGracePeriodSeconds=2)  # fmt: skip
        for retry in (0, 1):  # the first pull, then the retry after its back-off
            failed = backed_off(rc, "high", retry)
            for name in lows:
                kept = rc.record(name)
                assert kept is not None and kept["phase"] == "Ready", kept
                assert kept["ref"] == before[name]["ref"] and kept["restarts"] == 0, kept
            assert failed["message"].startswith(f"cannot pull image {image}: "), failed
            assert "on Ray node" in failed["message"], failed
            assert failed["devices"] == [] and failed["port"] is None, failed
        preempted = [e for n in lows for e in rc.events(n) if e.get("action") == "preempt"]
        assert preempted == []
        assert {a["name"].partition(".")[0] for a in ours()} == set(lows)  # no actor of high
    finally:
        _all_down(rc)


@pytest.fixture
def bare(cluster: Any, podman: Engine, tmp_path: Path) -> Iterator[str]:  # noqa: F811
    """A one-GPU node labelled ``storage=bare`` whose podman keeps its images apart (an
    empty storage of its own: none of the images this box built) and whose temp folder
    is its own (its tasks' and actors' folder, as on a machine of its own), for one test:
    its id. Removed after the test's own teardown. (``podman``: skipped without it.)"""
    conf = tmp_path / "storage.conf"
    conf.write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{tmp_path}/graph"\nrunroot = "{tmp_path}/run"\n'
    )
    (tmp_path / "tmp").mkdir()
    env = {"CONTAINERS_STORAGE_CONF": str(conf), "TMPDIR": str(tmp_path / "tmp")}
    node = cluster.add_node(
        num_cpus=1, num_gpus=1, object_store_memory=80 << 20, labels=BARE, env_vars=env
    )
    cluster.wait_for_nodes()
    try:
        yield str(node.node_id)
    finally:
        cluster.remove_node(node)
        # Gone from Ray's view too before the next test counts the GPU nodes.
        left = str(node.node_id)
        wait_for(
            lambda: not [n for n in ray.nodes() if n["NodeID"] == left and n["Alive"]],
            timeout=60,
            what="the bare node gone",
        )


HELD = ["low", "keep-1", "keep-2", "web"]


def _backed_off_unpulled(rc: Reconcile, name: str, image: str, bare: str) -> None:
    """``name`` backed off after its image's pull failed on ``bare``, holding nothing."""
    failed = backed_off(rc, name, 0)
    assert failed["message"].startswith(f"cannot pull image {image}: "), failed
    assert failed["message"].endswith(f"on Ray node {bare[:8]}"), failed
    assert failed["devices"] == [] and failed["port"] is None, failed


def _untouched(rc: Reconcile, names: list[str], before: dict[str, Any]) -> None:
    """Each of ``names`` Ready as ``before``, never restarted, none preempted."""
    for name in names:
        kept = rc.record(name)
        assert kept is not None and kept["phase"] == "Ready", kept
        assert kept["ref"] == before[name]["ref"] and kept["restarts"] == 0, kept
    preempted = [e for n in names for e in rc.events(n) if e.get("action") == "preempt"]
    assert preempted == []


def _held_but_low(
    rc: Reconcile,
    web: dict[str, Any],
    bare: str,
    pids: list[int],
    keeps: tuple[str, ...] = ("keep-1", "keep-2"),
) -> dict[str, Any]:
    """Every GPU held (one free with one of ``keeps`` fewer): `low` (priority 0) on
    `bare`, ``keeps`` (priority 10) and `web` (``web``: one replica) on the other nodes,
    all Ready, their pids added to ``pids``; the image's note names web's node (it holds
    the image), as an earlier pass's pull there left it: the node the look went to. Their
    records."""
    rc.write("low", command=ENGINE, devices=GPU, nodeSelector=BARE)
    rc.converge(timeout="120s")  # first: the keeps and web go to the other nodes
    for name in keeps:
        rc.write(name, command=ENGINE, devices=GPU, priority=10)
    rc.write("web", **web)
    rc.converge(timeout="120s")
    before = {name: rc.record(name) for name in ["low", *keeps, "web"]}
    assert all(r is not None and r["phase"] == "Ready" for r in before.values()), before
    pids += [r["ref"]["pid"] for r in before.values() if r is not None]
    assert before["low"]["node"] == bare and before["web"]["node"] != bare, before
    note = rc.state / "images" / "ray-nodes.json"
    note.parent.mkdir(parents=True, exist_ok=True)
    key = f"podman {web['container']['image']}"  # imagefetch.image_key
    note.write_text(json.dumps({"version": 1, "nodes": {key: before["web"]["node"]}}))
    return before


def test_a_replica_whose_image_its_node_cannot_get_preempts_no_ray_engine(
    cluster: Any,
    reconcile: Reconcile,
    podman: Engine,  # noqa: F811 (the fixture imported above)
    bare: str,
) -> None:
    """`web` (priority 5, a container of an image this box built: no registry has it) runs
    one replica on a node that holds the image; every other GPU is held, by `keep-*`
    (priority 10) and, on the node whose runtime holds no image (`bare`), by `low`
    (priority 0). web is scaled to 2: web@1 can only run by preempting low, and so on
    low's node, which cannot get the image. Its image is looked for there first (where a
    preempting start lands), its pull runs there holding no GPU and fails: web@1 backs
    off naming the pull's error and that node, holding nothing, and low runs on. The
    look was on the image's noted node alone (web's), so web@1 preempted low and only
    then did its actor find the image missing on low's node."""
    rc = reconcile
    rc.env.update(RECONCILE_BACKEND="ray", RECONCILE_RAY_ADDRESS=cluster.address, **podman.env)
    container = {"image": podman.image, "runtime": "podman"}
    web = {"command": STANDIN, "container": container, "devices": GPU, "priority": 5,
           "stopGracePeriodSeconds": 2}  # fmt: skip
    names = HELD
    pids: list[int] = []
    try:
        before = _held_but_low(rc, web, bare, pids)
        rc.write("web", replicas=2, **web)
        _backed_off_unpulled(rc, "web@1", podman.image, bare)
        _untouched(rc, names, before)
        assert {a["name"].partition(".")[0] for a in ours()} == set(names)  # none of web@1
    finally:
        _all_down(rc, pids)


def test_the_replica_that_fits_where_its_image_is_starts_while_the_one_to_preempt_waits(
    cluster: Any,
    reconcile: Reconcile,
    podman: Engine,  # noqa: F811 (the fixture imported above)
    bare: str,
) -> None:
    """As above with one `keep` fewer: a GPU node is free, and holds the image (this
    box's podman storage). web is scaled to 3: web@1 fits in the free node's room, and
    web@2 can only run by preempting low, on bare, which cannot get the image. The look
    is per node: in the first pass (a node's look not answered in time: the next) web@1
    is placed on the free node, while web@2 waits for the image holding nothing; its pull
    on bare fails and it backs off, low runs on, and web@1 gets Ready. The look answered
    once for the deployment: web@1 waited with web@2 (Pulling, then BackOff) for as long
    as bare could not get the image."""
    rc = reconcile
    rc.env.update(RECONCILE_BACKEND="ray", RECONCILE_RAY_ADDRESS=cluster.address, **podman.env)
    container = {"image": podman.image, "runtime": "podman"}
    web = {"command": STANDIN, "container": container, "devices": GPU, "priority": 5,
           "stopGracePeriodSeconds": 2}  # fmt: skip
    names = ["low", "keep-1", "web"]
    pids: list[int] = []
    try:
        before = _held_but_low(rc, web, bare, pids, keeps=("keep-1",))
        gpu_nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")}
        (free,) = gpu_nodes - {r["node"] for r in before.values()}
        rc.write("web", replicas=3, **web)

        def held() -> dict[str, Any] | None:  # the first pass, but for a look not answered
            rc.once(check=None)
            rec = rc.record("web@1")
            return rec if rec is not None and rec["devices"] else None

        placed = wait_for(held, timeout=120, what="web@1 placed")
        assert placed["node"] == free, (placed, free)
        waiting = rc.record("web@2")
        assert waiting is not None and waiting["phase"] in ("Pulling", "BackOff"), waiting
        assert waiting["devices"] == [] and waiting["port"] is None, waiting
        _backed_off_unpulled(rc, "web@2", podman.image, bare)

        def ready() -> dict[str, Any] | None:  # `--wait` ends at web@2's back-off
            rc.once(check=None)
            rec = rc.record("web@1")
            return rec if rec is not None and rec["phase"] == "Ready" else None

        up = wait_for(ready, timeout=120, what="web@1 Ready")
        assert up["node"] == free and up["nonce"] == placed["nonce"], (up, placed)
        pids.append(up["ref"]["pid"])
        _untouched(rc, names, before)
    finally:
        _all_down(rc, pids)


def test_plan_puts_a_start_where_its_image_is_and_the_pass_runs_it_there(
    cluster: Any,
    reconcile: Reconcile,
    podman: Engine,  # noqa: F811 (the fixture imported above)
) -> None:
    """The image's note names a node that holds it and is not the first free one in
    device order (an earlier pass's pull there): the look went there, and the launch
    too, while `plan` put `web` on the first free GPU: `plan` said one node and the pass
    used another. The plan takes the GPUs of the nodes the look found the image on
    first (``Observed.images_on``), and the pass runs it where `plan` said."""
    rc = reconcile
    rc.env.update(RECONCILE_BACKEND="ray", RECONCILE_RAY_ADDRESS=cluster.address, **podman.env)
    live = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")]
    noted = max(n["NodeID"] for n in live)  # the last in device order (keyed by node)
    note = rc.state / "images" / "ray-nodes.json"
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text(json.dumps({"version": 1, "nodes": {f"podman {podman.image}": noted}}))
    container = {"image": podman.image, "runtime": "podman"}
    try:
        rc.write("web", command=STANDIN, container=container, devices=GPU,
                 stopGracePeriodSeconds=2)  # fmt: skip
        planned = [line for line in rc("plan", check=2).out.splitlines() if "web" in line]
        assert len(planned) == 1 and f"nvidia:{noted[:8]}/0" in planned[0], (planned, noted)
        rc.converge(timeout="120s")
        web = rc.record("web")
        assert web is not None and web["phase"] == "Ready" and web["node"] == noted, web
    finally:
        _all_down(rc)


def test_a_start_whose_room_a_higher_start_takes_preempts_no_ray_engine_for_its_image(
    cluster: Any,
    reconcile: Reconcile,
    podman: Engine,  # noqa: F811 (the fixture imported above)
    bare: str,
) -> None:
    """Every GPU held but one, on a node that holds the image: `low` (priority 0) on
    `bare`, which cannot get it, `keep-*` (priority 10) on two others. `hi` (priority 9,
    no image) and `web` (priority 5, one replica of an image this box built) are added
    at once. web's look counted the free GPU as its own, so it looked on that node alone
    and found the image; hi took the GPU, and web preempted low to run on bare, which
    lacks it. The room is the pass's: the look reaches low's node too, and web waits
    Pending, saying the room was taken and why it preempts nobody (the pass's next round:
    Pulling on bare); then its pull there fails and it backs off holding nothing. low
    runs on."""
    rc = reconcile
    rc.env.update(RECONCILE_BACKEND="ray", RECONCILE_RAY_ADDRESS=cluster.address, **podman.env)
    container = {"image": podman.image, "runtime": "podman"}
    names = ["low", "keep-1", "keep-2"]
    pids: list[int] = []
    try:
        rc.write("low", command=ENGINE, devices=GPU, nodeSelector=BARE)
        rc.converge(timeout="120s")  # first: the keeps go to the other nodes
        for name in names[1:]:
            rc.write(name, command=ENGINE, devices=GPU, priority=10)
        rc.converge(timeout="120s")
        before = {name: rc.record(name) for name in names}
        assert all(r is not None and r["phase"] == "Ready" for r in before.values()), before
        pids += [r["ref"]["pid"] for r in before.values() if r is not None]
        assert before["low"]["node"] == bare, before
        rc.write("hi", command=ENGINE, devices=GPU, priority=9)
        rc.write("web", command=STANDIN, container=container, devices=GPU, priority=5)
        rc.once(check=None)  # its first round: hi placed, web's room taken
        first = rc.events("web")[0]
        if "did not say whether image" not in first.get("error", ""):  # else: no answer
            assert first["action"] == "pending", first
            why = first["reason"]
            assert why.startswith("no capacity: needs 1 nvidia device, 0 free — held by hi ")
            said = "; it preempts nobody while its image is missing on a node it may free ("
            assert said in why and why.endswith(f" on Ray node {bare[:8]})"), why
        _backed_off_unpulled(rc, "web", podman.image, bare)
        placed = rc.record("hi")
        assert placed is not None and placed["devices"], placed
        _untouched(rc, names, before)
    finally:
        _all_down(rc, pids)


def test_a_replica_preempts_only_once_its_image_is_pulled_on_the_victims_node(
    cluster: Any,
    reconcile: Reconcile,
    podman: Engine,  # noqa: F811 (the fixture imported above)
    registry: Registry,  # noqa: F811
    bare: str,
) -> None:
    """As above, with an image pinned by digest that web's node holds and the registry
    serves: web@1's image is pulled on low's node (`bare`) first, holding nothing, and
    only once it is there is low preempted, web@1 running there. The look was on web's
    node alone: low was preempted first, and web@1's actor pulled on its node after."""
    rc = reconcile
    rc.env.update(RECONCILE_BACKEND="ray", RECONCILE_RAY_ADDRESS=cluster.address, **podman.env)
    image = f"{registry.address}/reconcile-test/engine@{registry.digest}"
    web = {"command": STANDIN, "container": {"image": image, "runtime": "podman"},
           "devices": GPU, "priority": 5, "stopGracePeriodSeconds": 2}  # fmt: skip
    pids: list[int] = []
    forget_pulled(podman, registry)
    try:
        _held_but_low(rc, web, bare, pids)
        rc.write("web", replicas=2, **web)

        def ready() -> dict[str, Any] | None:  # `--wait` ends at low's Pending (stuck)
            rc.once(check=None)
            rec = rc.record("web@1")
            return rec if rec is not None and rec["phase"] == "Ready" else None

        placed = wait_for(ready, timeout=180, what="web@1 Ready")
        assert placed["node"] == bare, placed
        pids.append(placed["ref"]["pid"])
        low = rc.record("low")
        assert low is not None and low["phase"] == "Pending", low
        events = rc.events("web")
        pulled = [
            e for e in events if e.get("instance") == "web@1" and e.get("outcome") == "pulling"
        ]
        (preempt,) = [e for e in rc.events("low") if e.get("action") == "preempt"]
        assert pulled and all(e["error"].endswith(f"on Ray node {bare[:8]}") for e in pulled)
        assert pulled[0]["time"] < preempt["time"], (pulled, preempt)
    finally:
        _all_down(rc, pids)
        forget_pulled(podman, registry)


def test_a_recreate_whose_image_the_freed_node_cannot_get_keeps_the_ray_engine(
    cluster: Any,
    reconcile: Reconcile,
    podman: Engine,  # noqa: F811 (the fixture imported above)
    bare: str,
) -> None:
    """`web` (a process, strategy Recreate) runs on the node whose runtime holds no image
    (`bare`), every other GPU held by `keep-*`; web is edited into a container of an
    image this box built (no registry has it). No node has room, so the new web lands
    where the old one's GPUs are freed, on bare, which cannot get the image. Before web
    is stopped its image is pulled there too: the pull fails, and web serves on, the same
    engine, saying why. The image was looked for on its noted node alone (one holding
    it): web was stopped, and the new one found the image missing on bare and failed to
    pull it, leaving no engine."""
    rc = reconcile
    rc.env.update(RECONCILE_BACKEND="ray", RECONCILE_RAY_ADDRESS=cluster.address, **podman.env)
    keeps = ["keep-1", "keep-2", "keep-3"]
    web = {"devices": GPU, "strategy": "Recreate", "stopGracePeriodSeconds": 2}
    pids: list[int] = []
    try:
        rc.write("web", command=ENGINE, nodeSelector=BARE, **web)
        rc.converge(timeout="120s")  # first: the keeps go to the other nodes
        for name in keeps:
            rc.write(name, command=ENGINE, devices=GPU)
        rc.converge(timeout="120s")
        before = {name: rc.record(name) for name in ["web", *keeps]}
        assert all(r is not None and r["phase"] == "Ready" for r in before.values()), before
        pids += [r["ref"]["pid"] for r in before.values()]
        assert before["web"]["node"] == bare, before
        # The image's note names a node that holds it (as an earlier pull there left
        # it): the node the look went to.
        note = rc.state / "images" / "ray-nodes.json"
        note.parent.mkdir(parents=True, exist_ok=True)
        key = f"podman {podman.image}"  # imagefetch.image_key
        note.write_text(json.dumps({"version": 1, "nodes": {key: before["keep-1"]["node"]}}))
        container = {"image": podman.image, "runtime": "podman"}
        rc.write("web", command=STANDIN, container=container, **web)

        def said_failed() -> dict[str, Any] | None:
            rc.once(check=None)
            now = rc.record("web")  # every pass: the old engine serves on
            assert now is not None and now["phase"] == "Ready", now
            assert now["ref"] == before["web"]["ref"], now
            waits = [e for e in rc.events("web") if e.get("outcome") == "waiting"]
            return next((e for e in waits if "cannot pull image" in e["error"]), None)

        failed = wait_for(said_failed, timeout=180, what="web's new image said unpullable")
        assert failed["error"].startswith(f"cannot pull image {podman.image}: "), failed
        assert failed["error"].endswith(f"; the running engine is kept (Ray node {bare[:8]})")
        for name in keeps:
            kept = rc.record(name)
            assert kept is not None and kept["ref"] == before[name]["ref"], kept
    finally:
        _all_down(rc, pids)


def test_a_rolling_update_whose_new_image_cannot_be_pulled_keeps_the_old_ray_engine(
    cluster: Any,
    reconcile: Reconcile,
    podman: Engine,  # noqa: F811 (the fixture imported above)
    registry: Registry,  # noqa: F811
) -> None:
    """`web` (RollingUpdate, a container) and a lower-priority engine on every other GPU
    node; web's image is edited to one that cannot be pulled (a tag its registry
    does not have). No GPU is free for `web@next` beside it, so the update recreates web in
    place (maxUnavailable is at least 1), which asks the backend first whether the new
    image is there (`prepared`): its pull runs on a node, holding nothing, and fails, and
    web serves on, the same engine, every pass; nothing is preempted. Ray's `prepared`
    said None (the new node not known before placement): web was stopped, and its new
    actor found the image missing, leaving no engine. Then a low is removed: with room,
    `web@next` is placed beside web (a rolling update never preempts), its actor's pull
    fails on its node, and it backs off holding nothing while web serves on."""
    rc = reconcile
    rc.env.update(RECONCILE_BACKEND="ray", RECONCILE_RAY_ADDRESS=cluster.address, **podman.env)
    gpu_nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")]
    lows = [f"low-{i}" for i in range(len(gpu_nodes) - 1)]
    image = f"{registry.address}/reconcile-test/engine:2"  # a tag it does not have
    web = {"command": STANDIN, "devices": GPU, "strategy": "RollingUpdate", "priority": 5,
           "stopGracePeriodSeconds": 2}  # fmt: skip
    try:
        for name in lows:
            rc.write(name, command=ENGINE, devices=GPU)
        rc.write("web", container={"image": podman.image, "runtime": "podman"}, **web)
        rc.converge(timeout="120s")
        before = {name: rc.record(name) for name in ["web", *lows]}
        assert all(r is not None and r["phase"] == "Ready" for r in before.values()), before
        rc.write("web", container={"image": image, "runtime": "podman"}, **web)

        def serving() -> None:  # every pass: the old engine serves on
            now = rc.record("web")
            assert now is not None and now["phase"] == "Ready", now
            assert now["ref"] == before["web"]["ref"], now

        def said_failed() -> dict[str, Any] | None:
            rc.once(check=None)
            serving()
            waits = [e for e in rc.events("web") if e.get("outcome") == "waiting"]
            return next((e for e in waits if "cannot pull image" in e["error"]), None)

        failed = wait_for(said_failed, timeout=180, what="web's new image said unpullable")
        assert failed["error"].startswith(f"cannot pull image {image}: "), failed
        assert "; the running engine is kept (Ray node " in failed["error"], failed
        assert rc.record("web@next") is None

        (rc.manifests / f"{lows[-1]}.yaml").unlink()  # room for web@next beside web

        def next_failed() -> dict[str, Any] | None:
            rc.once(check=None)
            serving()
            nxt = rc.record("web@next")
            return nxt if nxt is not None and nxt["phase"] == "BackOff" else None

        nxt = wait_for(next_failed, timeout=180, what="web@next backing off")
        assert f"cannot pull image {image}: " in nxt["message"], nxt
        assert "spec.command" not in nxt["message"], nxt  # the image is what to correct
        assert nxt["devices"] == [] and nxt["port"] is None, nxt
        item = rc.status()["web"]
        assert health(item["host"], item["port"]) == "ok\n"
        kept = rc.record(lows[0])
        assert kept is not None and kept["phase"] == "Ready", kept
        assert kept["ref"] == before[lows[0]]["ref"] and kept["restarts"] == 0, kept
        preempted = [e for n in lows for e in rc.events(n) if e.get("action") == "preempt"]
        assert preempted == []
        assert len([a for a in ours() if a["name"].startswith("web")]) == 1  # the old one's
    finally:
        _all_down(rc)


def test_a_ray_roll_whose_image_is_not_on_its_node_says_it_pulls_first(
    cluster: Any,
    reconcile: Reconcile,
    podman: Engine,  # noqa: F811 (the fixture imported above)
    registry: Registry,  # noqa: F811
) -> None:
    """`web` (RollingUpdate, one GPU, a container) runs, with GPU nodes free; its image is
    edited to one no node has (a tag its registry lacks). `plan` and the `roll` event said
    `web@next` took a GPU and a port ("beside the old: nvidia:N/0, port P") while its actor
    pulled the image on its node holding nothing: they say the pull comes first, on the
    node the look picked, and what it takes once pulled, as on one host; the launch goes to
    that node and pulls there, `web@next` holding nothing, web serving on."""
    rc = reconcile
    rc.env.update(RECONCILE_BACKEND="ray", RECONCILE_RAY_ADDRESS=cluster.address, **podman.env)
    image = f"{registry.address}/reconcile-test/engine:2"  # a tag it does not have
    web = {"command": STANDIN, "devices": GPU, "strategy": "RollingUpdate",
           "stopGracePeriodSeconds": 2}  # fmt: skip
    words = re.compile(
        rf"web@next beside the old: pulling image {re.escape(image)} \(podman\) on Ray node "
        r"(\w{8}) first; once pulled it takes nvidia:\w{8}/0, port \d+"
    )
    try:
        rc.write("web", container={"image": podman.image, "runtime": "podman"}, **web)
        rc.converge(timeout="120s")
        before = rc.record("web")
        assert before is not None and before["phase"] == "Ready", before
        rc.write("web", container={"image": image, "runtime": "podman"}, **web)
        planned = rc("plan", check=None).out
        said = words.search(planned)
        assert said is not None, planned
        rc.once(check=None)
        rolls = [e["reason"] for e in rc.events("web") if e.get("action") == "roll"]
        assert len(rolls) == 1 and words.search(rolls[0]), rolls
        nxt = rc.record("web@next")
        assert nxt is not None and nxt["devices"] == [] and nxt["port"] is None, nxt
        assert nxt["message"].endswith(f"on Ray node {said[1]}"), (nxt, said[1])
        now = rc.record("web")
        assert now is not None and now["phase"] == "Ready" and now["ref"] == before["ref"], now
    finally:
        _all_down(rc)


KEPT = {"zone": "kept"}  # the label of the node a selector-bound deployment needs


@pytest.fixture
def kept_node(cluster: Any) -> Iterator[str]:
    """A one-GPU node labelled ``zone=kept`` whose runtimes are this box's (it holds the
    images, as every node but ``bare``), for one test: its id. Removed after the test's
    own teardown."""
    node = cluster.add_node(num_cpus=1, num_gpus=1, object_store_memory=80 << 20, labels=KEPT)
    cluster.wait_for_nodes()
    try:
        yield str(node.node_id)
    finally:
        cluster.remove_node(node)
        left = str(node.node_id)  # gone from Ray's view too before the next test counts
        wait_for(
            lambda: not [n for n in ray.nodes() if n["NodeID"] == left and n["Alive"]],
            timeout=60,
            what="the kept node gone",
        )


def test_a_start_planned_past_its_images_noted_node_runs_where_plan_put_it(
    cluster: Any,
    reconcile: Reconcile,
    podman: Engine,  # noqa: F811 (the fixture imported above)
    kept_node: str,
) -> None:
    """The image's note names the `zone=kept` node, which holds it; `wide` (two GPUs on a
    `zone=kept` node: none has them) keeps that node for last, so `plan` puts `web` on
    another GPU node. Every start fit on the noted node, so the look asked it alone and
    the launch went there, as noted: `web` ran on the node a selector-bound deployment
    needs, not where `plan` said. The launch goes to the plan's node, where the actor
    looks for the image (this box's podman storage holds it) and runs it."""
    rc = reconcile
    rc.env.update(RECONCILE_BACKEND="ray", RECONCILE_RAY_ADDRESS=cluster.address, **podman.env)
    note = rc.state / "images" / "ray-nodes.json"
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text(json.dumps({"version": 1, "nodes": {f"podman {podman.image}": kept_node}}))
    container = {"image": podman.image, "runtime": "podman"}
    try:
        rc.write("wide", command=ENGINE, devices={"count": 2, "kind": "nvidia"}, nodeSelector=KEPT)
        rc.write("web", command=STANDIN, container=container, devices=GPU,
                 stopGracePeriodSeconds=2)  # fmt: skip
        planned = [line for line in rc("plan", check=None).out.splitlines() if "web" in line]
        said = re.search(r"nvidia:(\w{8})/0", " ".join(planned))
        assert said is not None and said[1] != kept_node[:8], (planned, kept_node)

        def ready() -> dict[str, Any] | None:  # `wide` waits for good: no `--wait`
            rc.once(check=None)
            rec = rc.record("web")
            return rec if rec is not None and rec["phase"] == "Ready" else None

        web = wait_for(ready, timeout=120, what="web Ready")
        assert web["node"].startswith(said[1]) and web["node"] != kept_node, (web, said[1])
    finally:
        _all_down(rc)
