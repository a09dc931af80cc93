"""What a verb cut by Ctrl-C left half-done, in one line with the next move.

A Ctrl-C while `down` (or a pass, or `restart`) waited out an engine's grace period exited
130 without a word, the record left ``Terminating`` and its engine maybe still running:
a person could not tell that a teardown was cut, nor that the next `down` or `--once`
finishes it (they do: the record is the memory). Verbs that only read change nothing, so
they say nothing, as any Unix tool cut by Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

from controller.core.manifest.names import base_name

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process Ctrl-C ended


def interrupted(args: argparse.Namespace) -> int:
    """Say which teardowns the Ctrl-C cut, where a tearing verb was cut; 130. A teardown
    still under way (a second Ctrl-C while the first's waited for it) is left to its
    record: the interpreter's exit would join its thread, out its grace period (minutes)."""
    if not _tearing(args):  # a reader, or the daemon (its own stop: daemon/)
        return EXIT_INTERRUPTED
    left = _terminating(args)
    if left:
        print(_said(left), file=sys.stderr)
    elif not getattr(args, "wait", False):  # `--wait` said its own line (render/waiting.py)
        print(PASS_CUT if args.verb is None else f"reconcile: interrupted: {args.verb} stopped"
              " where it was; `reconcile status` shows what it left", file=sys.stderr)  # fmt: skip
    if left and _working():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)
    return EXIT_INTERRUPTED


PASS_CUT = (
    "reconcile: interrupted: the pass stopped where it was (what it started runs on, with "
    "its record); the next `reconcile --once` finishes it"
)


def _tearing(args: argparse.Namespace) -> bool:
    """A verb that tears engines down: `down`, `restart`, or one pass (`--once`)."""
    verb = getattr(args, "verb", None)
    return verb in ("down", "restart") or (verb is None and bool(getattr(args, "once", False)))


def _working() -> bool:
    """A thread the interpreter's exit would wait for (a teardown's worker) still runs."""
    main = threading.main_thread()
    return any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate())


def _said(names: list[str]) -> str:
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    which = " ".join(sorted({base_name(n) for n in names}))
    return (
        f"reconcile: interrupted: the teardown of {shown} was cut (left Terminating: its "
        f"engine may still run); `reconcile down {which}` or the next `reconcile --once` "
        "finishes it"
    )


def _terminating(args: argparse.Namespace) -> list[str]:
    """This manifest set's records left Terminating; none where they cannot be read (the
    state dir is not there, node.yaml is broken: the verb's own error said so)."""
    from controller.cli.common import config
    from controller.core.state import Phase
    from controller.store.instances.records import RecordStore

    try:
        cfg = config(args, lenient=True, warn=False)
        records = RecordStore(cfg.state_dir).peek().records.values()
    except Exception:  # best effort: a second error must not hide the interrupt's exit
        return []
    return sorted(r.name for r in records if r.phase is Phase.TERMINATING and r.owner == cfg.owner)
