"""How an engine's parser reads a flag's name, so reconcile reads ``spec.args`` as the
engine will. Pure. The one table of spellings: the recipes' owned flags (owned.py) and
the memory share's flag (share.py) and the flags readiness reads (``--served-model-name``,
``--api-key``: vllm.py, sglang.py) are found in ``spec.args`` through it.

* vLLM's ``FlexibleArgumentParser.parse_args`` reads ``--gpu_memory_utilization`` as
  ``--gpu-memory-utilization``: the underscores between ``--`` and the first ``.`` (or
  the ``=``) become dashes; values are left as written.
* vLLM's and SGLang's argparse take a flag's beginning for the flag (``allow_abbrev``):
  ``--gpu-memory-util 0.5`` sets ``--gpu-memory-utilization``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Parser:
    underscores: bool = False  # --a_b is read as --a-b
    abbreviations: bool = False  # a flag's beginning is read as the flag


PARSERS: dict[str, Parser] = {
    "vllm": Parser(underscores=True, abbreviations=True),
    "sglang": Parser(abbreviations=True),
}


def parser(engine: str) -> Parser:
    """The engine's way of reading flags; an engine not in the table reads them as written."""
    return PARSERS.get(engine, Parser())


def dashed(args: Sequence[str]) -> tuple[str, ...]:
    """``args`` with each flag name's underscores (up to a ``.`` or ``=``) as dashes."""
    out: list[str] = []
    for arg in args:
        if arg.startswith("--"):
            key, eq, value = arg.partition("=")
            name, dot, rest = key[2:].partition(".")
            arg = f"--{name.replace('_', '-')}{dot}{rest}{eq}{value}"
        out.append(arg)
    return tuple(out)


def as_read(engine: str, args: Sequence[str]) -> tuple[str, ...]:
    """``args`` with each flag's name spelled as the engine reads it (not abbreviations)."""
    return dashed(args) if parser(engine).underscores else tuple(args)


def _reads(engine: str, args: Sequence[str], flag: str) -> list[int]:
    """The indexes in ``args`` of each name the engine reads as ``flag``."""
    abbreviations = parser(engine).abbreviations
    found: list[int] = []
    for i, read in enumerate(as_read(engine, args)):
        name = read.partition("=")[0]
        if not name.startswith("--") or len(name) <= 2:
            continue
        if name == flag or (abbreviations and flag.startswith(name)):
            found.append(i)
    return found


def spelling_of(engine: str, args: Sequence[str], flag: str) -> str | None:
    """The name, as written in ``args``, that the engine reads as ``flag``; None if none."""
    found = _reads(engine, args, flag)
    return args[found[0]].partition("=")[0] if found else None


def value_of(engine: str, args: Sequence[str], flag: str) -> str | None:
    """The value the engine reads for ``flag`` (``--flag V`` or ``--flag=V``, in any
    spelling it reads as ``flag``; argparse keeps the last one given); None if none."""
    for i in reversed(_reads(engine, args, flag)):
        _, eq, value = args[i].partition("=")
        if eq:
            return value
        if i + 1 < len(args):
            return args[i + 1]
    return None
