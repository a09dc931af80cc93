"""The runtime's own copy of a container engine's output, on real podman and docker."""

from __future__ import annotations

from typing import TYPE_CHECKING

from containers.conftest import STANDIN, Engine, write

if TYPE_CHECKING:
    from conftest import Reconcile

CAP = 65536  # node.yaml's logMaxBytes here
BULK = 2_000_000  # bytes the engine writes before it serves: 30 times the cap
LINE = "0123456789" * 7
# The stand-in, saying BULK bytes of lines, then `written`, before it serves.
CHATTY = [
    *STANDIN[:3],
    STANDIN[3].replace(
        "; /bin/busybox httpd",
        f"; /bin/busybox yes {LINE} | /bin/busybox head -c {BULK}; echo; echo written"
        "; /bin/busybox httpd",
    ),
]


def test_the_runtimes_own_log_of_a_container_is_capped_as_reconciles_is(
    rc: Reconcile, engine: Engine
) -> None:
    """Both runtimes keep a file of a container's output for its whole life (podman's
    k8s-file, docker's json-file), unbounded by default: a talkative engine filled the
    disk through it while reconcile's own log rotated at logMaxBytes. It is capped there
    too now (`--log-opt max-size`)."""
    rc.state.mkdir()
    (rc.state / "node.yaml").write_text(f"logMaxBytes: {CAP}\n")
    write(rc, engine, "chatty", command=CHATTY)
    rc.converge()
    record = rc.record("chatty")
    assert record is not None and record["phase"] == "Ready", record
    cid = record["container"]["id"]

    def said() -> str | None:
        text = engine.cli("logs", cid)
        return text if "written" in text else None

    kept = rc.wait_for(said, timeout=60, what="the runtime's log to say `written`")
    assert len(kept) <= CAP, f"{engine.name} kept {len(kept)} bytes of the engine's {BULK}"
    rc.down()
