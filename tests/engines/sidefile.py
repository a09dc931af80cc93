"""A manifest whose engine reads a file its flag names (vLLM's ``--config``, llama.cpp's
``--api-key-file``), loaded as a pass loads it: the tests of what the loader reads."""

from __future__ import annotations

from pathlib import Path

import yaml

from controller.store.sources.manifests import LoadResult, load


def load_beside(
    tmp_path: Path,
    engine: tuple[str, str],
    side: tuple[str, str, str | None],
    args: list[str],
    backend: str = "local",
    **spec: object,
) -> LoadResult:
    """``engine`` (its name, its model) given ``args``, where ``side`` is the file's name
    under ``tmp_path``, the placeholder in ``args`` that names its path and its text
    (written when given)."""
    name, placeholder, text = side
    path = tmp_path / name
    tmp_path.mkdir(parents=True, exist_ok=True)
    if text is not None:
        path.write_text(text)
    folder = tmp_path / "manifests"
    folder.mkdir(parents=True)
    doc = {
        "apiVersion": "reconcile/v1",
        "kind": "Deployment",
        "metadata": {"name": "chat"},
        "spec": {
            "engine": engine[0],
            "model": engine[1],
            "args": [a.replace(placeholder, str(path)) for a in args],
            **spec,
        },
    }
    (folder / "chat.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return load([folder], backend=backend)
