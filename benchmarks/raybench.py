"""9. The ray backend next to the local one, in one run (same engine, same reconciler).

A local Ray cluster on this box (a head and GPU-less-box "nodes" with fake GPUs,
``ray.cluster_utils``): manifest -> every engine answering, for 1 and for N
deployments; a no-op pass with N Ready deployments; a node loss -> Ready elsewhere.
Passes run in this process (``Reconciler.run_pass``), so what is timed is the pass,
not interpreter start-up (the start-up section times that).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Row, median

MB = 1 << 20
NODES = 4
ENGINE = [sys.executable, "-m", "controller.demo.engine", "--port", "{port}", "--host", "{host}"]


def _manifest(folder: Path, names: list[str], gpus: int) -> None:
    for name in names:
        (folder / f"{name}.yaml").write_text(
            "apiVersion: reconcile/v1\nkind: Deployment\n"
            f"metadata: {{name: {name}}}\nspec:\n  engine: command\n"
            f"  command: {ENGINE!r}\n".replace("'", '"')
            + f"  devices: {{count: {gpus}, kind: nvidia}}\n  basePort: 21000\n"
            "  readiness: {httpGet: {path: /health}, periodSeconds: 0.1}\n"
            "  stopGracePeriodSeconds: 2\n"
        )


def _reconciler(root: Path, backend: str, address: str | None, names: list[str], gpus: int) -> Any:
    from controller.backends.choose import inventory_for, open_backend
    from controller.reconciler.run import Reconciler
    from controller.store.config.node import resolve

    folder = root / backend / "manifests"
    folder.mkdir(parents=True)
    _manifest(folder, names, gpus)
    cfg = resolve(
        manifests=[str(folder)],
        state_dir=str(root / backend / "state"),
        node="bench",
        devices=",".join(f"nvidia:{i}" for i in range(len(names))),
        backend=backend,
        ray_address=address,
    )
    return Reconciler(cfg, open_backend(cfg), inventory_for(cfg))


SECTION = "9. ray backend"
READY_TIMEOUT = 180.0


def _until_ready(rec: Any, timeout: float = READY_TIMEOUT) -> float:
    started = time.monotonic()
    while not rec.run_pass().all_ready:
        if time.monotonic() - started > timeout:
            raise TimeoutError("not all Ready")
        time.sleep(0.05)
    return time.monotonic() - started


def bench(n: int, passes: int) -> list[Row]:
    import ray
    from ray.cluster_utils import Cluster

    head = {"num_cpus": 1, "num_gpus": 0, "object_store_memory": 80 * MB}
    head |= {"include_dashboard": False}
    head["_system_config"] = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    root = Path(tempfile.mkdtemp(prefix="raybench-"))
    rows: list[Row] = []
    started: list[Any] = []  # reconcilers whose engines are up: taken down even on failure
    try:
        per_node = -(-n // NODES)  # a raylet per node is heavy on 2 cores: few, wide nodes
        for _ in range(NODES + 1):  # one node spare: room for the node-loss move
            cluster.add_node(num_cpus=1, num_gpus=per_node, object_store_memory=80 * MB)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        for count in (1, n):
            names = [f"d{i}" for i in range(count)]
            tag = root / str(count)
            ray_rec = _reconciler(tag, "ray", cluster.address, names, 1)
            local_rec = _reconciler(tag, "local", None, names, 1)
            started += [ray_rec, local_rec]
            ours, theirs = [_until_ready(ray_rec)], [_until_ready(local_rec)]
            rows.append(
                Row(
                    section=SECTION,
                    metric=f"manifest -> {count} engine(s) answering",
                    unit="s",
                    ours=ours,
                    theirs=theirs,
                    alt="local backend",
                    goal="≤ local + 1 s" if count == 1 else "",
                    met=(ours[0] <= theirs[0] + 1.0) if count == 1 else None,
                )
            )
            if count == n:
                ray_ms = [_timed(ray_rec.run_pass) for _ in range(passes)]
                local_ms = [_timed(local_rec.run_pass) for _ in range(passes)]
                rows.append(
                    Row(
                        section=SECTION,
                        metric=f"no-op pass, {n} Ready deployments",
                        unit="ms",
                        ours=ray_ms,
                        theirs=local_ms,
                        alt="local backend",
                        goal="≤ 3x",
                        met=median(ray_ms) <= 3 * median(local_ms),
                    )
                )
            rows += _node_loss(cluster, ray_rec) if count == 1 else []
            while started:  # the next count starts on free GPUs
                started.pop().down()
    finally:
        for rec in started:  # engines and actors go before their state folder does
            rec.down()
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    return rows


def _node_loss(cluster: Any, rec: Any) -> list[Row]:
    before = rec.store.read("d0")
    node = next(x for x in cluster.worker_nodes if x.node_id == before.node)
    started = time.monotonic()
    cluster.remove_node(node)
    while True:
        rec.run_pass()
        now = rec.store.read("d0")
        if now.node != before.node and str(now.phase) == "Ready":
            break
        if time.monotonic() - started > READY_TIMEOUT:
            raise TimeoutError("d0 not Ready on another node")
        time.sleep(0.2)
    took = time.monotonic() - started
    return [
        Row(
            section=SECTION,
            metric="node lost -> Ready on another node",
            unit="s",
            ours=[took],
            note="Ray's health check: 1 s period, 3 misses (test settings)",
        )
    ]


def _timed(fn: Any) -> float:
    t = time.monotonic()
    fn()
    return (time.monotonic() - t) * 1000
