"""Bad manifest files by the thousand, seeded, one category each (the CLI soak's input).

Hypothesis (strategies.py) shrinks and explores in process; through the CLI the soak
needs sheer numbers, so this is a plain seeded generator: file ``i`` of seed ``s`` is
the same file every run. Every file must be refused; none may run.
"""

from __future__ import annotations

import copy
import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from controller.store.sources.manifests import load

from .strategies import BASE, PATHS, set_path

WRONG: list[Any] = [1.5, -1, 10**100, float("inf"), True, None, "", [], {}, ["x", 1], {"k": []}]
WRONG += ["a" * 5000, "\x00\x1b[31m", "{port}", "../../etc/passwd", "\u202e\ufeff"]


def _dump(doc: Any) -> bytes:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).encode()


def _base(rng: random.Random) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["metadata"]["name"] = f"bad-{rng.randrange(10**9)}"
    return doc


def wrong_type(rng: random.Random, _: Path) -> bytes:
    """A field given a value of a wrong type: drawn again while the loader takes it (some
    are right for their field: `spec.devices: {}` is one device of the default kind)."""
    for _tries in range(20):
        doc = _base(rng)
        set_path(doc, rng.choice(PATHS), rng.choice(WRONG))
        if _refused(_dump(doc)):
            return _dump(doc)
    doc["spec"]["devices"] = "many"
    return _dump(doc)


def _refused(data: bytes) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "wrong.yaml").write_bytes(data)
        return not load([Path(tmp)]).entries


def unknown_field(rng: random.Random, _: Path) -> bytes:
    doc = _base(rng)
    path = rng.choice(PATHS)
    set_path(doc, (*path[:-1], rng.choice(["nmae", "Spec", "x" * 200, "ü", "__class__"])), 1)
    return _dump(doc)


def deep_nesting(rng: random.Random, _: Path) -> bytes:
    depth = rng.choice([70, 500, 20_000])
    opener, closer = rng.choice([("[", "]"), ("{a: ", "}")])
    return f"spec: {opener * depth}1{closer * depth}\n".encode()


def huge_string(rng: random.Random, _: Path) -> bytes:
    doc = _base(rng)
    set_path(doc, rng.choice(PATHS), "x" * rng.choice([100_000, 900_000, 1_100_000]))
    return _dump(doc)


def yaml_bomb(rng: random.Random, _: Path) -> bytes:
    levels = rng.randrange(6, 12)
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return ("\n".join(lines) + f"\nspec: *a{levels - 1}\n").encode()


def aliases(rng: random.Random, _: Path) -> bytes:
    text = _dump(_base(rng)).decode()
    return (text + rng.choice(["extra: &x [*x]\n", "spec: *nowhere\n", "<<: *x\n"])).encode()


def binary(rng: random.Random, _: Path) -> bytes:
    return bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 2000)))


def invalid_utf8(rng: random.Random, _: Path) -> bytes:
    data = _dump(_base(rng))
    i = rng.randrange(len(data))
    return data[:i] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x00"]) + data[i:]


def duplicate_keys(rng: random.Random, _: Path) -> bytes:
    text = _dump(_base(rng)).decode()
    lines = text.splitlines(keepends=True)
    i = rng.randrange(len(lines))
    return "".join([*lines[: i + 1], lines[i], *lines[i + 1 :]]).encode()


def dotdot_name(rng: random.Random, _: Path) -> bytes:
    doc = _base(rng)
    name = rng.choice(["../evil", "../../etc/passwd", "a/../../b", "..", ".", "a/b", "/abs"])
    doc["metadata"]["name"] = name
    return _dump(doc)


def device_symlink(rng: random.Random, path: Path) -> None:
    os.symlink(rng.choice(["/dev/zero", "/dev/urandom", "/dev/null", "/dev/full"]), path)


def non_mapping(rng: random.Random, _: Path) -> bytes:
    # (a null document is an empty file, which is valid: it declares nothing)
    return rng.choice([b"42\n", b"- a\n- b\n", b'"just a string"\n', b"[]\n", b"!!binary AA==\n"])


Maker = Callable[[random.Random, Path], bytes | None]
CATEGORIES: dict[str, Maker] = {
    "wrong types": wrong_type,
    "unknown fields": unknown_field,
    "deep nesting": deep_nesting,
    "huge strings": huge_string,
    "YAML bombs": yaml_bomb,
    "aliases": aliases,
    "binary": binary,
    "invalid UTF-8": invalid_utf8,
    "duplicate keys": duplicate_keys,
    "../ names": dotdot_name,
    "symlinks to devices": device_symlink,
    "non-mapping documents": non_mapping,
}


def plant(folder: Path, seed: int, first: int, count: int) -> dict[str, int]:
    """Files ``first`` .. ``first + count - 1`` of ``seed`` in ``folder``; per category."""
    made: dict[str, int] = {}
    names = list(CATEGORIES)
    for i in range(first, first + count):
        rng = random.Random(f"{seed}:{i}")
        kind = names[i % len(names)]
        path = folder / f"bad-{i}.yaml"
        data = CATEGORIES[kind](rng, path)
        if data is not None:
            path.write_bytes(data)
        made[kind] = made.get(kind, 0) + 1
    return made
