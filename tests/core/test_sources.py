"""spec.source: one of huggingFace or url + sha256, its cache key, and its place in the hash."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from strategies import deployment, spec_body

from controller.core.manifest.specerrors import problems
from controller.core.manifest.specs import Deployment, json_schema, spec_document, spec_hash
from controller.store.sources.manifests import load

DIGEST = "ab" * 32
URL = {"url": "https://models.example.org/tiny.gguf", "sha256": DIGEST}
HUB = {"huggingFace": {"repo": "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "files": ["*q4_k_m.gguf"]}}


def error_of(source: Any) -> str:
    data = {
        "apiVersion": "reconcile/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": spec_body(source=source),
    }
    with pytest.raises(ValidationError) as info:
        Deployment.model_validate(data)
    return "\n".join(f"{p.path}: {p.message}" for p in problems(info.value, data))


def test_a_url_source_keeps_its_digest_as_the_key() -> None:
    source = deployment("web", source=URL).spec.source
    assert source is not None and source.url == URL["url"]
    assert source.key == f"sha256-{DIGEST}"


def test_an_upper_case_digest_names_the_same_file() -> None:
    source = deployment("web", source={**URL, "sha256": DIGEST.upper()}).spec.source
    assert source is not None and source.key == f"sha256-{DIGEST}"


def test_a_hub_source_defaults_to_main_and_keys_on_repo_revision_and_files() -> None:
    source = deployment("web", source=HUB).spec.source
    assert source is not None and source.hugging_face is not None
    assert source.hugging_face.revision == "main"
    pinned = deployment("web", source={"huggingFace": {**HUB["huggingFace"], "revision": "v1"}})
    assert pinned.spec.source is not None
    assert source.key.startswith("hf-") and source.key != pinned.spec.source.key
    assert source.describe() == "Qwen/Qwen2.5-0.5B-Instruct-GGUF@main [*q4_k_m.gguf]"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ({}, "source takes exactly one of huggingFace or url"),
        ({**URL, **HUB}, "source takes exactly one of huggingFace or url"),
        ({"url": URL["url"]}, "source.url needs source.sha256"),
        ({**URL, "sha256": "12ab"}, "spec.source.sha256: sha256 must be 64 hexadecimal digits"),
        ({**HUB, "sha256": DIGEST}, "source.sha256 goes with url"),
        ({"url": "file:///etc/passwd", "sha256": DIGEST}, "spec.source.url: String should"),
        ({"huggingFace": {"repo": "../x"}}, "spec.source.huggingFace.repo: String should"),
        ({**URL, "mirror": "x"}, "spec.source.mirror: Extra inputs are not permitted"),
    ],
    ids=[
        "neither",
        "both",
        "url-without-digest",
        "short-digest",
        "hub-digest",
        "file-url",
        "repo-path",
        "unknown-field",
    ],
)
def test_a_wrong_source_is_an_error_naming_the_field(source: Any, expected: str) -> None:
    assert expected in error_of(source)


def test_source_is_hashed_but_an_unset_one_changes_no_hash() -> None:
    plain = deployment("web").spec
    assert "source" not in spec_document(plain)  # so every hash pinned before it holds
    with_url = deployment("web", source=URL).spec
    other = deployment("web", source={**URL, "sha256": "cd" * 32}).spec
    assert len({spec_hash(plain), spec_hash(with_url), spec_hash(other)}) == 3


def test_the_schema_describes_every_source_field() -> None:
    defs = json_schema()["$defs"]
    for model in ("Source", "HuggingFace"):
        for name, field in defs[model]["properties"].items():
            assert field.get("description"), f"{model}.{name}"
    assert "source" in defs["DeploymentSpec"]["properties"]


@pytest.mark.parametrize("source", [URL, HUB], ids=["url", "hub"])
def test_a_source_is_the_model_a_recipe_needs(tmp_path: Path, source: dict[str, Any]) -> None:
    """engine llama-cpp with a source and no spec.model loads: the pull names the file."""
    doc = {"engine": "llama-cpp", "source": source}
    text = json.dumps({"apiVersion": "reconcile/v1", "kind": "Deployment",
                       "metadata": {"name": "tiny"}, "spec": doc})  # fmt: skip
    (tmp_path / "tiny.yaml").write_text(text)
    loaded = load([tmp_path])
    assert not loaded.errors, loaded.errors
    assert set(loaded.entries) == {"tiny"}
    bare = json.loads(text)
    del bare["spec"]["source"]
    (tmp_path / "tiny.yaml").write_text(json.dumps(bare))
    (error,) = load([tmp_path]).errors  # without it the recipe still wants spec.model
    assert "needs spec.model" in str(error)
