"""Image pulls as a declared step, from a real registry on loopback (``docker-registry``):
by tag, by digest, a wrong digest, a registry that is down; on podman and docker.

The stand-in image is pushed once per session; each test removes what it pulled.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from containers.conftest import (
    REGISTRY_CONF,
    Engine,
    Registry,
    after_pulls,
    forget_pulled,
    mistaken,
    write,
)
from disks import tmpfs
from missing import skip
from procs import bindable, free_ports, wait_for

from controller.backends.local.container import PullJob
from controller.host.containers import LOOKS, Runtime

if TYPE_CHECKING:
    from conftest import Reconcile, Result


@pytest.fixture
def pulling(rc: Reconcile, engine: Engine, registry: Registry) -> Iterator[Reconcile]:
    """``rc`` with the registry reachable; every image of the registry pulled is removed."""
    rc.env["CONTAINERS_REGISTRIES_CONF"] = str(registry.registries_conf)
    forget_pulled(engine, registry)
    yield rc
    forget_pulled(engine, registry)


def until_message(rc: Reconcile, name: str, text: str) -> dict[str, Any]:
    """Passes until the record's message says ``text`` (a pull ends between passes)."""

    def said() -> dict[str, Any] | None:
        rc.once(check=None)
        record = rc.record(name)
        if record is not None and text in record["message"]:
            return record
        after_pulls(rc)
        return None

    found: dict[str, Any] = wait_for(said, timeout=90, what=f"{name!r} saying {text!r}")
    return found


def until_ready(rc: Reconcile, name: str, what: str) -> dict[str, Any]:
    """Passes until ``name`` is Ready (another deployment's pull or back-off beside it)."""

    def ready() -> dict[str, Any] | None:
        rc.once(check=None)
        record = rc.record(name)
        return record if record is not None and record["phase"] == "Ready" else None

    found: dict[str, Any] = wait_for(ready, timeout=60, what=what)
    return found


def until_restart(rc: Reconcile, name: str, count: int) -> dict[str, Any]:
    """Passes until ``name`` backs off after its ``count``-th retry's pull failed too (the
    retry counts as the restart it is)."""

    def failed_again() -> dict[str, Any] | None:
        rc.once(check=None)
        rec = rc.record(name)
        backing_off = rec is not None and rec["phase"] == "BackOff"
        if backing_off and rec["restarts"] >= count:
            return rec
        if backing_off:  # what the retry does is checked here, not the back-off's length
            rc.end_backoff(name)
        else:
            after_pulls(rc)
        return None

    found: dict[str, Any] = wait_for(failed_again, timeout=90, what=f"{name}'s retry {count}")
    assert "cannot pull image" in found["message"], found
    return found


@pytest.mark.parametrize("by", ["tag", "digest"])
def test_an_image_is_pulled_first_holding_nothing_then_runs(
    pulling: Reconcile, engine: Engine, registry: Registry, by: str
) -> None:
    rc = pulling
    image = registry.tagged
    if by == "digest":
        image = f"{registry.address}/reconcile-test/engine@{registry.digest}"
    write(rc, engine, "pulled", container={"image": image})
    rc.once(check=None)
    # One pass, one start waiting for the pull: its rounds do not start it again and again
    # (a podman pull journalled five a pass, each a start line in the engine's log).
    waits = [e for e in rc.events("pulled") if e.get("outcome") == "pulling"]
    assert len(waits) == 1, waits
    first = rc.record("pulled")
    # A small image may be pulled before the pass's next round: then it is Starting.
    assert first is not None and first["phase"] in ("Pulling", "Starting", "Ready"), first
    if first["phase"] == "Pulling":  # holding nothing while the pull runs
        assert first["port"] is None and first["devices"] == [], first
        assert f"pulling image {image}" in first["message"]
    rc.converge(timeout="60s")
    record = rc.record("pulled")
    assert record is not None and record["phase"] == "Ready", record
    assert record["container"]["image"] == image
    assert record["container"]["digest"] == registry.digest
    events = rc.events("pulled")
    outcomes = [e.get("outcome") for e in events]
    assert "pulling" in outcomes, outcomes
    # The pull's end is an event with the digest, and describe shows it.
    [done] = [e for e in events if e.get("outcome") == "pulled"]
    assert done["digest"] == registry.digest and done["image"] == image, done
    described = rc("describe", "pulled", check=0).out
    assert f"image {image} pulled: {registry.digest}" in described, described
    rc.down()


