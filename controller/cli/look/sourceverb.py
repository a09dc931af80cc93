"""`reconcile source [-o json]`: the git source this state dir follows, and its state.

It needs only the state dir (``<state>/git/source.json`` remembers the source); the
state is worked out from that file and the phases of the source's records.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from controller.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, config, output_format
from controller.store.instances.records import RecordStore
from controller.store.sources.git import source as gitsource


def source_state(
    state_dir: Path, *, strict: bool = False
) -> tuple[gitsource.SourceStatus, str, str] | None:
    """(the status file, state, message), or None when the state dir follows no git source;
    a damaged file is named and read as none, or (``strict``: `source` itself) a
    RecordError that says what to do. A read verb moves nothing aside either way."""
    read = gitsource.read_status if strict else gitsource.peek_status
    st = read(state_dir)
    if st is None:
        return None
    records = RecordStore(state_dir).peek().records.values()
    state, message = gitsource.state_of(st, gitsource.phases_of(records, st.owner))
    return st, state, message


def summary(state_dir: Path) -> tuple[str, str | None] | None:
    """The one line `status` prints above its table, and the owner whose folder it says is
    gone or empty at the applied commit, so that its records' rows need not say it again
    (None: no git source)."""
    seen = source_state(state_dir)
    if seen is None:
        return None
    st, state, message = seen
    ref = f"tag {st.tag}" if st.tag else st.branch
    at = st.applied[:12] if st.applied else "-"
    folder = gitsource.folder_unread(st)
    said = st.owner if folder is not None and folder in message else None
    return f"source: {st.url} {ref} path {st.path}: {state} at {at} ({message})", said


def cmd_source(args: argparse.Namespace) -> int:
    fmt = output_format(args, "text", ("text", "json"))
    if fmt is None:
        return EXIT_USAGE
    cfg = config(args, lenient=True)
    seen = source_state(cfg.state_dir, strict=True)
    if seen is None:
        print(
            f"reconcile: state dir {cfg.state_dir} follows no git source"
            " (start the daemon with --git URL, or set git.url in node.yaml)",
            file=sys.stderr,
        )
        return EXIT_FAIL
    st, state, message = seen
    item = gitsource.as_json(st, state, message)
    if fmt == "json":
        print(json.dumps(item, indent=2))
        return EXIT_OK
    for key, value in item.items():
        print(f"{key + ':':<17} {'-' if value is None else value}")
    return EXIT_OK
