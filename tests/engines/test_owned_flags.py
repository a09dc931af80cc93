"""spec.args and spec.env may not set again what a recipe sets itself.

The user's args come after the recipe's flags and the engine keeps the last one, so
``args: [--port, "9000"]`` used to move a llama-server off the port reconcile probed:
`validate` and `plan` said all was well and the engine failed its readiness deadline
with "connection refused". Now the manifest is invalid, naming the field to use.
"""

from __future__ import annotations

import pytest

from controller.backends.local.runtime import (
    MARKER,
    OWNER_MARKER,
    STATE_ID_MARKER,
    STATE_MARKER,
)
from controller.core.devices.inventory import Device
from controller.core.engines import RecipeError, recipe_for
from controller.core.manifest.engineenv import RECONCILE_SETS
from controller.core.manifest.specs import Deployment, Entry
from controller.core.render import render
from tests.conftest import Reconcile, dump_yaml
from tests.engines.test_recipes import GGUF, ctx


def manifest(name: str, **spec: object) -> dict[str, object]:
    return {
        "apiVersion": "reconcile/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": spec,
    }


def test_validate_refuses_args_and_env_that_move_the_engine(reconcile: Reconcile) -> None:
    reconcile.write_text(
        "clash.yaml",
        dump_yaml(
            manifest("gguf", engine="llama-cpp", model=GGUF, args=["--port", "9000"]),
            manifest("hf", engine="vllm", model="org/m", args=["--host=0.0.0.0"]),
            manifest("tgi", engine="tgi", model="org/m", args=["-p", "9000"]),
            manifest("olla", engine="ollama", env={"OLLAMA_HOST": "0.0.0.0:11434"}),
            manifest("fine", engine="llama-cpp", model=GGUF, args=["-ngl", "20"]),
        ),
    )
    result = reconcile("validate", check=1)
    lines = result.err.splitlines()
    port = "spec.args sets --port, which engine 'llama-cpp' sets itself from spec.port or "
    assert any(port in line and "remove it from spec.args" in line for line in lines), result
    assert any("spec.args sets --host, which engine 'vllm'" in line for line in lines), result
    assert any("spec.args sets -p, which engine 'tgi'" in line for line in lines), result
    assert any(
        "spec.env sets OLLAMA_HOST, which engine 'ollama' sets itself from spec.host" in line
        for line in lines
    ), result
    assert not any("fine" in line for line in lines), result  # -ngl is the user's to set
    assert "Traceback" not in result.err


OWNED = {
    "vllm": ["--host", "--port"],
    "llama-cpp": ["--host", "--port", "-m", "--model"],
    "sglang": ["--host", "--port", "--model-path", "--model", "--nccl-port"],
    "tgi": [
        *("--hostname", "--port", "-p", "--model-id"),
        *("--master-port", "--prometheus-port", "--shard-uds-path"),
    ],
}


@pytest.mark.parametrize(("engine", "flag"), [(e, f) for e, flags in OWNED.items() for f in flags])
def test_each_recipe_refuses_its_own_flags_in_args(engine: str, flag: str) -> None:
    for args in ((flag, "x"), (f"{flag}=x",)):
        with pytest.raises(RecipeError, match=f"spec.args sets {flag}, which engine"):
            recipe_for(engine).launch(ctx(model=GGUF, args=args))


def test_a_flag_that_only_begins_like_an_owned_one_passes() -> None:
    """`--port-range`-like flags and llama.cpp's `--model-url` are not `--port`/`--model`."""
    launch = recipe_for("llama-cpp").launch(ctx(model=GGUF, args=("--model-url", "u")))
    assert launch.argv[-2:] == ("--model-url", "u")


@pytest.mark.parametrize(
    ("engine", "written", "flag"),
    [
        ("vllm", "--por", "--port"),
        ("vllm", "--ho", "--host"),
        ("sglang", "--model-pa", "--model-path"),
        ("sglang", "--nccl-p", "--nccl-port"),
    ],
)
def test_a_beginning_of_an_owned_flag_is_refused_where_argparse_reads_it(
    engine: str, written: str, flag: str
) -> None:
    """vLLM's and SGLang's parsers (argparse, ``allow_abbrev``) take ``--por 9000`` for
    ``--port 9000``: it got past the refusal and moved the engine off its port."""
    for args in ((written, "9000"), (f"{written}=9000",)):
        with pytest.raises(RecipeError, match=f"spec.args sets {written} \\(read as {flag}"):
            recipe_for(engine).launch(ctx(model=GGUF, args=args))


def test_a_beginning_is_no_flag_of_its_own_for_llama_cpp_and_tgi() -> None:
    """llama.cpp's and TGI's parsers take whole flags only: ``--po`` is not refused."""
    launch = recipe_for("llama-cpp").launch(ctx(model=GGUF, args=("--po", "x")))
    assert launch.argv[-2:] == ("--po", "x")


@pytest.mark.parametrize(
    "devices",
    [
        (),
        (Device(kind="nvidia", id="0"), Device(kind="nvidia", id="1")),
        (Device(kind="amd", id="0"),),
    ],
    ids=["none", "nvidia", "amd"],
)
def test_every_variable_reconcile_sets_is_refused_in_spec_env(devices: tuple[Device, ...]) -> None:
    """What the render and the backends' marker set over spec.env is exactly what
    validation refuses there (engineenv.RECONCILE_SETS): a variable added to the engine's
    environment later cannot be silently replaced again."""
    spec = {"engine": "command", "command": ["true"], "env": {"HF_HOME": "/data/hf"}}
    entry = Entry(Deployment.model_validate(manifest("web", **spec)), "", 0, "")
    rendered = render(entry, devices=devices, port=8000)
    ours = set(rendered.env) - {"HF_HOME"}
    assert ours and ours <= set(RECONCILE_SETS), ours - set(RECONCILE_SETS)
    assert {MARKER, STATE_MARKER, STATE_ID_MARKER, OWNER_MARKER} <= set(RECONCILE_SETS)
