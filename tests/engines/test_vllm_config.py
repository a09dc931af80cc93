"""vLLM's ``--config FILE``: a YAML file of flags, read when the manifest is.

vLLM puts the file's flags after ``serve MODEL`` and before the rest of the command
line, so a ``port`` there was silently beaten by the recipe's, and a
``served-model-name`` or ``api-key`` there was never seen by the recipe, whose readiness
probe then asked ``/v1/models`` for the wrong id (or behind the key) until the deadline,
while `validate` said the manifest was fine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.store.sources.manifests import LoadResult
from tests.engines.sidefile import load_beside


def write(
    tmp_path: Path, flags: str | None, args: list[str], backend: str = "local", **spec: object
) -> LoadResult:
    """A vLLM manifest giving ``args`` (``{flags}``: the flags file, written when given)."""
    side = ("flags.yaml", "{flags}", flags)
    return load_beside(tmp_path, ("vllm", "org/m"), side, args, backend, **spec)


CONFIG = ["--max-num-seqs", "8", "--config", "{flags}"]
ARGS_LINE = 11  # the manifest's line of `- --config` (safe_dump: `args:` is line 8)


@pytest.mark.parametrize(
    ("flags", "line", "key", "move"),
    [
        ("max-model-len: 8192\nserved_model_name: chat\n", 2, "served_model_name", "move it to"),
        ("api-key: secret-value\n", 1, "api-key", "move it to spec.args"),
        ("enforce-eager: true\nport: 9000\n", 2, "port", "remove it from the file"),
        ("host: 0.0.0.0\n", 1, "host", "remove it from the file"),
    ],
    ids=["served-model-name", "api-key", "port", "host"],
)
def test_a_config_file_that_sets_what_reconcile_sets_or_reads_is_refused(
    tmp_path: Path, flags: str, line: int, key: str, move: str
) -> None:
    loaded = write(tmp_path, flags, CONFIG)
    assert "chat" not in loaded.entries
    (error,) = loaded.errors
    text = str(error)
    assert f"chat.yaml:{ARGS_LINE}: spec.args:" in text, text
    assert f"{tmp_path / 'flags.yaml'}:{line} sets {key}, which " in text, text
    assert text.endswith(move) or f": {move}" in text, text
    assert "secret-value" not in text  # a value of the file is never printed


def test_a_config_file_of_the_users_own_flags_is_fine(tmp_path: Path) -> None:
    loaded = write(tmp_path, "max-model-len: 8192\nenforce-eager: true\n", ["--config={flags}"])
    assert loaded.errors == [] and "chat" in loaded.entries


@pytest.mark.parametrize(
    ("flags", "args", "said"),
    [
        (None, CONFIG, "which reconcile cannot read"),
        ("- port\n", CONFIG, "which is no mapping of flags"),
        ("port: [\n", CONFIG, "which is no YAML"),
        ("port: 1\n", ["--config", "flags.yaml"], "a relative path"),
    ],
    ids=["missing", "a-list", "no-yaml", "relative"],
)
def test_a_config_file_reconcile_cannot_check_is_said(
    tmp_path: Path, flags: str | None, args: list[str], said: str
) -> None:
    loaded = write(tmp_path, flags, args)
    (error,) = loaded.errors
    assert said in str(error) and "spec.args" in str(error), error


def test_a_containers_config_is_read_through_its_bind_mount(tmp_path: Path) -> None:
    bound = {"volumes": [f"{tmp_path}:/etc/vllm:ro"]}
    loaded = write(tmp_path, "port: 9000\n", ["--config", "/etc/vllm/flags.yaml"], container=bound)
    (error,) = loaded.errors
    assert "/etc/vllm/flags.yaml:1 sets port" in str(error), error
    # A path the image holds: only the engine can read it, and nothing is refused.
    in_image = ["--config", "/opt/flags.yaml"]
    assert write(tmp_path / "x", None, in_image, container={}).errors == []


def test_a_path_the_render_fills_in_is_the_engines_to_read(tmp_path: Path) -> None:
    assert write(tmp_path, None, ["--config", "/etc/vllm/{name}.yaml"]).errors == []


def test_on_a_cluster_the_file_is_the_engines_nodes(tmp_path: Path) -> None:
    """The head reads no file a worker node holds: nothing is refused there."""
    assert write(tmp_path, None, CONFIG, backend="ray").errors == []