def test_a_wrong_digest_is_named_with_the_runtimes_words(
    pulling: Reconcile, engine: Engine, registry: Registry
) -> None:
    rc = pulling
    image = f"{registry.address}/reconcile-test/engine@sha256:{'0' * 64}"
    write(rc, engine, "wrong", container={"image": image})
    record = until_message(rc, "wrong", "cannot pull image")
    assert record["phase"] in ("BackOff", "Pending"), record
    assert image in record["message"] and "manifest unknown" in record["message"].lower()
    # The runtime's words name no next move; and no probe was ever decided for it.
    move = f"check spec.container.image (`{engine.name} images` lists this node's)"
    assert move in record["message"], record["message"]
    described = rc("describe", "wrong", check=0).out
    assert "Readiness:    -\n" in described and "Liveness:     -\n" in described, described
    assert engine.ours(rc.state) == []
    rc.down()


def test_a_registry_that_is_down_is_named_and_retried(
    pulling: Reconcile, engine: Engine, registry: Registry
) -> None:
    rc = pulling
    host, port = registry.address.split(":")
    image = f"{host}:{int(port) + 1}/reconcile-test/engine:1"  # nothing listens there
    write(rc, engine, "down", container={"image": image})
    record = until_message(rc, "down", "cannot pull image")
    assert image in record["message"] and "connection refused" in record["message"].lower()
    assert record["phase"] == "BackOff" and record["backoff_until"] is not None, record
    assert engine.ours(rc.state) == []
    # Its retry (a restart, by way of a new pull) fails too: the count goes on through the
    # pull, so it is a crash loop `--once` exits 1 on, as a process's failing start is.
    # Its back-off ended now (its length is tests/core's): passes from then.
    rc.end_backoff("down")
    looped = wait_for(
        lambda: (done := rc.once(check=None)).code == 1 and "crash-looping" in done.err and done,
        timeout=60,
        what="the failing pull counted as a crash loop",
    )
    assert f"down is crash-looping (cannot pull image {image}" in looped.err, looped
    assert rc.record("down")["restarts"] >= 1
    rc.down()


def test_pull_policy_always_runs_only_what_it_pulled(
    pulling: Reconcile, engine: Engine, registry: Registry
) -> None:
    """``pullPolicy: Always`` and a registry that is down, the image's tag on the node
    from before: the pull fails and nothing runs (Kubernetes' ErrImagePull), in the
    runtime's words. The pull's end was judged by the image being there, so a `pull`
    event said "pulled" with the old copy's digest and that copy ran."""
    rc = pulling
    host, port = registry.address.split(":")
    image = f"{host}:{int(port) + 1}/reconcile-test/engine:always"  # nothing listens there
    engine.cli("tag", engine.image, image)
    try:
        write(rc, engine, "always", container={"image": image, "pullPolicy": "Always"})
        rc.once(check=None)
        job = PullJob.of(rc.state, engine.name, image)
        wait_for(lambda: not job.running(), timeout=90, what="the pull's end")
        rc.once(check=None)
        record = rc.record("always")
        assert record is not None and record["phase"] == "BackOff", record
        assert f"cannot pull image {image}" in record["message"], record
        assert "connection refused" in record["message"].lower(), record
        assert record["container"] is None and engine.ours(rc.state) == [], record
        assert [e for e in rc.events("always") if e.get("action") == "pull"] == []
        rc.down()
    finally:
        engine.cli("rmi", image, check=False)


