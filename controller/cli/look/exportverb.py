"""`reconcile export`: the manifests as Kubernetes objects, for a move to a cluster.

Everything is built before anything is printed: on any error stdout stays empty, so
``reconcile export | kubectl apply -f -`` never applies half a set.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from controller.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, config, output_format
from controller.core.kubernetes.export import Exported, ExportError, ExportGap, Object, export
from controller.core.manifest.specs import Entry, is_dns1123
from controller.store.config.node import Config
from controller.store.sources.manifests import LoadResult, ManifestError, load

FORMATS = ("yaml", "json")


@dataclass
class Outcome:
    objects: list[Object] = field(default_factory=list)
    errors: list[ManifestError] = field(default_factory=list)
    warnings: list[ManifestError] = field(default_factory=list)


def cmd_export(args: argparse.Namespace) -> int:
    fmt = output_format(args, "yaml", FORMATS)
    if fmt is None:
        return EXIT_USAGE
    if args.namespace is not None and not is_dns1123(args.namespace):
        print(f"reconcile: --namespace {args.namespace!r} is not a DNS-1123 label", file=sys.stderr)
        return EXIT_USAGE
    cfg = config(args, lenient=True)
    unapplied = _git_unapplied(cfg)
    if unapplied is not None:
        print(f"error: {unapplied}", file=sys.stderr)
        return EXIT_FAIL
    loaded = load(cfg.manifests, insecure=cfg.insecure_manifests, repo=cfg.repo)
    # A mistyped -f exports nothing: exit 1 as `validate` does, so `export -f typo |
    # kubectl apply -f -` in a script fails instead of going green with nothing applied.
    missing = loaded.folder_errors()  # an unusable one's error is among loaded.errors
    for problem in missing:
        print(f"error: {problem}", file=sys.stderr)
    outcome = Outcome(errors=list(loaded.errors))
    if not loaded.errors:  # invalid input: say so, as `validate` does, and export nothing
        outcome = convert(loaded, lossy=args.lossy, namespace=args.namespace)
    for warning in outcome.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for error in outcome.errors:
        print(f"error: {error}", file=sys.stderr)
    if outcome.errors or missing:
        return EXIT_FAIL
    if outcome.objects:
        print(render(outcome.objects, fmt))
    return EXIT_OK


def _git_unapplied(cfg: Config) -> str | None:
    """Why ``--git URL`` has nothing of URL's to export, else None. The export reads the
    state dir's checkout at the commit a pass applied: of another source when the state
    dir follows one (its objects, exported under URL's name), of none before the first
    pass (a missing folder, said as if the repository lacked it)."""
    if cfg.git is None:
        return None
    from controller.store.sources.git.source import followed_instead, peek_status, shown_url

    url = shown_url(cfg.git.url)
    other = followed_instead(cfg.state_dir, cfg.git)
    if other is not None:
        return (
            f"this state dir follows {other.said()}, not {url}: export reads the commit a "
            f"pass applied, and none of {url} was (export a clone of it with -f DIR, or "
            "give the --state-dir that follows it)"
        )
    status = peek_status(cfg.state_dir)
    if status is not None and status.applied:
        return None
    failed = f" (its fetch failed: {status.fetch_error})" if status and status.fetch_error else ""
    return (
        f"nothing applied yet from {url}{failed}: export reads the commit a pass applied; "
        "run one first (`reconcile --once`, or the daemon), or export a clone with -f DIR"
    )


def convert(loaded: LoadResult, *, lossy: bool, namespace: str | None) -> Outcome:
    """Every valid deployment, by name, with its problems placed at file, line and field."""
    outcome = Outcome()
    printed: set[tuple[str, str]] = set()
    for _name, entry in sorted(loaded.entries.items()):
        try:
            folder = str(PurePath(entry.source).parent)  # a sopsFile is relative to it
            exported: Exported = export(
                entry.deployment, lossy=lossy, namespace=namespace, folder=folder
            )
        except ExportError as exc:
            outcome.errors.extend(_located(loaded, entry, p, ERROR_MOVE) for p in exc.problems)
            continue
        outcome.objects.extend(_once(exported.objects, printed))
        outcome.warnings.extend(_located(loaded, entry, p, DROPPED) for p in exported.dropped)
        outcome.warnings.extend(_located(loaded, entry, p, DROPPED) for p in exported.notes)
    return outcome


def _once(objects: tuple[Object, ...], printed: set[tuple[str, str]]) -> list[Object]:
    """``objects`` not printed yet: a PriorityClass is cluster-wide and one per value, so
    each deployment of that priority brings the same one (a GitOps tool refuses a twin)."""
    out = []
    for obj in objects:
        key = (obj["kind"], obj["metadata"]["name"])
        if key not in printed:
            printed.add(key)
            out.append(obj)
    return out


ERROR_MOVE = "; {fix}, or pass --lossy to {lossy}"
DROPPED = "; {done} (--lossy)"


def _located(loaded: LoadResult, entry: Entry, problem: ExportGap, move: str) -> ManifestError:
    """The problem where `validate` would put it: file, line, field path."""
    said = move.format(fix=problem.fix, lossy=problem.lossy, done=problem.done)
    message = problem.message + (said if problem.droppable else "")
    line = loaded.line_of(entry, problem.field)
    where = ".".join(problem.field)
    return loaded.error(ManifestError(entry.source, line, where, message, entry.name))


# Plain scalars that PyYAML (YAML 1.1) writes unquoted but kubectl's reader (go-yaml, with
# YAML 1.2's floats and its own y/n booleans) takes for a number or a bool: the API server
# then refuses a string field (`env: [{value: 1e3}]`: "cannot unmarshal number into Go
# struct field EnvVar...value of type string"). Such strings are quoted.
KUBECTL_NOT_STRINGS = (
    ("tag:yaml.org,2002:bool", r"^(?:y|Y|n|N)$"),
    ("tag:yaml.org,2002:float", r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$"),
    ("tag:yaml.org,2002:int", r"^[-+]?0[oObBxX][0-9a-fA-F_]+$"),
)


def render(objects: list[Object], fmt: str) -> str:
    if fmt == "json":  # one document: kubectl applies a v1 List like any object
        listing: dict[str, Any] = {"apiVersion": "v1", "kind": "List", "items": objects}
        return json.dumps(listing, indent=2)
    import yaml

    class KubectlDumper(yaml.SafeDumper):
        """SafeDumper that quotes what kubectl would not read back as a string."""

    for tag, pattern in KUBECTL_NOT_STRINGS:
        KubectlDumper.add_implicit_resolver(tag, re.compile(pattern), None)
    KubectlDumper.add_representer(str, _string)
    text: str = yaml.dump_all(objects, Dumper=KubectlDumper, sort_keys=False, allow_unicode=True)
    return text.rstrip()


# Line breaks besides \n that PyYAML writes raw inside a quoted scalar, where a reader
# folds NEL (U+0085) into a space: written double-quoted, they are escapes (\N, \L, \P).
RAW_BREAKS = frozenset("\x85\u2028\u2029")


def _string(dumper: Any, data: str) -> Any:
    style = '"' if RAW_BREAKS.intersection(data) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)
