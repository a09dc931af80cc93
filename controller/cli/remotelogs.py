"""`reconcile logs` of several instances when some run on a cluster node: each read
through the backend (its actor reads the file there), each line behind its instance's
name as for local replicas; ``-f`` polls every instance's log from where it stopped."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from controller.backends.base import Backend
from controller.cli import replicalogs
from controller.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, looks
from controller.core.state import Record
from controller.store.node import Config


def show(args: argparse.Namespace, cfg: Config, records: Sequence[Record], label: str) -> int:
    if args.previous:
        print("reconcile: --previous is not kept for engines on a cluster", file=sys.stderr)
        return EXIT_USAGE
    wrong = [r for r in records if r.backend != cfg.backend]
    if wrong:
        print(
            f"reconcile: {wrong[0].name} runs on the {wrong[0].backend} backend: pass"
            f" --backend {wrong[0].backend} (and its address), or set RECONCILE_BACKEND",
            file=sys.stderr,
        )
        return EXIT_USAGE
    from controller.backends.choose import open_backend

    backend = open_backend(cfg)
    width = max(len(r.name) for r in records)
    offsets: dict[str, int] = {}
    out = replicalogs.log_out()
    for rec in records:
        lines = _read(backend, rec, offsets)
        if args.tail is not None:  # as tail_lines counts them: --tail 0 shows none
            lines = lines[-args.tail :] if args.tail else []
        out.write(b"".join(_prefixed(rec.name, width, line) for line in lines))
    out.flush()
    if not offsets:
        print(f"reconcile: no replica of {label} has a log (never started?)", file=sys.stderr)
        return EXIT_FAIL
    for _ in looks(now=False) if args.follow else ():
        for rec in records:
            out.write(b"".join(_prefixed(rec.name, width, x) for x in _read(backend, rec, offsets)))
        out.flush()
    return EXIT_OK


def _read(backend: Backend, rec: Record, offsets: dict[str, int]) -> list[bytes]:
    """The whole lines of ``rec``'s log past its offset (a partial last line waits)."""
    got = backend.log_since(rec, offsets.get(rec.name, 0))
    if got is None:
        return []
    data, end = got
    cut = data.rfind(b"\n") + 1
    offsets[rec.name] = end - (len(data) - cut)
    return data[:cut].splitlines(keepends=True)


def _prefixed(name: str, width: int, line: bytes) -> bytes:
    return f"{name:<{width}} | ".encode() + line
