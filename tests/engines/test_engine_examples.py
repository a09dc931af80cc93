"""The annotated manifests in examples/engines/: they validate, say what they run, and
keep secrets out of the manifest as README "Secrets" asks.

Found in a trial: llama-cpp.yaml's "Runs:" line left out the `--metrics` the recipe
passes, and tgi.yaml taught `env: {HF_TOKEN: ...}`, a token in the clear that
`describe` and `export` then print.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from controller.core.devices.inventory import Device
from controller.core.manifest.specs import Deployment, Entry
from controller.core.render import render
from tests.conftest import Reconcile

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "engines"
FILES = sorted(EXAMPLES.glob("*.yaml"))
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY", re.IGNORECASE)


def test_every_engine_example_validates(reconcile: Reconcile) -> None:
    result = reconcile("validate", "-f", str(EXAMPLES), check=0)
    assert f"{len(FILES)} deployment(s) in {len(FILES)} file(s): valid" in result.out, result


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_no_example_puts_a_secret_in_env(path: Path) -> None:
    env = yaml.safe_load(path.read_text())["spec"].get("env", {})
    assert not [name for name in env if SECRET_NAME.search(name)], "use spec.envFrom"


def _runs_comment(text: str) -> str:
    """The example's "# Runs: ..." comment with its continuation lines."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# Runs:"))
    block = [lines[start]]
    block += [ln for ln in lines[start + 1 :] if ln.startswith("#       ")][:3]
    return " ".join(block)


@pytest.mark.parametrize("path", [p for p in FILES if p.stem != "command"], ids=lambda p: p.stem)
def test_the_runs_comment_names_every_flag_the_recipe_passes(path: Path) -> None:
    deployment = Deployment.model_validate(yaml.safe_load(path.read_text()))
    spec = deployment.spec
    devices = tuple(Device(kind="nvidia", id=str(i)) for i in range(spec.devices.count))
    extra = tuple(range(29500, 29503))
    argv = render(Entry(deployment, "", 0, ""), devices=devices, port=8000, extra_ports=extra)
    recipe_flags = {a for a in argv.argv[: len(argv.argv) - len(spec.args)] if a[:1] == "-"}
    comment = _runs_comment(path.read_text())
    assert not [f for f in sorted(recipe_flags) if f" {f} " not in f"{comment} "], comment
