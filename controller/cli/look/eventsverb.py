"""`reconcile events [NAME] [-w]`: the event journal, newest last (kubectl get events).

Every deployment's journal (``<state>/events/<name>.jsonl``) merged by time; ``-w``
follows them, printing each event once as it is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from controller.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    config,
    looks,
    no_such,
    output_format,
    say_if_absent,
)
from controller.cli.render.views import age, event_reason, table
from controller.core.manifest.names import base_name, record_name_ok
from controller.store.instances.events import Journal

Event = dict[str, Any]


def cmd_events(args: argparse.Namespace) -> int:
    fmt = output_format(args, "text", ("text", "json"))
    if fmt is None:
        return EXIT_USAGE
    cfg = config(args, lenient=True)
    state_dir = cfg.state_dir
    say_if_absent(cfg)
    journal = Journal(state_dir)
    problem = journal.problem()
    if problem is not None:
        print(f"reconcile: {problem}", file=sys.stderr)
        return EXIT_FAIL
    name = args.name
    if name is not None and not record_name_ok(name):  # invariant 9: never a journal's path
        print(no_such(name, {base_name(n) for n in journal.names()}, state_dir), file=sys.stderr)
        return EXIT_FAIL
    if name is not None and base_name(name) != name and journal.path(base_name(name)).exists():
        # `status`, `describe` and `logs` take a replica's name: its events are its
        # deployment's (one journal each), so those are shown, and said so
        name = base_name(name)
        print(f"reconcile: events are kept per deployment: {name}'s", file=sys.stderr)
    if name is not None and not journal.path(name).exists():
        known = {base_name(n) for n in journal.names()}
        print(no_such(name, known, state_dir), file=sys.stderr)
        return EXIT_FAIL
    seen: set[str] = set()
    _show(_new(_gather(journal, name), seen), fmt, header=True)
    for _ in looks(now=False) if args.watch else ():  # `events -w | head -2`: ends with head
        _show(_new(_gather(journal, name), seen), fmt, header=False)
    return EXIT_OK


def _gather(journal: Journal, name: str | None) -> list[Event]:
    if name is not None:  # the deployment now under the name: not an earlier one's
        out = [{"deployment": name, **e} for e in journal.read(name)]
    else:  # every journal whole: a removed deployment's ends with its `removed` event
        out = [
            {"deployment": n, **e} for n in journal.names() for e in journal.read(n, history=True)
        ]
    return sorted(out, key=lambda e: str(e.get("time", "")))


def _new(events: Iterable[Event], seen: set[str]) -> list[Event]:
    """Events not printed yet (a journal is rewritten when trimmed: keyed by content)."""
    fresh = []
    for event in events:
        key = json.dumps(event, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            fresh.append(event)
    return fresh


def _show(events: list[Event], fmt: str, *, header: bool) -> None:
    if fmt == "json":
        for event in events:  # JSON lines: one event each, as `-w` prints them
            print(json.dumps(event, default=str), flush=True)
        return
    if not events and not header:
        return
    if not events:
        print("No events.")
        return
    now = datetime.now(UTC)
    rows = [[_age(e, now), str(e["deployment"]), *_fields(e)] for e in events]
    if header:
        rows.insert(0, ["AGE", "DEPLOYMENT", "ACTION", "OUTCOME", "REASON"])
    print(table(rows), flush=True)


def _fields(event: Event) -> list[str]:
    action = str(event.get("action", "?"))
    instance = event.get("instance")
    if instance and instance != event["deployment"]:
        action += f" ({instance})"
    return [action, str(event.get("outcome", "")), event_reason(event)]


def _age(event: Event, now: datetime) -> str:
    try:
        return age(datetime.fromisoformat(str(event.get("time"))), now)
    except ValueError:
        return "?"