def test_pull_policy_always_edited_in_with_the_registry_down_stops_nothing(
    pulling: Reconcile, engine: Engine, registry: Registry
) -> None:
    """A Ready engine of a tag that is on the node (IfNotPresent), its manifest edited to
    `pullPolicy: Always` while the registry is down: the new spec runs only what a pull
    brings, so the pull comes first while the engine serves, and its failure stops nothing
    (it stopped the engine, then the pull failed: nothing served)."""
    rc = pulling
    host, port = registry.address.split(":")
    image = f"{host}:{int(port) + 1}/reconcile-test/engine:edited"  # nothing listens there
    engine.cli("tag", engine.image, image)
    try:
        write(rc, engine, "edited", container={"image": image})
        rc.converge()
        old = rc.record("edited")
        assert old is not None and old["phase"] == "Ready", old
        write(rc, engine, "edited", container={"image": image, "pullPolicy": "Always"})

        def said() -> tuple[str, Result] | None:
            done = rc.once(check=None)
            kept = [e for e in rc.events("edited") if e.get("outcome") == "waiting"]
            failed = kept and "cannot pull" in kept[-1]["error"]
            if not failed:
                after_pulls(rc)
            return (kept[-1]["error"], done) if failed else None

        why, done = wait_for(said, timeout=90, what="the replacement's pull to fail")
        assert f"cannot pull image {image}" in why and "the running engine is kept" in why
        assert done.code == 1 and f"error: edited: {why}" in done.err, done
        record = rc.record("edited")
        assert record["phase"] == "Ready" and record["ref"] == old["ref"], record
        assert engine.ours(rc.state) == [old["container"]["id"]]
        rc.down()
    finally:
        engine.cli("rmi", image, check=False)


