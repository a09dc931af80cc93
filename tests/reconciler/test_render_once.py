"""One start renders its spec once, and a pass opens one record store for its state dir.

The reservation's record keeps the probe, deadline and grace of the rendering the
engine is then spawned with: rendering twice could give the two different answers.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from procs import alive, kill_marked

from controller.backends.choose import inventory_for, open_backend
from controller.core.actions import Start
from controller.core.state import Phase
from controller.reconciler import leases
from controller.reconciler.run import Reconciler
from controller.store.config.node import Config
from controller.store.instances import records
from controller.store.sources.manifests import load

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def _config(tmp_path: Path) -> Config:
    """A node of its own whose one manifest runs a sleeper (no devices asked)."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    doc = {
        "apiVersion": "reconcile/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"engine": "command", "command": SLEEP, "stopGracePeriodSeconds": 1},
    }
    (manifests / "web.yaml").write_text(yaml.safe_dump(doc))
    node = f"t-{uuid.uuid4().hex[:12]}"
    return Config(
        manifests=(manifests,),
        state_dir=tmp_path / "state",
        node=node,
        devices="nvidia:0",
        owner="render-once-test",
    )


def test_a_start_renders_once_and_the_pass_shares_one_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path)
    rendered: list[str] = []
    real_render = leases.render

    def counting(entry: Any, **kwargs: Any) -> Any:
        rendered.append(entry.name)
        return real_render(entry, **kwargs)

    monkeypatch.setattr(leases, "render", counting)
    opened: list[Path] = []
    real_init = records.RecordStore.__init__

    def counting_init(self: records.RecordStore, state_dir: Path) -> None:
        opened.append(state_dir)
        real_init(self, state_dir)

    monkeypatch.setattr(records.RecordStore, "__init__", counting_init)

    store = records.RecordStore(config.state_dir)
    reconciler = Reconciler(config, open_backend(config, store), inventory_for(config), store=store)
    try:
        result = reconciler.run_pass()
        assert result.records["web"].phase in (Phase.STARTING, Phase.READY)
        assert rendered == ["web"]  # the reservation's rendering is the one spawned
        assert opened == [config.state_dir]  # the pass, its executor and the backend: one
        run_dir = store.runtime_dir("web")
        assert run_dir == config.state_dir / "run" / "web" and run_dir.is_dir()
    finally:
        reconciler.down()
        kill_marked(f"{config.node}/")


def test_a_start_applied_alone_reserves_and_spawns_as_a_pass_does(tmp_path: Path) -> None:
    """``Executor.apply(Start)`` takes the lease under the placement lock and spawns the
    engine: the one path a pass's starts take too (apply once raised TypeError for a
    Start, and a pass went round it). A start another pass placed meanwhile is skipped."""
    config = _config(tmp_path)
    store = records.RecordStore(config.state_dir)
    reconciler = Reconciler(config, open_backend(config, store), inventory_for(config), store=store)
    try:
        store.ensure()
        desired = reconciler.desired(load(config.manifests, backend=config.backend))
        observed, _ = reconciler.observe()
        (start,) = [a for a in reconciler.plan(desired, observed) if isinstance(a, Start)]
        assert reconciler.executor.apply(start)
        rec = store.read("web")
        assert rec is not None and rec.phase in (Phase.STARTING, Phase.READY), rec
        assert rec.ref is not None and alive(rec.ref.pid) and rec.port is not None
        assert not reconciler.executor.apply(start)  # placed already: nothing changes
        again = store.read("web")
        assert again is not None and again.nonce == rec.nonce
    finally:
        reconciler.down()
        kill_marked(f"{config.node}/")
