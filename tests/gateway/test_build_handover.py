"""An upgrade from a source checkout: other code, the same version string.

`git pull` (or `pip install .` of a newer checkout) changes the code and not
``__version__``; the restarted daemon adopted the old gateway process, whose code then
served on until a `reconcile gateway restart`. The older build here is a copy of the
package with one module edited, as a checkout a commit behind would be.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import controller

WAIT = 60.0


def _older_build(tmp: Path) -> Path:
    """A copy of the package whose gateway module differs by a line: its PYTHONPATH."""
    root = tmp / "older"
    package = Path(controller.__file__).parent
    shutil.copytree(package, root / "controller")  # its bytecode too: no compile of it all
    with open(root / "controller" / "gateway" / "__init__.py", "a") as module:
        module.write("# a commit behind\n")
    return root


def test_a_daemon_of_other_code_at_the_same_version_takes_the_gateway_over(
    reconcile: Any, gateway: Any
) -> None:
    reconcile.write("web")
    older = {**reconcile.env, "PYTHONPATH": str(_older_build(reconcile.tmp))}
    before = gateway(env=older, prefix=["env"])  # cold: the older build's daemon
    before.wait_phase("web", "Ready")
    (engine,) = reconcile.pids("web")
    old = before.serving()
    assert before.post("web").status == 200
    assert before.stop() == 0  # the service stopped for the upgrade: its gateway serves on

    after = gateway(port=before.port)

    def handed_over() -> bool:
        now = after.serving_or_none()
        return now is not None and now.ref.pid != old.ref.pid

    reconcile.wait_for(handed_over, timeout=WAIT, what="a hand-over")
    assert '"event": "gateway adopted"' not in after.text(), after.text()[-3000:]
    reconcile.wait_for(lambda: not old.alive(), timeout=WAIT, what="the old gateway's exit")
    assert after.post("web").status == 200
    assert reconcile.pids("web") == {engine}  # the engine adopted, not restarted
    after.finish()
