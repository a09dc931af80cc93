"""A volume's host folder, on podman and docker alike (DESIGN.md "Engines in containers").

podman refused a missing one, docker made it (empty and root's) and ran the engine on an
empty folder: the same manifest behaved one way per runtime. Now neither is asked: the
pass leaves the deployment Pending, naming the manifest's file, line and field, and
starts it once the folder is there (Kubernetes' ``hostPath`` of ``type: Directory``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from containers.conftest import Engine, write

if TYPE_CHECKING:
    from conftest import Reconcile


def test_a_missing_volume_folder_is_pending_with_its_line_until_it_is_made(
    rc: Reconcile, engine: Engine, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-models"
    volumes = [f"{tmp_path}:/data:ro", f"{missing}:/models:ro"]
    manifest = write(rc, engine, "mounted", container={"volumes": volumes})
    lines = manifest.read_text().splitlines()
    line = 1 + next(i for i, text in enumerate(lines) if str(missing) in text)
    done = rc.once(check=1)
    said = (
        f"{manifest}:{line}: spec.container.volumes[1]: {missing} does not exist on this "
        "node: create it (reconcile creates no volume's folder), or fix the path"
    )
    assert said in done.err, done.err
    record = rc.record("mounted")
    assert record is not None and record["phase"] == "Pending", record
    assert said in record["message"] and record["ref"] is None, record
    assert not missing.exists() and engine.ours(rc.state) == []
    described = rc("describe", "mounted", check=0)
    assert said in described.out, described.out
    missing.mkdir()  # the next move: the folder made, the next pass starts it
    rc.converge()
    record = rc.record("mounted")
    assert record is not None and record["phase"] == "Ready", record
    rc.down()
