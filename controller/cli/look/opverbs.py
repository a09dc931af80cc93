"""The operator's verbs: describe, logs, plan, schema (status: statusverb; devices, drain:
nodeverbs).

Each only wires the configuration to a view and prints; exit codes come from cli/common.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from controller.cli.common import (
    EXIT_CHANGES,
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    config,
    no_such,
    output_format,
    preview,
    say_warnings,
    selected,
)
from controller.cli.look import unrecorded
from controller.cli.render.views import dump
from controller.core.manifest.backendnames import on_cluster
from controller.core.manifest.names import base_name, record_name_ok
from controller.core.state import Phase, Record
from controller.errors import BackendUnavailable
from controller.redact import printable
from controller.store.config.node import IGNORED, Config
from controller.store.instances.records import RecordProblem, RecordStore
from controller.store.sources.nearmiss import NOTHING_PRUNED

if TYPE_CHECKING:  # the loader brings pydantic: status, describe and logs never load it
    from controller.backends.base import Backend
    from controller.cli.render.planview import Change
    from controller.core.manifest.specs import Entry
    from controller.core.replicaset import ReplicaSet
    from controller.core.state import Observed
    from controller.store.sources.manifests import LoadResult


def _problems(problems: list[object]) -> None:
    for problem in problems:
        print(f"error: {getattr(problem, 'message', problem)}", file=sys.stderr)


# -- status / describe ------------------------------------------------------------


def cmd_describe(args: argparse.Namespace) -> int:
    names: list[str] = list(dict.fromkeys(args.names))  # a NAME given twice: once
    if not names and not args.selector:
        print("reconcile: describe needs a NAME or -l SELECTOR", file=sys.stderr)
        return EXIT_USAGE
    fmt = output_format(args, "text", ("text", "json", "yaml"))
    if fmt is None:
        return EXIT_USAGE
    cfg = config(args, lenient=True)
    described = Described(cfg, fmt, args)
    wanted: list[str | None] = [*names] or [None]  # None: what -l selects
    failed = [name for name in wanted if not described.add(name)]
    if described.docs:  # a list, as status -o json: one document per deployment
        print(dump(described.docs, fmt))
    if described.texts:  # an engine's words, never acted on
        print(printable("\n\n".join(described.texts), keep="\n"))
    return EXIT_FAIL if failed else EXIT_OK


class Described:
    """`describe NAME...`: each NAME's deployments in the order given (kubectl's), its
    errors said as it comes; what was found printed once, after them all."""

    def __init__(self, cfg: Config, fmt: str, args: argparse.Namespace) -> None:
        self.state_dir, self.remote, self.fmt, self.args = (
            cfg.state_dir,
            _remote_tail(cfg),
            fmt,
            args,
        )
        self.snap = RecordStore(cfg.state_dir).peek()  # a read verb moves nothing aside
        now = datetime.now(UTC)  # each message as true now ("restart in 8s")
        self.records = [replace(r, message=r.message_at(now)) for r in self.snap.records.values()]
        self.docs: list[dict[str, object]] = []
        self.texts: list[str] = []

    def pick(self, rec: Record) -> bool:
        return selected(rec.labels, self.args)

    def add(self, name: str | None) -> bool:
        """Describe ``name`` (None: what the selector picks); False when it failed."""
        from controller.core.replicaset import group, picked

        state_dir, records = self.state_dir, self.records
        if name is not None and not record_name_ok(name):  # invariant 9: never a path
            known = {base_name(n) for n in self.snap.records}
            print(no_such(name, known, state_dir), file=sys.stderr)
            return False
        sets = group(picked(name, records) if name else records)
        unreadable = _unreadable(self.snap.problems, name)
        _problems(list(unreadable))
        found = self._found(sets)
        if not found and not unreadable:
            _none_described(self.args, name, records, state_dir)
            if name:  # an engine of that name with no record: where to look instead
                torn = [p.name for p in self.snap.problems]
                for line in unrecorded.said(state_dir, records, torn, (name,)):
                    print(line, file=sys.stderr)
        return found and not unreadable

    def _found(self, sets: list[ReplicaSet]) -> bool:
        from controller.cli.render.describe import describe_deployment, describe_document

        if self.fmt != "text":
            docs = [describe_document(self.state_dir, rs, self.pick, self.remote) for rs in sets]
            self.docs += [d for d in docs if d]
            return any(docs)
        texts = [
            describe_deployment(self.state_dir, rs, selector=self.pick, remote_log=self.remote)
            for rs in sets
        ]
        self.texts += [t for t in texts if t is not None]
        return any(t is not None for t in texts)


def _unreadable(problems: list[RecordProblem], name: str | None) -> list[RecordProblem]:
    """The records that cannot be read, of NAME when one is given (its replicas' too)."""
    return [p for p in problems if not name or (p.name and name in (p.name, base_name(p.name)))]


def _none_described(
    args: argparse.Namespace, name: str | None, records: Iterable[Record], where: Path
) -> None:
    from controller.core.replicaset import picked

    if name and not picked(name, records):
        print(no_such(name, (base_name(r.name) for r in records), where), file=sys.stderr)
        removed = _removed(where, name)
        if removed is not None:  # kubectl says NotFound; the node still has its story
            print(removed, file=sys.stderr)
    else:
        which = f"named {name!r}" if name else "matches the selector"
        print(f"reconcile: no deployment {which}", file=sys.stderr)


def _removed(where: Path, name: str) -> str | None:
    """When ``name``'s journal ends with its ``removed`` event: when and why it went, and
    the verbs that still show it (its events and its last log are kept)."""
    from controller.cli.render.views import age
    from controller.store.instances.events import REMOVED, Journal

    events = Journal(where).read(name, last=1)
    if not events or events[-1].get("action") != REMOVED:
        return None
    event = events[-1]
    try:
        when = age(datetime.fromisoformat(str(event.get("time"))), datetime.now(UTC)) + " ago"
    except ValueError:
        when = "earlier"
    why = f", {event['reason']}" if event.get("reason") else ""
    return (
        f"reconcile: {name} was removed {when}{why}; nothing of it runs: "
        f"`reconcile events {name}` shows its events, `reconcile logs {name}` its last log"
    )


# -- logs ------------------------------------------------------------


def _remote_tail(cfg: Config) -> Callable[[Record], list[str]] | None:
    """describe's log lines of an engine on a cluster node, read through its backend."""
    return _RemoteTail(cfg) if on_cluster(cfg.backend) else None


class _RemoteTail:
    """The backend is opened at the first record that has an instance (a nonce): describing
    deployments that never started (Pending for a GPU) starts no Ray driver (~1 s of CPU)
    and says nothing of the cluster, as no node has a log of theirs to read."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.backend: Backend | None = None
        self.refused: list[str] = []

    def __call__(self, rec: Record) -> list[str]:
        from controller.cli.render.describe import LOG_LINES

        if rec.nonce is None:
            return []  # no instance ever ran
        if self.backend is None and not self.refused:
            from controller.backends.choose import open_backend

            try:
                self.backend = open_backend(self.cfg)
            except BackendUnavailable as exc:  # the record and its events are still shown
                self.refused = [f"<not read: {exc}>"]
        if self.backend is None:
            return self.refused
        got = self.backend.log_since(rec, 0)
        return [] if got is None else got[0].decode("utf-8", "replace").splitlines()[-LOG_LINES:]


# -- plan / schema ------------------------------------------------------------


def _replaced(backend: Backend, cfg: Config) -> list[str]:
    """A pass's refusal beside engines of another state dir at this path: the plan shows
    what it would do, and exits 1 as the pass would (``reconciler/replaced.py``)."""
    from controller.reconciler import replaced

    found = backend.strangers()
    return [replaced.said(cfg.state_dir, found, cfg.owner)] if found else []


def cmd_plan(args: argparse.Namespace) -> int:
    from controller.cli.render import planview
    from controller.core.manifest.labels import kept_apart, kept_note, skip_note
    from controller.host import secrets
    from controller.reconciler import planned
    from controller.store.sources.manifests import load

    fmt = output_format(args, "text", ("text", "json", "name"))
    if fmt is None:
        return EXIT_USAGE
    # An unreadable node config is one of the plan's errors (_unreadable_node_config):
    # said there, not also as the lenient verbs' warning.
    cfg = config(args, lenient=True, warn=False)
    first = _before_the_first_fetch(cfg)
    if first is not None:
        say_warnings(cfg)  # no plan to list them in
        return _unplanned(fmt, cfg, *first)
    view = preview(cfg)
    view.unread_secrets = {}  # a CI job has no age key: its sopsFiles' values unknown
    loaded = load(
        cfg.manifests,
        insecure=cfg.insecure_manifests,
        backend=cfg.backend,
        repo=cfg.repo,
        labels=view.reads(),
    )
    # envFrom's values first (read for the hash anyway): a Starting engine keyed from them
    # or a key file is probed with its key, as the pass will (probekeys.py), not refused.
    desired = view.desired(loaded)
    observed, problems = view.observe(desired=desired)
    observed = view.foresee_strays(desired, observed)
    actions = view.plan(desired, observed)
    found = planview.changes(
        actions,
        desired,
        observed,
        runs=lambda action: planned.command_line(view, action, observed),
        later=planned.NextRound(view, desired, observed, actions),
    )
    if args.selector:  # the manifest's labels, else the record's
        labels = {n: v.record.labels for n, v in observed.records.items()}
        labels |= {n: e.deployment.metadata.labels for n, e in desired.entries.items()}
        found = [c for c in found if selected(labels.get(c.name, {}), args)]
    errors = [str(e) for e in loaded.errors] + [p.message for p in problems]
    errors += _prune_errors(loaded, cfg.allow_empty)
    errors += _stuck(found, observed, cfg.owner, desired.entries.values())
    errors += _unbindable(found, desired.entries, cfg.backend)
    if _exec_judged_here(cfg.state_dir):
        errors += [f"{c.name}: {c.runs.unrunnable}" for c in found if c.runs and c.runs.unrunnable]
    errors += _unreadable_node_config(cfg)
    errors += _source_failing(cfg)
    errors += _replaced(view.backend, cfg)
    pending = planview.pending(found)
    blocked = planview.blocked(found)
    skipped, kept = kept_apart(desired.skipped, _here(observed, cfg) & set(desired.invalid))
    counts = planview.replicas(desired, view.autoscaler.notes)
    unread = secrets.unread_notes(view.unread_secrets)
    if fmt == "name":
        print("".join(f"{c.name}\n" for c in found if c.kind != "unchanged"), end="")
        print("".join(f"reconcile: note: {n}\n" for n in unread), end="", file=sys.stderr)
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
            "skipped": dict(sorted(skipped.items())),  # name -> its nodeSelector
            "kept_invalid": kept,  # skipped, but a record here: its manifest did not load
            "secrets_not_read": unread,  # sopsFiles no age key here opens (a CI job)
            # The commit planned against (a git source's applied one: `plan` fetches nothing).
            "revision": desired.revision,
        }
        print(json.dumps(doc, indent=2))
    else:
        notes = (skip_note(skipped, labels_read=cfg.labels is not None), kept_note(kept))
        lines = [planview.text(found, errors), *planview.replicas_text(counts)]
        lines += filter(None, notes)  # this node's share of a fleet
        lines += [f"note: {n}" for n in unread]
        print("\n".join([*lines, *_against(cfg)]))
    if errors or blocked or planview.never_pulled(found):  # what would make `--once` exit 1
        return EXIT_FAIL
    return EXIT_CHANGES if pending else EXIT_OK


def _here(observed: Observed, cfg: Config) -> set[str]:
    """The deployments this set has a record of on this node (``PassResult.ours``'s)."""
    return {
        base_name(name)
        for name, view in observed.records.items()
        if view.record.owner == cfg.owner and not view.record.elsewhere(cfg.node)
    }


def _unreadable_node_config(cfg: Config) -> list[str]:
    """A node config that cannot be read: `--once` refuses its pass (the node's labels,
    limits and source are unknown), so the plan is not "In sync" and exits 1 as it would."""
    if cfg.labels is not None:
        return []
    fix = (
        ": `--once` refuses to run on it (a reload keeps the last good one), and this plan "
        "is made without its settings; fix the file"
    )
    return [w.removesuffix(IGNORED) + fix for w in cfg.warnings]


def _source_failing(cfg: Config) -> list[str]:
    """A git source whose last fetch failed, or whose commit is refused unsigned: `--once`
    exits 1 on it, so the plan is no "In sync" (it is made against the commit the node still
    runs, and the branch may be far ahead)."""
    if cfg.git is None:
        return []
    from controller.store.sources.git.source import peek_status

    st = peek_status(cfg.state_dir)
    if st is None or not st.applied:  # _before_the_first_fetch said it
        return []
    why = st.fetch_error or st.stuck_move or st.unverified
    if not why:
        return []
    return [f"git: {printable(why)} (still running {st.applied[:12]}; nothing pruned)"]


def _stuck(
    found: Iterable[Change], observed: Observed, owner: str, entries: Iterable[Entry]
) -> list[str]:
    """What `--once` exits 1 on that no pass changes by itself: this set's deployments the
    plan leaves Failed, crash-looping or backing off from a program not exec'd, and pulls
    that keep failing (as `--once` says)."""
    from controller.reconciler import pulling
    from controller.reconciler.run import failed_text

    ours = [v.record for v in observed.records.values() if v.record.owner == owner]
    left = {c.name for c in found if c.kind == "unchanged"}
    out = [
        f"{r.name}: Failed: {printable(r.message)}"
        for r in ours
        if r.name in left and r.phase is Phase.FAILED
    ]
    out += [
        printable(failed_text(r))
        for r in ours
        if r.name in left and (r.crash_looping or r.exec_failed)
    ]
    stuck = pulling.failing(ours, observed.pulls, pulling.sources_of(entries))
    return out + [printable(why) for why in stuck.values()]


def _exec_judged_here(state_dir: Path) -> bool:
    """Whether the PATH this plan looked on is the one a start will exec with: a running
    daemon's engines get its environment (judged only where its PATH, read from /proc, is
    ours), a `--once`'s get its own, on a state dir a pass has used. A CI plan against a
    fresh state dir previews the node: the runner's programs are not the node's."""
    from controller.host import procscan
    from controller.store.config import stateid
    from controller.store.side.daemonset import daemon_pid

    pid = daemon_pid(state_dir)
    if pid is None:
        return stateid.peek(state_dir) is not None
    raw = procscan.environ(pid) if pid else None
    if raw is None:
        return False  # not ours to read: its PATH unknown
    fields = (f.partition(b"=") for f in raw.split(b"\0"))
    path = next((value for key, _, value in fields if key == b"PATH"), None)
    ours = os.environ.get("PATH")
    return path == (None if ours is None else os.fsencode(ours))


def _unbindable(found: Iterable[Change], entries: Mapping[str, Entry], backend: str) -> list[str]:
    """A start the pass would leave Pending on a port this user may never bind (`port: 80`,
    not as root): `--once` exits 1 on it, so `plan` does (the local backend's check)."""
    if on_cluster(backend):  # a cluster's node binds: not ours to probe
        return []
    from controller.host.ports import privileged

    out = []
    for change in found:
        entry = entries.get(base_name(change.name))
        port = entry.deployment.spec.process_port if entry is not None else None
        why = privileged(port) if port and change.kind in ("create", "replace") else None
        out += [f"{change.name}: {why}"] if why else []
    return out


def _before_the_first_fetch(cfg: Config) -> tuple[str, int] | None:
    """A git source this node never applied a commit of: no checkout to plan against.
    What to say and the exit code: 2, the first pass applies it; 1, its fetch fails."""
    if cfg.git is None:
        return None
    from controller.store.sources.git.source import followed_instead, peek_status, shown_url

    other = followed_instead(cfg.state_dir, cfg.git)
    # Another source's checkout, commit and fetch error are none of this one's.
    st = None if other is not None else peek_status(cfg.state_dir)  # `plan` moves nothing aside
    if st is not None and st.applied:
        return None
    url = shown_url(cfg.git.url)
    if st is not None and st.fetch_error:
        return f"nothing applied yet: the fetch of {url} failed: {st.fetch_error}", EXIT_FAIL
    follows = f" (this state dir follows {other.said()})" if other is not None else ""
    return (
        f"nothing applied yet from {url}{follows}: `plan` fetches nothing; the first pass "
        "(`reconcile --once`, or the daemon) fetches and applies it, and `plan` then shows "
        "what each later commit changes",
        EXIT_CHANGES,
    )


def _unplanned(fmt: str, cfg: Config, said: str, code: int) -> int:
    """`plan` before the first fetch: said, and exit 2 (a pass changes things) or 1."""
    if fmt == "json":
        error = [said] if code == EXIT_FAIL else []
        from controller.cli.render import planview

        doc = {"node": cfg.node, "in_sync": False, "changes": [], "unchanged": [],
               "summary": planview.summary([]), "errors": error, "skipped": {},
               "note": said, "revision": None}  # fmt: skip
        print(json.dumps(doc, indent=2))
    elif fmt == "text":
        print(f"error: {said}" if code == EXIT_FAIL else said)
    return code


def _against(cfg: Config) -> list[str]:
    """A git source: the commit the plan is made against. `plan` fetches nothing, so a
    commit pushed since is not in it (an "In sync" would mislead without this)."""
    if cfg.git is None:
        return []
    from controller.store.sources.git.source import peek_status

    st = peek_status(cfg.state_dir)
    at = st.applied[:12] if st is not None and st.applied else None
    if at is None:  # said instead of a plan (_before_the_first_fetch)
        return []
    return [
        f"Against commit {at}, the one the node applied: `plan` fetches nothing; a commit "
        "pushed since comes with the node's next fetch (`reconcile source` says when)."
    ]


def _prune_errors(loaded: LoadResult, allow_empty: bool) -> list[str]:
    """The folder problems that make `--once` exit 1 (and prune nothing)."""
    out = loaded.folder_errors()
    if not loaded.missing_folders and not loaded.prune_safe and not allow_empty:
        out.append(f"{loaded.no_manifest or 'no manifest'}: {NOTHING_PRUNED}")
    return out


def cmd_schema(args: argparse.Namespace) -> int:
    from controller.core.manifest.specs import json_schema

    print(json.dumps(json_schema(), indent=2))
    return EXIT_OK
