"""Which runtime runs a container where podman and docker are both installed."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from containers.conftest import STANDIN, Engine, after_pulls

if TYPE_CHECKING:
    from conftest import Reconcile


def test_an_image_only_docker_holds_names_docker_when_podman_was_the_default(
    reconcile: Reconcile, podman: Engine, docker: Engine
) -> None:
    """No runtime named, podman (on PATH) is the default; an image built with docker is
    not in podman's images. It was said "not on this node" (with `podman pull` as the
    next move), and under IfNotPresent its pull failed with "check spec.container.image":
    each message names docker, which holds it, and what to set."""
    rc = reconcile
    rc.env.update({**podman.env, **docker.env})
    image = docker.build(f"localhost/reconcile-test/docker-only:{uuid.uuid4().hex[:10]}")
    rc.write("built", command=STANDIN, container={"image": image, "pullPolicy": "Never"})
    rc.once(check=1)
    record = rc.record("built")
    assert record is not None and record["phase"] == "Pending", record
    said = record["message"]
    assert "docker has it" in said and "spec.container.runtime: docker" in said, said
    assert "not on this node" not in said, said
    (rc.manifests / "built.yaml").unlink()
    rc.write("pulled", command=STANDIN, container={"image": image})  # IfNotPresent: a tag
    rc.once(check=0)  # its pull starts
    after_pulls(rc)  # and fails: no registry serves localhost's images
    rc.once(check=0)  # read: a BackOff, as any failed pull
    record = rc.record("pulled")
    assert record is not None, rc.events("pulled")
    said = record["message"]
    assert "cannot pull image" in said and "spec.container.runtime: docker" in said, said
    assert podman.ours(rc.state) == docker.ours(rc.state) == []
    rc.down()
