"""The operator's verbs: describe, logs, plan, schema (status: statusverb; devices, drain:
nodeverbs).

Each only wires the configuration to a view and prints; exit codes come from cli/common.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from controller.cli import replicalogs
from controller.cli.common import (
    EXIT_CHANGES,
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    config,
    looks,
    no_such,
    output_format,
    preview,
    reader_gone,
    selected,
)
from controller.cli.views import dump
from controller.core.manifest.backendnames import on_cluster
from controller.core.manifest.names import base_name
from controller.core.state import Record
from controller.redact import printable
from controller.store import logfiles
from controller.store.node import Config
from controller.store.records import RecordStore, check_name

if TYPE_CHECKING:  # the loader brings pydantic: status, describe and logs never load it
    from controller.store.manifests import LoadResult


def _problems(problems: list[object]) -> None:
    for problem in problems:
        print(f"error: {getattr(problem, 'message', problem)}", file=sys.stderr)


# -- status / describe ------------------------------------------------------------


def cmd_describe(args: argparse.Namespace) -> int:
    from controller.cli.describe import describe_deployment, describe_document
    from controller.core.replicaset import group, selects

    if args.name is None and not args.selector:
        print("reconcile: describe needs a NAME or -l KEY=VALUE", file=sys.stderr)
        return EXIT_USAGE
    if args.name is not None:
        check_name(args.name)  # invariant 9: said so, before any lookup
    fmt = output_format(args, "text", ("text", "json", "yaml"))
    if fmt is None:
        return EXIT_USAGE
    cfg = config(args, lenient=True)
    state_dir, remote = cfg.state_dir, _remote_tail(cfg)
    records = RecordStore(state_dir).load().records.values()
    sets = group(r for r in records if not args.name or selects(args.name, r))

    def pick(rec: Record) -> bool:
        return selected(rec.labels, args)

    if fmt != "text":  # a list, as status -o json: one document per deployment
        chosen = [describe_document(state_dir, rs, pick, remote) for rs in sets]
        docs = [d for d in chosen if d is not None]
        if not docs:
            return _none_described(args, records, state_dir)
        print(dump(docs, fmt))
        return EXIT_OK
    texts = [describe_deployment(state_dir, rs, selector=pick, remote_log=remote) for rs in sets]
    found = [t for t in texts if t is not None]
    if not found:
        return _none_described(args, records, state_dir)
    print(printable("\n\n".join(found), keep="\n"))  # an engine's words, never acted on
    return EXIT_OK


def _none_described(args: argparse.Namespace, records: Iterable[Record], where: Path) -> int:
    from controller.core.replicaset import selects

    if args.name and not any(selects(args.name, r) for r in records):
        print(no_such(args.name, (base_name(r.name) for r in records), where), file=sys.stderr)
    else:
        which = f"named {args.name!r}" if args.name else "matches the selector"
        print(f"reconcile: no deployment {which}", file=sys.stderr)
    return EXIT_FAIL


# -- logs ------------------------------------------------------------


def cmd_logs(args: argparse.Namespace) -> int:
    if args.requests:
        from controller.cli.requestsverb import cmd_requests

        return _quiet_pipe(lambda: cmd_requests(args))
    if args.previous and args.follow:
        print("reconcile: --previous cannot be followed (that run is over)", file=sys.stderr)
        return EXIT_USAGE
    if args.replica is not None and args.replica < 0:
        print("reconcile: --replica takes 0, 1, ... (replica 0 is NAME itself)", file=sys.stderr)
        return EXIT_USAGE
    for asked in args.names:
        check_name(asked)  # invariant 9: said so, before any lookup
    cfg = config(args, lenient=True)
    store = RecordStore(cfg.state_dir)
    known = replicalogs.deployments(store)
    unknown = [n for n in args.names if base_name(n) not in known]
    for asked in unknown:  # `logs web wbe` showed web and said nothing of wbe
        print(no_such(asked, known, cfg.state_dir), file=sys.stderr)
    if unknown:
        return EXIT_FAIL
    wanted = list(dict.fromkeys(args.names)) or known
    if not wanted:
        print(f"reconcile: no deployment has a log in {cfg.state_dir}", file=sys.stderr)
        return EXIT_FAIL
    names = [i for d in wanted for i in replicalogs.instances(store, d, args.replica)]
    if len(names) > 1:  # every instance, each line behind its name (docker compose logs)
        label = " ".join(wanted) if args.names else "any deployment"
        records = [r for r in map(store.read, names) if r is not None]
        if any(r.on_cluster for r in records):
            from controller.cli import remotelogs

            return _quiet_pipe(lambda: remotelogs.show(args, cfg, records, label))
        return _quiet_pipe(lambda: replicalogs.show(args, store, names, label))
    name = names[0]
    rec = store.read(name)
    if rec is not None and rec.on_cluster:
        return _remote_logs(args, cfg, rec)
    path = store.log_path(name)
    if not logfiles.stream_files(path):
        print(f"reconcile: no log for {name!r} at {path} (never started?)", file=sys.stderr)
        return EXIT_FAIL
    out = replicalogs.log_out()
    try:
        if args.previous:
            return _previous(path, name, args.tail, _flushing(out))
        if args.tail is not None:
            out.write(b"".join(logfiles.tail_lines(path, args.tail)))
        else:
            logfiles.copy_stream(path, out)
        out.flush()
        if args.follow:
            logfiles.follow(path, _flushing(out), lambda: _going(store, name))
    except BrokenPipeError:  # `reconcile logs x | head`
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK


def _quiet_pipe(show: Callable[[], int]) -> int:
    """``show()``, ending quietly when the reader goes (`reconcile logs x | head`)."""
    try:
        return show()
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _going(store: RecordStore, name: str) -> bool:
    """`logs -f` goes on while the deployment does and someone reads: `| head -1` on a
    quiet log makes no write fail, so the closed pipe is looked at too."""
    return store.read(name) is not None and not reader_gone()


def _remote_tail(cfg: Config) -> Callable[[Record], list[str]] | None:
    """describe's log lines of an engine on a cluster node, read through its backend."""
    if not on_cluster(cfg.backend):
        return None
    from controller.backends.choose import open_backend
    from controller.cli.describe import LOG_LINES

    backend = open_backend(cfg)

    def tail(rec: Record) -> list[str]:
        got = backend.log_since(rec, 0)
        return [] if got is None else got[0].decode("utf-8", "replace").splitlines()[-LOG_LINES:]

    return tail