def test_an_image_the_runtime_briefly_calls_unknown_is_found(
    podman: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taken for absent, a local image was pulled and its start failed (the CI flake of
    test_podman_gets_the_leased_gpus_by_cdi...): a "not known" is looked at again before
    it counts. A missing image is still missing, after the same looks."""
    count = mistaken(podman, tmp_path, monkeypatch, "image inspect", "image not known")
    found = Runtime("podman").image(podman.image)
    assert found is not None and found[0].startswith("sha256:"), found
    assert count.read_text().strip() == "3"  # two answers of "not known", then the image
    count.unlink()
    assert Runtime("podman").image("localhost/reconcile-test/none:0") is None
    assert count.read_text().strip() == str(LOOKS)


def test_a_failed_pull_holds_no_gpu_while_it_backs_off(
    pulling: Reconcile, engine: Engine, registry: Registry
) -> None:
    """One GPU, two deployments of equal priority: `a-broken`'s image cannot be pulled
    (nothing listens at its registry). Its pull and its back-off hold no device and no
    port, so `b-good` starts on the GPU (it waited out the whole back-off, the GPU idle);
    once the back-off is over its retry pulls again, holding nothing: it never shares the
    GPU (invariant 1) and never takes it from `b-good`."""
    rc = pulling
    rc.devices = "nvidia:0"
    host, port = registry.address.split(":")
    image = f"{host}:{int(port) + 1}/reconcile-test/engine:1"  # nothing listens there
    gpu = {"devices": {"count": 1, "kind": "nvidia"}}
    write(rc, engine, "a-broken", container={"image": image}, **gpu)
    write(rc, engine, "b-good", **gpu)
    broken = until_message(rc, "a-broken", "cannot pull image")
    assert broken["phase"] == "BackOff" and broken["backoff_until"] is not None, broken
    assert broken["devices"] == [] and broken["port"] is None, broken

    good = until_ready(rc, "b-good", "b-good Ready on the GPU a-broken gave back")
    assert good["devices"] == ["nvidia:0"], good
    # The retry, once the back-off is over: its pull again, which fails again.
    again = until_restart(rc, "a-broken", 1)
    assert again["devices"] == [] and again["port"] is None, again
    kept = rc.record("b-good")
    assert kept is not None and kept["ref"] == good["ref"] and kept["phase"] == "Ready", kept
    assert engine.ours(rc.state) == [good["container"]["id"]]
    rc.down()


def test_a_rolling_update_whose_new_image_fails_keeps_the_old_one_and_holds_nothing(
    pulling: Reconcile, engine: Engine, registry: Registry
) -> None:
    """Two GPUs, a Ready engine rolled to an image that cannot be pulled: the new
    instance backs off holding nothing, the old one serves on untouched, and the GPU the
    new one would have had is free for another deployment meanwhile. Its retry pulls again,
    holding nothing, and keeps the old one too."""
    rc = pulling
    gpu = {"devices": {"count": 1, "kind": "nvidia"}, "strategy": "RollingUpdate"}
    write(rc, engine, "web", **gpu)
    rc.converge(timeout="60s")
    old = rc.record("web")
    assert old is not None and old["phase"] == "Ready" and old["devices"] == ["nvidia:0"], old
    host, port = registry.address.split(":")
    image = f"{host}:{int(port) + 1}/reconcile-test/engine:2"  # nothing listens there
    write(rc, engine, "web", container={"image": image}, **gpu)
    new = until_message(rc, "web@next", "cannot pull image")
    assert new["phase"] == "BackOff" and new["devices"] == [] and new["port"] is None, new
    write(rc, engine, "other", devices={"count": 1, "kind": "nvidia"})

    other = until_ready(rc, "other", "other Ready on the GPU web@next gave back")
    assert other["devices"] == ["nvidia:1"], other

    # The retry pulls again, holding nothing, and fails again: the old one serves on.
    again = until_restart(rc, "web@next", 1)
    assert again["devices"] == [] and again["port"] is None, again
    record = rc.record("web")
    assert record is not None and record["phase"] == "Ready" and record["ref"] == old["ref"]
    assert sorted(engine.ours(rc.state)) == sorted(
        [old["container"]["id"], other["container"]["id"]]
    )
    rc.down()


def test_a_higher_priority_start_whose_image_fails_to_pull_stops_no_healthy_engine(
    pulling: Reconcile, engine: Engine, registry: Registry
) -> None:
    """One GPU, `low` Ready on it; `high` (higher priority, the same GPU) comes with an
    image that cannot be pulled. Its pull, its back-off and its retry's pull hold nothing
    and preempt nobody: `low` serves on, the same engine throughout. Each retry stopped
    `low` (placed, preempting it, then found its image missing), a healthy engine torn
    down for a pull that failed."""
    rc = pulling
    rc.devices = "nvidia:0"
    gpu = {"devices": {"count": 1, "kind": "nvidia"}}
    write(rc, engine, "low", **gpu)
    rc.converge(timeout="60s")
    low = rc.record("low")
    assert low is not None and low["phase"] == "Ready", low
    host, port = registry.address.split(":")
    image = f"{host}:{int(port) + 1}/reconcile-test/engine:high"  # nothing listens there
    write(rc, engine, "high", container={"image": image, "pullPolicy": "Always"}, priority=5, **gpu)
    for retry in (0, 1):  # the first pull, then the retry after its back-off
        failed = until_restart(rc, "high", retry)
        assert failed["devices"] == [] and failed["port"] is None, failed
        kept = rc.record("low")
        assert kept is not None and kept["phase"] == "Ready", kept
        assert kept["ref"] == low["ref"] and kept["restarts"] == 0, kept
    assert [e for e in rc.events("low") if e.get("action") == "preempt"] == []
    assert engine.ours(rc.state) == [low["container"]["id"]]
    rc.down()


class Unanswering:
    """A registry that takes connections and never answers: a pull that runs on."""

    def __init__(self, port: int) -> None:
        self.server = socket.create_server(("127.0.0.1", port))
        self.lock = threading.Lock()
        self.closed = False
        self.taken: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn = self.server.accept()[0]
            except OSError:  # shut down: the test is over
                return
            with self.lock:
                if self.closed:
                    conn.close()
                    return
                self.taken.append(conn)

    def close(self) -> None:
        """Close every connection: the pull ends (failed) at once."""
        with self.lock:
            self.closed = True
            for conn in self.taken:
                conn.close()
        self.server.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self.server.close()
        self.thread.join(timeout=10)


def test_an_image_pull_in_progress_keeps_no_gpu_from_the_next_start(
    pulling: Reconcile, engine: Engine, registry: Registry
) -> None:
    """One GPU, two deployments of equal priority: `a-pulls` is sorted first and its
    image's pull runs on (its registry never answers). It holds nothing while it pulls,
    so `b-good` starts on the GPU meanwhile. `a-pulls` took the GPU in every pass's plan
    until its launch found the pull running, which ended the pass: `b-good` stayed
    Pending "held by a-pulls" for the whole pull."""
    rc = pulling
    rc.devices = "nvidia:0"
    gpu = {"devices": {"count": 1, "kind": "nvidia"}}
    host, port = registry.address.split(":")
    hung = Unanswering(int(port) + 1)
    image = f"{host}:{int(port) + 1}/reconcile-test/engine:slow"
    job = PullJob.of(rc.state, engine.name, image)
    try:
        write(rc, engine, "a-pulls", container={"image": image}, **gpu)
        write(rc, engine, "b-good", **gpu)

        good = until_ready(rc, "b-good", "b-good Ready while a-pulls pulls")
        assert good["devices"] == ["nvidia:0"], good
        pulls = rc.record("a-pulls")
        assert pulls is not None and pulls["phase"] == "Pulling", pulls
        assert pulls["devices"] == [] and pulls["port"] is None and job.running(), pulls
    finally:
        hung.close()
        wait_for(lambda: not job.running(), timeout=90, what="the hung pull's end")
    rc.down()


# A registry that wants a login: `htpasswd -B` for the user `reconcile` and PASSWORD.
PASSWORD = "not-a-secret"
HTPASSWD = "reconcile:$2b$04$1Nuayp/A7CRpwa/fnHYtA.YeEKo55fm2KSMk3N58NxmsdIep8jDe6\n"
AUTH = "auth:\n  htpasswd: {{realm: reconcile-test, path: {path}}}\n"


def test_a_private_registry_is_pulled_from_with_the_runtimes_own_login(
    rc: Reconcile, engine: Engine, podman: Engine, tmp_path: Path
) -> None:
    """No credentials of reconcile's own: the pull is the runtime's, with the login its
    user made (podman's auth file, docker's config). Before it, the runtime said
    "unauthorized" (or "no basic auth credentials") and nothing about logging in."""
    if shutil.which("docker-registry") is None:
        skip("docker-registry", "apt-get install docker-registry")
    port = free_ports()
    (tmp_path / "htpasswd").write_text(HTPASSWD)
    conf = REGISTRY_CONF.format(root=tmp_path / "data", port=port)
    (tmp_path / "config.yml").write_text(conf + AUTH.format(path=tmp_path / "htpasswd"))
    rc.spawn(["docker-registry", "serve", str(tmp_path / "config.yml")], start_new_session=True)
    wait_for(lambda: not bindable(port), timeout=30, what="the registry")
    address = f"127.0.0.1:{port}"
    insecure = f'[[registry]]\nlocation = "{address}"\ninsecure = true\n'
    (tmp_path / "registries.conf").write_text(insecure)
    (tmp_path / "auth.json").write_text('{"auths": {}}')  # no login yet (none of the host's)
    logins = {
        "CONTAINERS_REGISTRIES_CONF": str(tmp_path / "registries.conf"),
        "REGISTRY_AUTH_FILE": str(tmp_path / "auth.json"),  # podman's login
        "DOCKER_CONFIG": str(tmp_path / "docker"),  # docker's
    }
    rc.env.update(logins)
    image = f"{address}/reconcile-test/private:1"
    podman.cli("push", "--tls-verify=false", "--format", "v2s2", "--creds",
               f"reconcile:{PASSWORD}", podman.image, image)  # fmt: skip
    try:
        write(rc, engine, "private", container={"image": image})
        record = until_message(rc, "private", "cannot pull image")
        assert (
            f"log in as the user reconcile runs as: `{engine.name} login {address}`"
            in (record["message"])
        ), record
        login = [engine.name, "login", "-u", "reconcile", "--password-stdin", address]
        env = {**os.environ, **engine.env, **logins}
        subprocess.run(login, input=PASSWORD.encode(), env=env, check=True,
                       capture_output=True, timeout=60)  # fmt: skip
        rc.end_backoff("private")  # the retry, logged in, is what counts: not its wait
        rc.converge(timeout="90s")
        pulled = rc.record("private")
        assert pulled is not None and pulled["container"]["image"] == image, pulled
        rc.down()
    finally:
        after_pulls(rc)
        engine.cli("rmi", "-f", image, check=False)


def test_a_rolling_update_placed_after_its_image_pull_names_the_image_not_model_files(
    pulling: Reconcile, engine: Engine, registry: Registry
) -> None:
    """The new instance of a roll waits Pulling for its image, then is placed: its `roll`
    event said "model files in the cache" for a spec that names no model at all. It says
    what it waited for: the image on the node."""
    rc = pulling
    write(rc, engine, "web", strategy="RollingUpdate")
    rc.converge(timeout="60s")
    write(rc, engine, "web", strategy="RollingUpdate", container={"image": registry.tagged})
    rc.converge(timeout="60s")
    record = rc.record("web")
    assert record is not None and record["container"]["image"] == registry.tagged, record
    rolls = [e["reason"] for e in rc.events("web") if e.get("action") == "roll"]
    assert rolls and not any("model files" in why for why in rolls), rolls
    assert any(why.startswith("image on the node: ") for why in rolls), rolls
    rc.down()


def test_wait_ends_at_once_on_an_image_that_does_not_exist(
    pulling: Reconcile, engine: Engine, registry: Registry
) -> None:
    """`--once --wait` sat out its whole timeout on an image no registry has (it backed off
    and retried for good). Retrying cannot fix it: the wait ends at the first failed pull,
    exit 1, naming the deployment, the image, the runtime's words and the next move."""
    rc = pulling
    image = f"{registry.address}/reconcile-test/no-such-engine:1"
    write(rc, engine, "absent", container={"image": image})
    result = rc("--once", "--wait", "--timeout", "10m", check=1, timeout=120)
    assert "timed out" not in result.err, result.err
    said = f"cannot progress without you: absent: cannot pull image {image}: "
    assert said in result.err and "manifest unknown" in result.err.lower(), result.err
    assert "check spec.container.image" in result.err, result.err
    # at the first failure: its retry (the back-off's restart) was not waited for
    assert rc.record("absent")["restarts"] == 0, rc.record("absent")
    assert engine.ours(rc.state) == []
    rc.down()


def test_wait_ends_on_a_registry_that_is_down_after_its_first_retry(
    pulling: Reconcile, engine: Engine, registry: Registry
) -> None:
    """A registry that is down may be back in a moment: the wait lets the back-off's retry
    pull once more, and ends (exit 1) when that fails too, as a crash loop's does, not at
    its timeout."""
    rc = pulling
    host, port = registry.address.split(":")
    image = f"{host}:{int(port) + 1}/reconcile-test/engine:1"  # nothing listens there
    write(rc, engine, "down", container={"image": image})
    result = rc("--once", "--wait", "--timeout", "10m", check=1, timeout=150)
    assert "timed out" not in result.err, result.err
    said = f"cannot progress without you: down: cannot pull image {image}: "
    assert said in result.err and "connection refused" in result.err.lower(), result.err
    assert rc.record("down")["restarts"] == 1, rc.record("down")
    rc.down()


@pytest.mark.parametrize("cause", ["no such image", "registry down", "never"])
def test_wait_ends_on_a_replacement_whose_image_does_not_pull(
    pulling: Reconcile, engine: Engine, registry: Registry, cause: str
) -> None:
    """A Ready engine whose new spec's image does not pull serves on (Ready, the old
    spec), so `--once --wait` found no back-off to judge and sat out its whole timeout (a
    containers trial: 10 minutes by default). It ends as a start's failed pull ends it:
    at once where no retry can fix it (or pullPolicy Never forbids one), after the retry
    (30 s on) failed too otherwise; exit 1 naming the image and the runtime's words (or
    Never's); the engine serving on."""
    rc = pulling
    write(rc, engine, "kept")
    rc.converge()
    serving = rc.record("kept")
    host, port = registry.address.split(":")
    image, policy, said = {
        "no such image": (f"{registry.address}/reconcile-test/no-such-engine:1", "IfNotPresent",
                          "manifest unknown"),
        "registry down": (f"{host}:{int(port) + 1}/reconcile-test/engine:1",  # none listens
                          "IfNotPresent", "connection refused"),
        "never": (f"{registry.address}/reconcile-test/engine:1", "Never",
                  "is not on this node and pullpolicy is never"),
    }[cause]  # fmt: skip
    write(rc, engine, "kept", container={"image": image, "pullPolicy": policy})
    result = rc("--once", "--wait", "--timeout", "150", check=1, timeout=300)
    assert "timed out" not in result.err, result.err
    why = "cannot pull image " if policy != "Never" else "image "
    assert f"cannot progress without you: kept: {why}{image}" in result.err, result.err
    assert "the running engine is kept" in result.err and said in result.err.lower(), result.err
    if cause != "registry down":  # at once: no retry was waited for
        assert "pulling it again" not in result.err, result.err
    kept = rc.record("kept")
    assert kept["phase"] == "Ready" and kept["ref"] == serving["ref"], kept
    after_pulls(rc)
    rc.down()


def test_a_full_image_storage_is_named_with_where_and_how_to_make_room(
    reconcile: Reconcile, podman: Engine, registry: Registry, tmp_path: Path
) -> None:
    """A pull that fills the runtime's image storage (podman's, on a real 1 MB tmpfs) said
    to check spec.container.image and that its registry answers: both were fine. It names
    the storage that is full and how to make room there (a trial's finding)."""
    with tmpfs(tmp_path / "small", "1m") as small:
        conf = tmp_path / "storage.conf"
        graph, run = small / "graph", tmp_path / "run"
        conf.write_text(f'[storage]\ndriver = "vfs"\ngraphroot = "{graph}"\nrunroot = "{run}"\n')
        rc = reconcile
        rc.env.update(podman.env)
        rc.env["CONTAINERS_STORAGE_CONF"] = str(conf)
        rc.env["CONTAINERS_REGISTRIES_CONF"] = str(registry.registries_conf)
        write(rc, podman, "full", container={"image": registry.tagged})
        record = until_message(rc, "full", "cannot pull image")
        said = record["message"]
        assert "no space left on device" in said, record
        assert f"{graph} is full: free space there" in said, record
        assert "`podman image prune`" in said and "`podman system df`" in said, record
        assert "check spec.container.image" not in said, record
        assert record["port"] is None and record["devices"] == [], record
        rc.down()
        assert podman.ours(rc.state) == []


def test_an_image_built_and_pushed_here_then_pulled_shows_the_registrys_digest(
    reconcile: Reconcile, podman: Engine, registry: Registry, tmp_path: Path
) -> None:
    """podman 4.3 lists the manifest an image built here was made with as a digest of its
    name; its push compresses the layers, so the registry knows it by another, which a
    pull (pullPolicy: Always) adds beside it. The record and describe showed the first
    listed, a digest no registry knows whenever that was the image's own."""
    reconcile.env.update(podman.env)
    reconcile.env["CONTAINERS_REGISTRIES_CONF"] = str(registry.registries_conf)
    image, pushed = _built_and_pushed(podman, registry, tmp_path)
    try:
        write(reconcile, podman, "built", container={"image": image, "pullPolicy": "Always"})
        reconcile.converge(timeout="60s")
        record = reconcile.record("built")
        assert record is not None and record["container"]["digest"] == pushed, record
        described = reconcile("describe", "built", check=0).out
        assert f"image {image} pulled: {pushed}" in described, described
        reconcile.down()
    finally:
        podman.cli("rmi", "-f", image, check=False)
    assert podman.ours(reconcile.state) == []


def _built_and_pushed(podman: Engine, registry: Registry, tmp_path: Path) -> tuple[str, str]:
    """An image made here and pushed, and the registry's digest of it, which differs from
    the one it was made with and sorts after it: podman 4.3 lists an image's digests in
    their order (so found), and the case is the image's own listed first."""
    for attempt in range(40):  # each sorts first by chance: one in 2**40 never does
        image = f"{registry.address}/reconcile-test/built:{uuid.uuid4().hex[:10]}"
        podman.build(image, extra=image.encode())
        digest_file = tmp_path / f"pushed-{attempt}"
        podman.cli("push", "--tls-verify=false", "--digestfile", str(digest_file), image)
        pushed = digest_file.read_text().strip()
        made_with = podman.cli("image", "inspect", "--format", "{{.Digest}}", image).strip()
        if made_with < pushed:
            return image, pushed
        podman.cli("rmi", "-f", image, check=False)
    raise AssertionError("no image made here sorted before its registry digest")
