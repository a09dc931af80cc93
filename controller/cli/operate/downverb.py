"""`reconcile down [NAME...]`: stop what this manifest set owns on this node.

Each record is named as what happened to it: ``stopped`` for an engine that ran,
``removed`` for a record with nothing running (Pending, Idle, a rejected manifest: one
that never ran, or was preempted or parked since, which the record does not tell), and
an engine that could not be proven ours to stop (``not stopped``: why, exit 1) kept. A
`down` that stops nothing says which manifest set it looked for, and which sets own
the records that are there: run from another folder it must not look like success.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

from controller.cli.common import EXIT_FAIL, EXIT_OK, config, no_such, selected
from controller.cli.common import reconciler as build
from controller.core.manifest.names import base_name
from controller.core.state import EXITED, Phase, Record
from controller.store.config.node import Config


def cmd_down(args: argparse.Namespace) -> int:
    def chosen(rec: Record) -> bool:  # a NAME is a deployment: each of its replicas goes
        return selected(rec.labels, args) and (not args.names or base_name(rec.name) in args.names)

    reconciler = build(config(args, lenient=True))
    before = reconciler.store.load().records  # to say what each one was
    stopped, kept = reconciler.down(chosen, strays=not (args.names or args.selector))
    for name in stopped:
        print(_said(name, before.get(name), reconciler.config.state_dir))
    for name, why in sorted(kept.items()):  # running still: never "stopped" (invariant 3)
        print(f"reconcile: {name}: {why}", file=sys.stderr)
    others = [r for r in reconciler.elsewhere() if chosen(r)]
    found = {base_name(n) for n in [*stopped, *kept]} | {base_name(r.name) for r in others}
    missing = set(args.names) - found
    owner = reconciler.config.owner
    mine = {base_name(r.name) for r in before.values() if r.owner == owner} - found
    for name in sorted(missing):  # with the name it is one slip from, else those there are
        said = no_such(name, mine, "this set here").removeprefix("reconcile: ")
        print(f"reconcile: {said}", file=sys.stderr)
    here = reconciler.config.node  # a shell without the daemon's --node is another node
    for rec in others:
        print(
            f"reconcile: {rec.name} runs on node {rec.node}, and this run is node {here}"
            " (--node, RECONCILE_NODE, else the host name): run `reconcile down` there",
            file=sys.stderr,
        )
    if not stopped and not kept and not others and not (missing and mine):  # others own them
        _nothing(owner, [r for r in before.values() if chosen(r)])
    undone = [before[n] for n in stopped if n in before]
    _undone_by_daemon(reconciler.config, reconciler.reads(), undone)
    if args.gateway:  # the gateway serves the state dir, not a set: only when asked
        from controller.cli.gateway.gatewayverbs import stop_gateways

        for info in stop_gateways(reconciler.config.state_dir.absolute()):
            print(f"stopped gateway pid {info.ref.pid} ({info.address})")
    return EXIT_FAIL if others or missing or kept else EXIT_OK


def _undone_by_daemon(cfg: Config, labels: Mapping[str, str] | None, stopped: list[Record]) -> None:
    """A daemon on the state dir starts what its manifests declare at its next pass: a
    `down` it undoes seconds later without a word looks like a crash (issue 34).
    ``labels``: the node's share, read as the daemon reads it (``Reconciler.reads``): a
    name declared for two node classes is the one this node selects, not a duplicate."""
    from controller.cli.operate.restartverb import daemon_running
    from controller.core.manifest.names import in_repo
    from controller.store.sources.manifests import load

    daemon = daemon_running(cfg.state_dir, [r.owner for r in stopped]) if stopped else None
    if daemon is None:
        return
    declared = load(cfg.manifests, insecure=cfg.insecure_manifests, labels=labels).entries
    sources: dict[str, str] = {}
    for rec in stopped:
        entry = declared.get(base_name(rec.name))
        if entry is not None:
            sources.setdefault(entry.name, f"{in_repo(cfg.repo, entry.source)}:{entry.line}")
    # A git source's checkout is the node's copy: the manifest changes in the repository.
    if cfg.repo:
        keep = "remove it from the repository, or set `replicas: 0` in it, and push"
    else:
        keep = "remove that manifest (or move it out of the folder), or set `replicas: 0` in it"
    for name, where in sorted(sources.items()):
        print(
            f"reconcile: the daemon (pid {daemon}) on this state dir starts {name} again at its "
            f"next pass: its manifest ({where}) still declares it. To keep it down, {keep}",
            file=sys.stderr,
        )


def _said(name: str, rec: Record | None, state_dir: Path) -> str:
    """What became of it: an engine stopped, or a record removed with nothing running
    (an engine that had ended: Failed, Succeeded, in BackOff; or nothing running: one that
    never ran, or one preempted or parked since, so never "never ran"). A Pulling one's
    download outlives `down` (the cache is shared): "nothing running" hid it going on."""
    if rec is not None and rec.phase in EXITED:
        return f"removed {name} ({rec.phase}: not running)"
    if rec is not None and not (rec.ref is not None or rec.holds):
        if rec.phase is Phase.PULLING and _downloading(rec, state_dir):
            return (
                f"removed {name} (Pulling: no engine ran; its download goes on to finish "
                "in the model cache: `reconcile models` lists it)"
            )
        return f"removed {name} ({rec.phase}: nothing running)"
    return f"stopped {name}"


def _downloading(rec: Record, state_dir: Path) -> bool:
    """A local pull of the record's source holds its cache entry's lock now."""
    from controller.core.pulls import key_of_document
    from controller.store.models.modelcache import CacheEntry, cache_root

    key = key_of_document(rec.stored_spec)
    if key is None:
        return False
    try:
        return CacheEntry.of(cache_root(state_dir), key).busy()
    except (OSError, ValueError):  # a lock this user may not take, a key of another shape
        return False


def _nothing(owner: str, records: list[Record]) -> None:
    """Nothing of this set was here: say which set that is, and whose records are."""
    print(
        f"reconcile: nothing to stop: manifest set {owner!r} owns no deployment here "
        "(a set is named by its -f folders' absolute paths, or --owner)",
        file=sys.stderr,
    )
    sets: defaultdict[str, set[str]] = defaultdict(set)
    for rec in records:
        if rec.owner != owner:
            sets[rec.owner].add(base_name(rec.name))
    for other, names in sorted(sets.items()):
        print(
            f"reconcile: records of manifest set {other!r} are here ({', '.join(sorted(names))}):"
            f" {_down_of(other)}, or add --owner {other!r}",
            file=sys.stderr,
        )


def _down_of(owner: str) -> str:
    """How to name the set ``owner`` to `down`: a git source's by its URL and path (it has
    no folder to run from: its checkout moves with the commit)."""
    url, hashed, path = owner.removeprefix("git:").rpartition("#")
    if not owner.startswith("git:") or not hashed:
        return "run `reconcile down` from that folder"
    return f"run `reconcile down --git {url} --git-path {path}`"
