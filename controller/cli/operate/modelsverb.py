"""``reconcile models [prune [--dry-run]]``: the model cache, and pruning what no manifest names.

Prune is guarded like a pass's prune (invariant 5): a manifests folder that is missing,
empty or holds a file that failed to load removes nothing, since what it would have
named is unknown. What any record of this state dir names is kept too (an engine may
run on it), and so is an entry a pull is filling now (a manifest deleted mid-pull, or
another state dir's pull in a shared cache), with a line that says so.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from controller.cli.common import EXIT_FAIL, EXIT_OK, config
from controller.core.manifest.names import base_name
from controller.core.pulls import key_of_document, size_text
from controller.store.config.node import Config
from controller.store.instances.records import RecordStore
from controller.store.models.modelcache import CacheEntry, cache_root, entries
from controller.store.sources.manifests import LoadResult, load


def cmd_models(args: argparse.Namespace) -> int:
    cfg = config(args, lenient=args.action != "prune")
    if args.action == "prune":
        return _prune(cfg, dry_run=args.dry_run)
    return _list(cfg)


def _list(cfg: Config) -> int:
    from controller.cli.render.views import age, table

    found = entries(cache_root(cfg.state_dir))
    if not found:
        print(f"No models in {cache_root(cfg.state_dir)}.")
        return EXIT_OK
    users = _record_users(cfg)
    for key, declared in _declared(_load(cfg)).items():  # after `down`, a manifest's file
        users.setdefault(key, set()).update(declared)  # is still its: prune keeps it
    now = datetime.now(UTC)
    rows = [["KEY", "FILE", "SIZE", "LAST USED", "DEPLOYMENTS"]]
    for entry in found:
        used = entry.used()
        last = max((datetime.fromisoformat(t) for t in used.values()), default=None)
        # What prune keeps it for: a manifest's deployments and the records' (per
        # instance, `web@1`: the column names deployments). An engine's past use is LAST
        # USED's, not a user: after its manifest went, prune removes the file.
        names = sorted({base_name(n) for n in users.get(entry.key, set())})
        rows.append(
            [
                entry.key[:19],
                _file(entry),
                size_text(_size(entry)),
                f"{age(last, now)} ago" if last else "never",
                ",".join(names) or "-",
            ]
        )
    print(table(rows))
    return EXIT_OK


def _file(entry: CacheEntry) -> str:
    path = entry.model_path()
    if path is not None:
        return str(path.relative_to(entry.folder))
    copies = _on_nodes(entry)
    if copies:
        return copies
    result = entry.result()
    return "(failed)" if result and result.get("status") == "failed" else "(partial)"


def _on_nodes(entry: CacheEntry) -> str:
    """A cluster's pull: the file is in the caches of the nodes that pulled it (this
    host keeps the note of where); their own disks are not read from here."""
    held = entry.nodes().get("held") or {}
    names = sorted({str(c.get("path", "")).rpartition("/")[2] for c in held.values()})
    nodes = ",".join(sorted(str(n)[:8] for n in held))
    return f"{'/'.join(names)} (on node {nodes})" if held else ""


def _size(entry: CacheEntry) -> int:
    """Bytes here, or (a cluster's pull) the file's size on the nodes."""
    held = entry.nodes().get("held") or {}
    sizes = [c.get("bytes") for c in held.values() if isinstance(c.get("bytes"), int)]
    return max(sizes) if sizes and entry.model_path() is None else entry.size()


def _load(cfg: Config) -> LoadResult:
    return load(  # the fleet's: a name declared per node class keeps each one's model
        cfg.manifests,
        insecure=cfg.insecure_manifests,
        backend=cfg.backend,
        repo=cfg.repo,
        fleet=True,
    )


def _declared(loaded: LoadResult) -> dict[str, set[str]]:
    """Cache key -> the deployments whose manifests name it (each node class's too)."""
    out: dict[str, set[str]] = {}
    for entry in [*loaded.entries.values(), *(e for more in loaded.apart.values() for e in more)]:
        if (source := entry.deployment.spec.source) is not None:
            out.setdefault(source.key, set()).add(entry.name)
    return out


def _prune(cfg: Config, *, dry_run: bool) -> int:
    loaded = _load(cfg)
    refusal = _unsafe(loaded)
    if refusal is not None:
        for error in loaded.errors:  # which file, where: as validate names them
            print(f"error: {error}", file=sys.stderr)
        print(f"reconcile: nothing removed: {refusal}", file=sys.stderr)
        return EXIT_FAIL
    named = set(_declared(loaded)) | set(_record_users(cfg))
    verb = "would remove" if dry_run else "removed"
    unused = [e for e in entries(cache_root(cfg.state_dir)) if e.key not in named]
    if not unused:  # silence read as a prune that did not run (kubectl's "No resources found")
        print(f"No unused models in {cache_root(cfg.state_dir)}: nothing to prune.")
    for entry in unused:
        size = size_text(entry.size())
        if entry.busy():  # maybe another state dir's (a shared cache): said, not touched
            print(f"kept {entry.folder} ({size} so far): a pull is filling it; prune again later")
            continue
        if not dry_run:
            entry.remove()
        print(f"{verb} {entry.folder} ({size})")
    return EXIT_OK


def _unsafe(loaded: LoadResult) -> str | None:
    """Why the manifests cannot say what is unused (then nothing is removed), or None."""
    if loaded.missing_folders:
        return loaded.folder_problems()[0]
    if loaded.errors or loaded.broken_sources or loaded.invalid_names:
        return "a manifest failed to load: fix it first (`reconcile validate`)"
    if not loaded.entries:
        return loaded.no_manifest or "the manifests folder holds no manifest"
    return None


def _record_users(cfg: Config) -> dict[str, set[str]]:
    """Cache key -> the deployments whose records name it (any owner: they share it)."""
    out: dict[str, set[str]] = {}
    for rec in RecordStore(cfg.state_dir).peek().records.values():
        key = key_of_document(rec.stored_spec)
        if key is not None:
            out.setdefault(key, set()).add(rec.name)
    return out
