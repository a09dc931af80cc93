"""`reconcile status [NAME...]` (alias `get`): the deployments, as the last pass saw them.

Records are what passes wrote; ``observed.json`` says when each node's last pass looked,
so every row has its SEEN age and every JSON item its ``observed_at``, and a set whose
folders held no manifest shows that condition on its deployments. ``--refresh`` looks
now (liveness, the readiness probe of what is Starting) without acting: it writes
nothing. ``-w`` prints each deployment again whenever it changes, like `kubectl get -w`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controller.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    config,
    looks,
    no_such,
    output_format,
    preview,
    say_if_absent,
    selected,
    stopped_daemon,
)
from controller.cli.gateway.gatewaystatus import refusal_lines
from controller.cli.gateway.gatewaystatus import summary as gateway_line
from controller.cli.gateway.startlock import stopped
from controller.cli.look import unrecorded
from controller.cli.look.nodeconditions import STOPPED_DAEMON, node_conditions
from controller.cli.render.views import (
    FORMATS,
    drain_line,
    dump,
    status_rows,
    status_table,
    table,
    widths_of,
)
from controller.core.manifest.backendnames import on_cluster
from controller.core.manifest.names import base_name
from controller.core.replicaset import group, picked, selects
from controller.core.state import Drain, Phase, Record, RecordView
from controller.errors import ConfigError
from controller.host import bootclock
from controller.store.config.node import Config, read_drain
from controller.store.instances.records import RecordProblem, RecordStore
from controller.store.models import pullstatus
from controller.store.side import daemonset, observed
from controller.store.statedir import StateDir

if TYPE_CHECKING:
    from controller.core.plan import Desired
    from controller.reconciler.run import Preview

WATCH_FORMATS = ("table", "wide", "json")
REFRESHED = "seen now by `status --refresh`; the next pass records it"


@dataclass
class Look:
    """One look at the state dir: the selected records and what is known about them."""

    records: list[Record]
    pulls: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seen: dict[str, datetime] = field(default_factory=dict)  # record -> observed at
    conditions: dict[str, list[str]] = field(default_factory=dict)  # record -> conditions
    state_dir: Path | None = None  # where they were read (a git checkout's files named from it)
    # record -> its set's condition, when its last pass read no manifest (observed.Views)
    unread: dict[str, str] = field(default_factory=dict)
    said_above: str | None = None  # the owner whose unread folder the line above says
    at: datetime = field(default_factory=lambda: datetime.now(UTC))  # when it was taken
    # Engines running with no record (found by their spawn notes), in words: one line each
    unrecorded: list[str] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # the NAMEs given, shown in their order
    missing: list[str] = field(default_factory=list)  # the errors of NAMEs matching none

    def ranked(self, name: str) -> int:
        """Where deployment ``name`` comes in the NAMEs given (kubectl's `get a b`)."""
        return self.order.index(name) if name in self.order else len(self.order)

    def live(self) -> list[Record]:
        """The records with what their messages say true now (a back-off's "restart in
        20s" counted from ``backoff_until``, not as the pass wrote it)."""
        return [replace(r, message=r.message_at(self.at)) for r in self.records]

    def only(self, names: set[str] | None) -> Look:
        """This look narrowed to the deployments ``names`` (None: all of them)."""
        if names is None:
            return self
        kept = [r for r in self.records if base_name(r.name) in names]
        return replace(self, records=kept)

    def shown(self) -> list[Record]:
        """The records as a table shows them: live, a deployment's conditions leading its
        message, a git source's file named as in the repository (``manifests/a.yaml``)."""
        return [self._shown(r) for r in self.live()]

    def _shown(self, rec: Record) -> Record:
        conditions = self.conditions.get(rec.name, [])
        if rec.owner == self.said_above:  # the source's line says it once, not every row
            conditions = [c for c in conditions if c != self.unread.get(rec.name)]
        if conditions:
            said = [*conditions, *([rec.message] if rec.message else [])]
            if rec.state_unknown:  # the mark leads: PHASE's "?" is read from it
                said = [rec.message, *conditions]
            rec = replace(rec, message="; ".join(said))
        if rec.source and self.state_dir is not None:
            rec = replace(rec, source=StateDir(self.state_dir).in_repo(rec.source))
        return rec


def cmd_status(args: argparse.Namespace) -> int:
    fmt = output_format(args, "table", FORMATS)
    if fmt is None:
        return EXIT_USAGE
    cfg = config(args, lenient=True)
    if args.watch:
        if fmt not in WATCH_FORMATS:
            print(f"reconcile: status -w prints {', '.join(WATCH_FORMATS)}", file=sys.stderr)
            return EXIT_USAGE
        say_if_absent(cfg)  # a slip in --state-dir watches an empty table for good
        return watch(args, cfg, fmt)
    seen = look(args, cfg)
    if seen is None:
        return EXIT_FAIL
    if not seen.records:
        say_if_absent(cfg)
        seen.unrecorded += unrecorded.of_another_state_dir(cfg)
    if fmt in ("json", "yaml"):  # DESIGN's list: each item carries the node's conditions
        conditions = node_conditions(cfg, seen.unread)
        print(dump([{**i, "node_conditions": conditions} for i in items(seen)], fmt))
    elif fmt == "name":
        sets = sorted(group(seen.records), key=lambda s: seen.ranked(s.name))
        print("".join(f"{s.name}\n" for s in sets), end="")
    else:
        banner = drain_line(cfg.node, _drain_or_none(cfg), datetime.now(UTC), bootclock.read())
        if banner:
            print(banner, file=sys.stderr)
        source = _source_line(cfg.state_dir)
        if source is not None:
            print(source[0])
            seen.said_above = source[1]
        if line := gateway_line(cfg.state_dir):
            print(line)
        for note in skipped(cfg):  # what this node leaves to others; files not loaded
            print(note)
        print(_table(seen, wide=fmt == "wide") if seen.records else "No deployments.")
    for line in refusal_lines(cfg.state_dir):  # on stderr: stdout stays a table or a list
        print(f"warning: {line}", file=sys.stderr)
    if (daemon := daemonset.daemon_pid(cfg.state_dir)) and stopped(daemon):
        print(f"warning: {stopped_daemon(daemon)}: {STOPPED_DAEMON}", file=sys.stderr)
    for line in seen.unrecorded:
        print(line, file=sys.stderr)
    for line in outside_inventory(cfg, seen.records):
        print(line, file=sys.stderr)
    for problem in seen.problems:
        print(f"error: {problem}", file=sys.stderr)
    for line in seen.missing:
        print(line, file=sys.stderr)
    # What cannot be read is not shown: exit 1 as `plan` does for an unreadable record
    # (kubectl get prints what it could and exits 1 on an error, or a NAME not found).
    return EXIT_FAIL if seen.problems or seen.missing else EXIT_OK


def outside_inventory(cfg: Config, records: list[Record]) -> list[str]:
    """``warning:`` lines of the engines here holding a device a static inventory
    (``--devices``, RECONCILE_DEVICES) no longer lists: changed, the daemon restarted, the
    engine ran on; only `devices` said so. The running daemon's inventory (its note) is
    the one judged by, else this shell's: a shell with another RECONCILE_DEVICES warned
    wrongly, or not at all. Discovery (NVML, nvidia-smi) is left to `devices` and the
    passes: status stays quick, and without a static inventory it says nothing."""
    holding = [r for r in records if r.holds and r.devices and not r.elsewhere(cfg.node)]
    inventory = _daemon_inventory(cfg) if holding else None
    if inventory is None or on_cluster(cfg.backend):
        return []  # a cluster's GPUs are `devices`'s to ask
    from controller.core.devices.inventory import parse_static
    from controller.core.statusjson import outside_items

    try:
        known = parse_static(inventory).keys()
    except ConfigError:  # the pass and `devices` say what is wrong with it
        return []
    return [
        f"warning: {name} holds {o['device']}, which this node's inventory no longer lists "
        "(--devices / RECONCILE_DEVICES changed while it ran): it runs on, and nothing new "
        f"is placed there; put {o['device']} back in the daemon's --devices, or `reconcile "
        f"restart {base_name(name)}` to move it onto a listed device"
        for o in outside_items(known, holding, cfg.node)
        for name in o["held_by"]
    ]


def _daemon_inventory(cfg: Config) -> str | None:
    """The static inventory the daemon on this state dir runs with (None: it discovers),
    or this shell's where no daemon runs or its note predates the inventory."""
    pid = daemonset.daemon_pid(cfg.state_dir)
    ran = daemonset.devices_of(cfg.state_dir, pid) if pid else None
    return ran.static if ran is not None else cfg.devices


def skipped(cfg: Config) -> list[str]:
    """The last pass's notes of the deployments this node's labels left to other nodes,
    of those it runs on, their manifest not loading, and of the files that did not load
    and name no deployment (a new file's YAML syntax error)."""
    notes = observed.peek_all(cfg.state_dir)
    nodes = {n.node for n in notes}
    # A state dir is most often one node's: `status` without the daemon's --node (its
    # name defaults to the host's) still says that node's note.
    node = next(iter(nodes)) if len(nodes) == 1 and cfg.node not in nodes else cfg.node
    mine = [n for n in notes if n.node == node]
    unloaded = sorted({f"not loaded: {e}" for n in mine for e in n.unloaded})
    return [
        *sorted({n.skipped for n in mine if n.skipped}),
        *sorted({n.kept for n in mine if n.kept}),
        *unloaded,
    ]


def look(args: argparse.Namespace, cfg: Config, *, say: bool = True) -> Look | None:
    """The records ``args`` select, as on disk or (``--refresh``) as seen now; None (said
    on stderr unless not ``say``) when no NAME matches any. A record that cannot be read
    is among ``problems`` (the NAMEs' only, when given) and left where it lies; the NAMEs
    that match none are said in ``missing`` (kubectl's `get a nope`: a shown, nope said)."""
    records, problems, seen = _read(args, cfg)
    torn = [p.name for p in problems]  # an engine with no record has no labels to select
    names: list[str] = list(dict.fromkeys(args.names))  # a NAME given twice: shown once
    engines = [] if args.selector else unrecorded.said(cfg.state_dir, records, torn, names)
    named = Named(records, problems)
    if names:
        named = _named(names, records, problems, cfg.state_dir)
        if not named.records:
            if say:
                print(*named.missing, *engines, sep="\n", file=sys.stderr)
            return None
    chosen = [r for r in named.records if selected(r.labels, args)]
    records, pulls = pullstatus.live(chosen, cfg.state_dir)  # Pulling: progress now
    noted = observed.views(observed.peek_all(cfg.state_dir), records)
    records = [noted.as_read(r) for r in records]  # no stale spec-invalid mark
    problem_lines = [p.message for p in named.problems]
    found = Look(records, dict(pulls), problem_lines, state_dir=cfg.state_dir)
    found.seen = {**noted.seen, **seen}  # --refresh: now
    found.conditions, found.unread = noted.conditions, noted.unread
    found.unrecorded, found.order, found.missing = engines, names, named.missing
    return found


@dataclass
class Named:
    """What NAMEs select: their records, their unreadable records, and (``missing``) the
    error lines of those that match no record."""

    records: list[Record]
    problems: list[RecordProblem]
    missing: list[str] = field(default_factory=list)


def _named(
    names: list[str], records: list[Record], problems: list[RecordProblem], state_dir: Path
) -> Named:
    found = Named([], [])
    known = [base_name(r.name) for r in records]
    for name in names:
        of_name = [p for p in problems if p.name and name in (p.name, base_name(p.name))]
        chosen = [r for r in picked(name, records) if r not in found.records]
        if chosen:
            found.records += chosen
            found.problems += of_name
        else:  # its unreadable record says why it is not shown, else the names there are
            said = [f"error: {p.message}" for p in of_name]
            found.missing += said or [no_such(name, known, state_dir)]
    return found


def _read(
    args: argparse.Namespace, cfg: Config
) -> tuple[list[Record], list[RecordProblem], dict[str, datetime]]:
    """(records by name, the records that cannot be read, record -> seen now)."""
    if args.refresh:
        records, problems = refreshed(cfg)
        now = datetime.now(UTC)
        seen = {r.name: now for r in records if not r.elsewhere(cfg.node)}
    else:
        snap = RecordStore(cfg.state_dir).peek()  # a read verb moves nothing aside
        records, problems, seen = list(snap.records.values()), snap.problems, {}
    return sorted(records, key=lambda r: r.name), problems, seen


def items(seen: Look, *, live: bool = True) -> list[dict[str, Any]]:
    """``status -o json``'s list, each item with ``observed_at`` and ``conditions``; its
    messages true now (``live``), else as the records hold them."""
    from controller.core.statusjson import deployment_items

    records = seen.live() if live else seen.records
    found = deployment_items(records, seen.pulls, seen.seen, seen.conditions)
    return sorted(found, key=lambda i: seen.ranked(str(i["name"])))


def _table(seen: Look, *, wide: bool, now: datetime | None = None) -> str:
    shown = seen.shown()
    if len(seen.order) < 2:
        return status_table(shown, now=now, wide=wide, seen=seen.seen)
    return table(ordered_rows(seen, shown, wide=wide, show_rev=None, now=now))


def ordered_rows(
    seen: Look, shown: list[Record], *, wide: bool, show_rev: bool | None, now: datetime | None
) -> list[list[str]]:
    """``status_rows`` of ``shown``, the header first; with several NAMEs, their rows in
    the order given (the table's own order is by name)."""
    if show_rev is None:
        show_rev = wide or any(r.revision for r in shown)
    rows = status_rows(shown if len(seen.order) < 2 else [], now, wide, seen.seen, show_rev)
    for name in seen.order if len(seen.order) > 1 else ():
        of_name = [r for r in shown if selects(name, r)]
        rows += status_rows(of_name, now, wide, seen.seen, show_rev)[1:]
    return rows


# -- --refresh: look now, act on nothing -------------------------------------------------


def refreshed(cfg: Config) -> tuple[list[Record], list[RecordProblem]]:
    """Every record as an observation now would judge it (plan's read-only half:
    liveness by pid and start time, the readiness probe of what is Starting)."""
    view = preview(cfg)
    observed, problems = view.observe(desired=_keyed(view, cfg))
    return [as_seen(v, cfg.node) for v in observed.records.values()], problems


def _keyed(view: Preview, cfg: Config) -> Desired | None:
    """The entries of the manifests this node's Starting records came from, where a key
    may come from outside the record, so that their probes present the key the pass's do
    (probekeys.py): envFrom's values and llama.cpp's key file are in no record, and a
    probe without them was refused (401), showing such an engine Starting while it was
    Ready. None: no such record (the look reads no manifest, imports no pydantic)."""
    records = view.store.peek().records.values()
    files = sorted({r.source for r in records if r.source and _keyed_outside(r, cfg.node)})
    if not files:
        return None
    from controller.store.sources.manifests import load

    loaded = load([Path(f) for f in files], insecure=cfg.insecure_manifests, backend=cfg.backend)
    return view.desired(loaded)  # a record whose spec is no longer its file's: its own key


def _keyed_outside(rec: Record, node: str) -> bool:
    """Starting here, with a spec that names envFrom or llama.cpp's --api-key-file."""
    if rec.phase is not Phase.STARTING or rec.elsewhere(node):
        return False
    args = rec.stored_spec.get("args") or []
    key_file = any(str(a).partition("=")[0] == "--api-key-file" for a in args)
    return bool(rec.stored_spec.get("envFrom")) or key_file


def as_seen(view: RecordView, node: str) -> Record:
    """``view``'s record with what was just seen: an engine gone, a probe passing."""
    rec = view.record
    if rec.elsewhere(node):
        return rec  # another node's engine: its pid means nothing here
    if rec.phase in (Phase.STARTING, Phase.READY) and rec.ref is not None and not view.alive:
        gone = view.exit
        text = str(gone) if gone else "exited"
        phase = _after_exit(rec, gone.code if gone else None)
        message = f"engine {text} ({REFRESHED})"
        return replace(rec, phase=phase, last_exit=gone or rec.last_exit, message=message)
    if rec.phase is Phase.STARTING and view.probe is not None and view.probe.ready:
        return replace(rec, phase=Phase.READY, message=f"{view.probe.detail} ({REFRESHED})")
    if rec.phase is Phase.STARTING and view.probe is not None and not rec.message:
        # What its probe answers now (kubectl's "Readiness probe failed"): a wrong health
        # path looked like a slow load until the deadline (600 s by default) failed it.
        return replace(rec, message=f"readiness probe: {view.probe.detail} ({REFRESHED})")
    return rec


def _after_exit(rec: Record, code: int | None) -> Phase:
    """The phase an exit leads to under the record's restartPolicy (the planner's rule)."""
    if rec.restart_policy == "Never":
        return Phase.FAILED
    if rec.restart_policy == "OnFailure" and code == 0:
        return Phase.SUCCEEDED
    return Phase.BACKOFF


# -- -w: print what changes ---------------------------------------------------------------


def watch(args: argparse.Namespace, cfg: Config, fmt: str) -> int:
    """Print every deployment, then each again whenever it changes, until interrupted
    (Ctrl-C) or the reader goes (a closed pipe ends it quietly, as `head` expects)."""
    shown: dict[str, str] = {}
    told: set[str] = set()  # the unreadable records named so far: each once
    first = True
    layout = Layout()
    source = SourceLine(cfg.state_dir)
    for _ in looks():
        seen = look(args, cfg, say=first)  # NAME gone later: shown as gone, said once
        if seen is None and first:
            return EXIT_FAIL
        seen = seen or Look([])
        changed, gone = _changes(seen, shown)
        if fmt == "json":
            for item in changed:
                print(json.dumps(item), flush=True)
        elif source.say_if_new() or changed or first:  # a new source line: every row again
            names = {i["name"] for i in changed} if changed and not source.anew else None
            seen.said_above = source.owner
            rows = seen.only(names)
            text = layout.rows(rows, wide=fmt == "wide") if rows.records else ""
            print(text or "No deployments.", flush=True)
        for name in gone:
            said = json.dumps({"name": name, "deleted": True}) if fmt == "json" else ""
            print(said or f"{name}   (gone)", flush=True)
        _say_new(seen.problems, told)
        if first:
            print(*seen.missing, sep="\n", file=sys.stderr, flush=True)
        first = False
    return EXIT_OK


@dataclass
class SourceLine:
    """`status -w`'s git source line, as `status` prints it above its table: said first,
    then again whenever it changes (a push applied, the folder gone at a commit)."""

    state_dir: Path
    said: str | None = None
    owner: str | None = None  # whose unread folder the line says: its rows leave it out
    anew: bool = False  # this look printed it

    def say_if_new(self) -> bool:
        found = _source_line(self.state_dir)
        line, self.owner = found or (None, None)
        self.anew = line is not None and line != self.said
        if self.anew:
            print(line, flush=True)
        self.said = line
        return self.anew


def _say_new(problems: list[str], told: set[str]) -> None:
    for problem in problems:
        if problem not in told:
            told.add(problem)
            print(f"error: {problem}", file=sys.stderr, flush=True)


@dataclass
class Layout:
    """`status -w`'s columns: set by the table it prints first (header included), so each
    later row lines up under that header (a wider cell widens its column from then on)."""

    widths: list[int] = field(default_factory=list)
    show_rev: bool | None = None

    def rows(self, seen: Look, *, wide: bool) -> str:
        shown = seen.shown()
        if self.show_rev is None:
            self.show_rev = wide or any(r.revision for r in shown)
        rows = ordered_rows(seen, shown, wide=wide, show_rev=self.show_rev, now=None)
        header = not self.widths
        self.widths = widths_of(rows, self.widths)
        return table(rows if header else rows[1:], self.widths)


def _changes(seen: Look, shown: dict[str, str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The items that differ from what was printed (``shown``, updated) and the names gone.
    Compared as the records hold them, less ``observed_at``: a pass that changed nothing,
    or a back-off's countdown, is no news (a changed item is printed as true now)."""
    changed = []
    current = set()
    stored = {item["name"]: item for item in items(seen, live=False)}
    for item in items(seen):
        current.add(item["name"])
        was = stored[item["name"]]
        key = json.dumps({k: v for k, v in was.items() if k != "observed_at"}, sort_keys=True)
        if shown.get(item["name"]) != key:
            shown[item["name"]] = key
            changed.append(item)
    gone = sorted(set(shown) - current)
    for name in gone:
        del shown[name]
    return changed, gone


def _source_line(state_dir: Path) -> tuple[str, str | None] | None:
    """A git source: what it runs, in one line, and the owner whose folder it says is gone
    or empty (None: the state dir follows none). The
    git source's module (subprocess, its codecs) is loaded only where there is one."""
    if not StateDir(state_dir).git_source.exists():
        return None
    from controller.cli.look.sourceverb import summary

    return summary(state_dir)


def _drain_or_none(cfg: Config) -> Drain | None:
    try:
        return read_drain(cfg.state_dir)
    except ConfigError as exc:  # status still shows the deployments
        print(f"warning: {exc}", file=sys.stderr)
        return None