def _remote_logs(args: argparse.Namespace, cfg: Config, rec: Record) -> int:
    """`logs` of an engine on a cluster node: its actor reads the file there."""
    if cfg.backend != rec.backend:
        print(
            f"reconcile: {rec.name} runs on the {rec.backend} backend: pass --backend"
            f" {rec.backend} (and its address), or set RECONCILE_BACKEND",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.previous:
        print("reconcile: --previous is not kept for engines on a cluster", file=sys.stderr)
        return EXIT_USAGE
    from controller.backends.choose import open_backend

    backend = open_backend(cfg)
    got = backend.log_since(rec, 0)
    if got is None:
        print(f"reconcile: no log for {rec.name!r} (its actor is gone)", file=sys.stderr)
        return EXIT_FAIL
    data, offset = got
    lines = data.splitlines(keepends=True)
    out = replicalogs.log_out()
    if args.tail is not None:  # as tail_lines counts them: --tail 0 shows none
        lines = lines[-args.tail :] if args.tail else []
    out.write(b"".join(lines))
    out.flush()
    for _ in looks(now=False) if args.follow else ():
        got = backend.log_since(rec, offset)
        if got is None:
            break  # its actor is gone
        out.write(got[0])
        out.flush()
        offset = got[1]
    return EXIT_OK


def _previous(path: Path, name: str, tail: int | None, write: Callable[[bytes], object]) -> int:
    found = logfiles.previous_run(path)
    if found is None:
        print(
            f"reconcile: {name} has no previous run in its log (it has not restarted, "
            "or rotation dropped that run)",
            file=sys.stderr,
        )
        return EXIT_FAIL
    lines, intact = found
    if not intact:
        print("reconcile: the start of that run was rotated away", file=sys.stderr)
    write(b"".join(lines[-tail:] if tail is not None and tail > 0 else lines))
    sys.stdout.flush()
    return EXIT_OK


def _flushing(out: BinaryIO) -> Callable[[bytes], None]:
    def write(chunk: bytes) -> None:
        out.write(chunk)
        out.flush()

    return write


# -- plan / schema ------------------------------------------------------------


def cmd_plan(args: argparse.Namespace) -> int:
    from controller.cli import planview
    from controller.core.manifest.labels import skip_note
    from controller.store.manifests import load

    fmt = output_format(args, "text", ("text", "json", "name"))
    if fmt is None:
        return EXIT_USAGE
    cfg = config(args, lenient=True)
    loaded = load(cfg.manifests, insecure=cfg.insecure_manifests, backend=cfg.backend)
    view = preview(cfg)
    observed, problems = view.observe()
    desired = view.desired(loaded)
    found = planview.changes(view.plan(desired, observed), desired, observed)
    if args.selector:  # the manifest's labels, else the record's
        labels = {n: v.record.labels for n, v in observed.records.items()}
        labels |= {n: e.deployment.metadata.labels for n, e in desired.entries.items()}
        found = [c for c in found if selected(labels.get(c.name, {}), args)]
    errors = [str(e) for e in loaded.errors] + [p.message for p in problems]
    errors += _prune_errors(loaded, cfg.allow_empty)
    pending = planview.pending(found)
    blocked = planview.blocked(found)
    counts = planview.replicas(desired, view.autoscaler.notes)
    if fmt == "name":
        print("".join(f"{c.name}\n" for c in found if c.kind != "unchanged"), end="")
    elif fmt == "json":
        doc = {
            "node": cfg.node,
            "in_sync": not pending and not blocked and not errors,
            "changes": [c.as_json() for c in found if c.kind != "unchanged"],
            "unchanged": [
                {"name": c.name, "phase": c.reason} for c in found if c.kind == "unchanged"
            ],
            "summary": planview.summary(found),
            "replicas": counts,
            "errors": errors,
            "skipped": dict(sorted(desired.skipped.items())),  # name -> its nodeSelector
        }
        print(json.dumps(doc, indent=2))
    else:
        skipped = skip_note(
            desired.skipped, labels_read=cfg.labels is not None
        )  # this node's share of a fleet
        lines = [planview.text(found, errors), *planview.replicas_text(counts)]
        print("\n".join([*lines, *([skipped] if skipped else [])]))
    if errors or blocked:  # what would make `--once` exit 1
        return EXIT_FAIL
    return EXIT_CHANGES if pending else EXIT_OK


def _prune_errors(loaded: LoadResult, allow_empty: bool) -> list[str]:
    """The folder problems that make `--once` exit 1 (and prune nothing)."""
    out = loaded.folder_problems()
    if not out and not loaded.prune_safe and not allow_empty:
        out.append("the manifests folder holds no manifest: nothing pruned (--allow-empty)")
    return out


def cmd_schema(args: argparse.Namespace) -> int:
    from controller.core.manifest.specs import json_schema

    print(json.dumps(json_schema(), indent=2))
    return EXIT_OK
