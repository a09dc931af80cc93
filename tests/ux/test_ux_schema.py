"""The shipped schema equals `reconcile schema`, every shipped manifest points at it (the right
relative path) and passes it, and every example folder passes `reconcile validate`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from repocli import REPO, cli

SCHEMA = REPO / "schema" / "deployment.schema.json"
SCHEMA_LINE = re.compile(r"^# yaml-language-server: \$schema=(\S+)$")
YAML_FILES = sorted(
    p
    for top in ("manifests", "examples")
    for p in (REPO / top).rglob("*")
    if p.suffix in (".yaml", ".yml")
)


def _documents(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _is_manifest(path: Path) -> bool:
    return any(isinstance(d, dict) and d.get("kind") == "Deployment" for d in _documents(path))


MANIFESTS = [p for p in YAML_FILES if _is_manifest(p)]


def test_the_shipped_schema_is_what_reconcile_schema_prints() -> None:
    printed = cli("schema")
    assert printed.returncode == 0, printed.stderr
    stale = "stale: run `reconcile schema > schema/deployment.schema.json`"
    assert printed.stdout == SCHEMA.read_text(), stale
    jsonschema.Draft202012Validator.check_schema(json.loads(SCHEMA.read_text()))


def test_there_is_something_to_check() -> None:
    assert len(MANIFESTS) >= 8 and any("gitops" in str(p) for p in MANIFESTS)


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_yaml_file_names_its_schema(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    match = SCHEMA_LINE.match(first)
    assert match, f"{path}: line 1 should be `# yaml-language-server: $schema=...`"
    target = match.group(1)
    if _is_manifest(path):
        assert (path.parent / target).resolve() == SCHEMA, f"{path}: $schema={target}"
    else:
        assert target.startswith("https://"), f"{path}: not a manifest, so a published schema"


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_manifest_passes_the_schema(path: Path) -> None:
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    for doc in _documents(path):
        errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(doc)]
        assert not errors, f"{path}: {errors}"


def test_every_manifest_folder_passes_validate() -> None:
    """Each folder is a manifest set of its own (a model may be served in two examples)."""
    folders = sorted({p.parent for p in MANIFESTS})
    for folder in folders:
        result = cli("validate", "-f", str(folder))
        assert result.returncode == 0, result.stdout + result.stderr
        files = sum(1 for p in MANIFESTS if p.parent == folder)
        assert f"{files} file(s): valid" in result.stdout, result.stdout


def test_the_schema_agrees_with_the_loader_on_numbers_and_unknown_fields() -> None:
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    doc = {
        "apiVersion": "reconcile/v1",
        "kind": "Deployment",
        "metadata": {"name": "n"},
        "spec": {"engine": "vllm", "model": "m", "args": ["--max-model-len", 8192]},
    }
    assert not list(validator.iter_errors(doc))  # YAML's 8192 is an int: both accept it
    doc["spec"]["devcies"] = {"count": 1}
    assert [e.validator for e in validator.iter_errors(doc)] == ["additionalProperties"]
    props = json.loads(SCHEMA.read_text())["$defs"]["DeploymentSpec"]["properties"]
    assert all("description" in p for p in props.values())  # editors show help on hover
