"""A port a deployment wants that a container publishes on the host.

The process holding a published port is the runtime's proxy (podman's conmon or
rootlessport, docker-proxy), so "port N is in use by pid 123 (/usr/bin/conmon --api-version
1 -c 7c73…)" named a process nobody started by hand; the container is what to stop.
"""

from __future__ import annotations

import re
import uuid
from typing import TYPE_CHECKING

from containers.conftest import Engine
from procs import bindable, wait_for

if TYPE_CHECKING:
    from conftest import Reconcile


def test_a_port_a_podman_container_publishes_names_the_container(
    reconcile: Reconcile, podman: Engine
) -> None:
    reconcile.env.update(podman.env)
    port, name = reconcile.port, f"reconcile-test-publish-{uuid.uuid4().hex[:8]}"
    sleeper = ["/bin/busybox", "sleep", "600"]
    podman.cli("run", "-d", "--rm", "--name", name, "-p", f"127.0.0.1:{port}:8080",
               podman.image, *sleeper)  # fmt: skip
    try:
        wait_for(lambda: not bindable(port), what="the published port held")
        reconcile.write("web", port=port, basePort=None)
        reconcile.once(check=1)
        message = reconcile.status()["web"]["message"]
        said = f"port {port} is in use by podman container {name} (published by pid "
        assert message.startswith(said), message
        # rootful podman's conmon holds it, rootless podman's rootlessport
        proxy = r"\(published by pid \d+, (conmon|rootlessport)\): free it or choose another port"
        assert re.search(proxy, message), message
    finally:
        podman.cli("rm", "-f", "-t", "0", name, check=False)
    wait_for(lambda: bindable(port), timeout=30, what="the published port let go")
    reconcile.converge()
    assert reconcile.status()["web"]["port"] == port
    reconcile.down()
