"""``reconcile logs --requests [-f] [--tail N] [-o json]``: the gateway's request log
(``gateway/accounting/requestlog.py``): who called what and how it went, one line a request.

``-f`` follows as ``logs -f`` does (``tail -F``): a line written in the instant of a
rotation may be missed by the follower; it is in the backup (``requests.jsonl.1``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from controller.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    FOLLOW_PERIOD,
    config,
    say_if_absent,
)
from controller.gateway.accounting import requestlog
from controller.gateway.lifecycle import registry
from controller.store.instances import logfiles


def cmd_requests(args: argparse.Namespace) -> int:
    if args.names or args.previous or args.replica is not None:
        print(
            "reconcile: --requests is the gateway's request log: no NAME, --previous or "
            "--replica (grep the model or deployment field instead)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.output not in (None, "json"):
        print(f"reconcile: logs --requests -o {args.output}: only -o json", file=sys.stderr)
        return EXIT_USAGE
    cfg = config(args, lenient=True)
    if not cfg.state_dir.is_dir():  # a slip's path: said, and -f makes none of its folders
        say_if_absent(cfg)
        return EXIT_FAIL
    state_dir = cfg.state_dir.absolute()
    path = requestlog.path_in(state_dir)
    if not logfiles.stream_files(path) and not args.follow:
        print(f"reconcile: no request log at {path}: {_why_none(state_dir)}", file=sys.stderr)
        return EXIT_FAIL
    show = _printer(args.output == "json")
    for line in requestlog.read_lines(path, args.tail):
        show(line)
    if args.follow:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.touch(mode=0o600, exist_ok=True)  # followed from its (empty) start
        logfiles.follow(path, _lines(show), lambda: True, poll=FOLLOW_PERIOD)
    return EXIT_OK


def _why_none(state_dir: Path) -> str:
    """Why no request is logged: a gateway serves and has had none (it logs each as it
    ends), or none serves: the advice to start one was said to a serving one too."""
    serving = registry.current_live(state_dir)
    if serving is None:
        return "no request reached a gateway of this state dir (start the daemon with --listen)"
    return (
        f"the gateway (pid {serving.ref.pid}, {serving.address}) has answered no request "
        "yet; each is logged as it ends"
    )


def _printer(as_json: bool) -> Callable[[dict[str, object]], None]:
    def show(line: dict[str, object]) -> None:
        text = json.dumps(line, separators=(",", ":")) if as_json else requestlog.text_line(line)
        print(text, flush=True)

    return show


def _lines(show: Callable[[dict[str, object]], None]) -> Callable[[bytes], None]:
    """The followed bytes as whole lines (a chunk may end mid-line)."""
    held = bytearray()

    def write(chunk: bytes) -> None:
        held.extend(chunk)
        *whole, rest = bytes(held).split(b"\n")
        held[:] = rest
        for raw in whole:
            try:
                value = json.loads(raw)
            except ValueError:
                continue
            if isinstance(value, dict):
                show(value)

    return write
