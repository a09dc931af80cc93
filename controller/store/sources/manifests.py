"""The only YAML reader: manifest folders -> (specs, per-file errors with file and line).

Each file is bounded (size, node count, depth) so a hostile or broken file costs
little, and a broken file never hides the deployments it declared before: its
path is reported in ``broken_sources`` and the pass leaves those records alone.
A pass's files already parsed come from the parse cache (store/sources/parsecache.py);
yaml is imported only for one that is not.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from controller.core.manifest import hints
from controller.core.manifest.backendnames import on_cluster
from controller.core.manifest.cluster import cluster_refusals
from controller.core.manifest.excerpt import clip, did_you_mean, short
from controller.core.manifest.labels import disjoint, matches
from controller.core.manifest.labelsyntax import key_problem, value_problem
from controller.core.manifest.names import in_repo
from controller.core.manifest.specerrors import Loc, Written, problems
from controller.core.manifest.specs import (
    Deployment,
    DeploymentSpec,
    Entry,
    fields_at,
    is_dns1123,
    routable_names,
    spec_hash,
    with_config,
)
from controller.store.sources import bounded, security
from controller.store.sources.bounded import Document, Path_
from controller.store.sources.engineconfig import config_digest, config_problem
from controller.store.sources.keyfile import first_key, key_file_bytes, key_file_problem
from controller.store.sources.parsecache import ParseCache

SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True, slots=True)
class ManifestError:
    file: str
    line: int | None
    field: str | None
    message: str
    name: str | None = None  # the deployment it concerns, when known
    shown: str | None = None  # ``file`` as its user names it (a git source's: as in the repository)
    # Its fix is on this node, not in the manifests (an envFrom file's mode, the node's age
    # key): a git source's next move is then no push (``state_of``).
    on_node: bool = False

    def __str__(self) -> str:
        where = (self.shown or self.file) + (f":{self.line}" if self.line else "")
        what = f"{self.field}: " if self.field else ""
        return f"{where}: {what}{self.message}"


@dataclass
class LoadResult:
    entries: dict[str, Entry] = field(default_factory=dict)
    errors: list[ManifestError] = field(default_factory=list)
    # Files that could not be read or parsed at all: the names they declare are unknown.
    broken_sources: set[str] = field(default_factory=set)
    # Names declared by documents that failed validation (or duplicates): leave them be.
    # Each message names its file as the user does (``error``): it becomes the record's.
    invalid_names: dict[str, str] = field(default_factory=dict)
    # Where each name was first declared (``file:line`` of its metadata.name), valid or not.
    declared: dict[str, str] = field(default_factory=dict)
    # Of those, the nodeSelector each states where it can be read: a broken manifest for
    # other nodes is no record here (the error is still an error).
    invalid_selectors: dict[str, dict[str, str]] = field(default_factory=dict)
    # Files with nothing in them (zero bytes, blanks): a save cut short, a full disk. What
    # such a file declared is left be; a file of only comments declares nothing by choice.
    emptied: set[str] = field(default_factory=set)
    missing_folders: list[str] = field(default_factory=list)
    # Of those, the ones that are there but unusable (a file, no permission): why, in words.
    unusable: dict[str, str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    documents: int = 0  # non-empty YAML documents read, valid or not
    # Not read at all (a git source with no commit of its own checked out yet): its
    # folders count as missing, and prune nothing even under --allow-empty.
    unread: bool = False

    def line_of(self, entry: Entry, loc: Sequence[str | int]) -> int | None:
        """Where a later check of a valid spec (`reconcile export`) points, as load errors do."""
        return entry.line_at(loc)

    # With no manifest found: `no manifest in DIR (what it holds instead)` (nearmiss.py).
    no_manifest: str = ""
    backend: str = "local"  # the backend the specs are for: a cluster refuses some fields
    repo: Path | None = None  # the git checkout the folders are in (``load``)
    # The node whose share is read (its labels, ``load``): a name is declared twice only
    # when it selects both. None: every declaration, each name once (one cluster, export).
    labels: Mapping[str, str] | None = None
    # No node's share but the fleet's (`validate`): a name is declared twice only where
    # one node could select both; the others of a name are kept apart here.
    fleet: bool = False
    apart: dict[str, list[Entry]] = field(default_factory=dict)

    def elsewhere(self, entry: Entry) -> bool:
        """``entry`` is another node's: its nodeSelector does not match ``labels``."""
        return self.labels is not None and not matches(entry.deployment.spec.node_selector,
                                                       self.labels)  # fmt: skip

    def named(self, file: str) -> str:
        """``file`` as its user names it: a git source's as the repository does."""
        return in_repo(self.repo, file)

    def error(self, error: ManifestError) -> ManifestError:
        """``error`` naming its file as its user does (``named``)."""
        return replace(error, shown=self.named(error.file)) if self.repo else error

    def folder_problems(self) -> list[str]:
        """Each missing folder in words: `-f /etc/passwd` is there, so not "does not exist";
        a git source's path as the repository names it, at its commit."""
        return [self._folder_problem(f) for f in self.missing_folders]

    def folder_errors(self) -> list[str]:
        """The folder problems a verb prints beside ``errors``: an unusable folder's error
        is one of those already, with the next move (`-f /etc/passwd` was said 2-3 times)."""
        return [self._folder_problem(f) for f in self.missing_folders if f not in self.unusable]

    def _folder_problem(self, folder: str) -> str:
        if self.repo is not None:
            why = self.unusable.get(folder, "no such folder")
            return f"{self.named(folder)}: {why} at the applied commit{self.near_folder(folder)}"
        if folder in self.unusable:
            return f"manifests folder {folder} {self.unusable[folder]}"
        return missing_text(folder)

    def near_folder(self, folder: str) -> str:
        """`` (did you mean manifests? ...)`` when a git source's path, missing at its
        commit, is one slip from a folder the repository has there ("" otherwise)."""
        if self.repo is None or folder in self.unusable:
            return ""
        top = self.repo
        found = [p.relative_to(top) for p in (*top.glob("*"), *top.glob("*/*")) if p.is_dir()]
        names = [str(p) for p in found if ".git" not in p.parts]
        near = did_you_mean(self.named(folder), names, cutoff=0.6)
        return f" (did you mean {near}? --git-path, or git.path in node.yaml)" if near else ""

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def prune_safe(self) -> bool:
        """False when a folder is missing or holds no manifest (invariant 5).

        A file with no document (empty, all comments: a truncated checkout) is no
        manifest; a file that cannot be parsed may be one, so it counts.
        """
        has_manifest = self.documents > 0 or bool(self.broken_sources)
        return not self.missing_folders and has_manifest


def _validation_errors(
    exc: ValidationError,
    value: Any,
    file: str,
    lines: dict[Path_, int],
    name: str | None,
    text: str,
) -> list[ManifestError]:
    out = []
    for problem in problems(exc, value, _written_in(text, lines)):
        message = problem.message
        if problem.unknown:
            message = _unknown_field(problem.loc, value, lines)
        loc = problem.loc
        out.append(
            ManifestError(
                file, bounded.line_for(lines, loc), bounded.field_path(loc), message, name
            )
        )
    # In the file's order, as a reader goes down it (pydantic's is the model's fields':
    # line 12, 13, 9, 8...); the first, which status shows, is the topmost.
    return sorted(out, key=lambda error: error.line or 0)


def _written_in(text: str, lines: dict[Path_, int]) -> Written:
    """How a value was written in the file's ``text`` (a hint quotes that, not Python's)."""

    def written(loc: Loc, value: object) -> str | None:
        line = lines.get(tuple(loc))
        if line is None:
            return None
        from controller.store.sources import yamlread  # yaml only when a hint needs it

        return yamlread.written_scalar(text, line, value)

    return written


def _number_not_as_written(
    value: dict[str, Any], lines: dict[Path_, int], text: str
) -> tuple[Loc, str] | None:
    """An env value or argv item YAML read as a number whose text differs from what was
    written: the engine would get "493" for ``0755``, "1.1" for ``1.10``, "0" for a
    sha256 of zeros. Which text was meant is the writer's to say, by quoting it."""
    spec = value.get("spec")
    if not isinstance(spec, dict):
        return None
    source = text.splitlines()
    for loc, item in _argv_and_env(spec):
        if not isinstance(item, int | float) or isinstance(item, bool) or loc not in lines:
            continue
        at = lines[loc] - 1  # YAML's line breaks are Python's but for \v \f \x1c-\x1e: a guard
        if at < len(source) and _as_it_reads(source[at], str(item)):
            continue  # `THREADS: 8`: no YAML scan (a cached pass imports no yaml)
        written = _written_in(text, lines)(loc, item)
        if written is not None and written != str(item):
            return loc, f"the engine would get {json.dumps(str(item))}" + hints.for_text(
                item, written
            )
    return None


def _as_it_reads(line: str, number: str) -> bool:
    """``number`` stands on ``line`` as a word of its own: it was written as it reads."""
    return re.search(rf"(?<![\w.+-]){re.escape(number)}(?![\w.])", line) is not None


def _argv_and_env(spec: dict[str, Any]) -> Iterable[tuple[Loc, object]]:
    for field_ in ("command", "args"):
        items = spec.get(field_)
        if isinstance(items, list):
            yield from ((("spec", field_, i), item) for i, item in enumerate(items))
    env = spec.get("env")
    if isinstance(env, dict):
        yield from ((("spec", "env", key), item) for key, item in env.items())


def _unknown_field(loc: Sequence[str | int], value: object, lines: dict[Path_, int]) -> str:
    """An unknown field's message, with the known field it is one slip away from."""
    under = _indented_out_of(tuple(loc), value, lines)
    if under is not None:  # an exact name of the mapping above beats a near one here
        return under
    known = fields_at(tuple(loc[:-1]))
    meant = did_you_mean(str(loc[-1]), known) if loc else None
    if meant is not None:
        return f"unknown field: did you mean `{meant}`?"
    instead = hints.elsewhere(tuple(loc[:-1]), str(loc[-1])) if loc else None
    if instead is not None:  # Kubernetes' `readinessProbe`, compose's `environment`
        return f"unknown field: reconcile's is {instead}"
    return "unknown field (check the spelling; `reconcile schema` lists fields)"


def _indented_out_of(loc: Path_, value: object, lines: dict[Path_, int]) -> str | None:
    """The mapping written above ``loc`` whose field it is: a line indented too little
    (`spec:`, then `engine:` at column 0) falls out of that mapping into its parent."""
    if not loc:
        return None
    parent, word, at = loc[:-1], str(loc[-1]), lines.get(loc)
    held = _value_at(value, parent)
    if not isinstance(held, dict) or at is None:
        return None
    above = [
        (lines[(*parent, key)], key)
        for key, inner in held.items()
        if isinstance(key, str)
        and (inner is None or (isinstance(inner, dict) and word not in inner))
        and lines.get((*parent, key), at) < at
        and word in fields_at((*parent, key))
    ]
    if not above:
        return None
    line, key = max(above)  # the nearest mapping above is the one it fell out of
    owner = bounded.field_path((*parent, key))
    return f"unknown field: it is a field of `{owner}` (line {line}): indent it under `{key}:`"


def _value_at(value: object, path: Path_) -> object:
    for part in path:
        if isinstance(part, int):
            value = value[part] if isinstance(value, list) and part < len(value) else None
        else:
            value = value.get(part) if isinstance(value, dict) else None
    return value


def load_file(
    path: Path, result: LoadResult, strict: bool = False, cache: ParseCache | None = None
) -> None:
    file = str(path)
    try:
        raw = bounded.read_bounded(path, strict)
        text = raw.decode("utf-8")
    except security.InsecureManifest as exc:
        _broken(result, ManifestError(file, None, None, str(exc)))
        return
    except UnicodeDecodeError as exc:
        from controller.store.sources.yamlread import not_utf8

        line, problem = not_utf8(exc)
        _broken(result, ManifestError(file, line, None, f"cannot read: {problem}"))
        return
    except (OSError, RuntimeError) as exc:
        _broken(result, ManifestError(file, None, None, f"cannot read: {_os_words(exc, file)}"))
        return
    if not raw.strip():
        result.emptied.add(file)
    values = cache.get(raw) if cache is not None else None
    if values is None:
        values = _parse(text, file, result)
        if values is None:
            return
        if cache is not None:
            cache.put(raw, values)
    result.documents += len(values)
    for value, lines, line in values:
        _load_document(value, lines, line, file, result, text)
        _note_declared(result, value, lines, file)


def _note_declared(result: LoadResult, value: Any, lines: dict[Path_, int], file: str) -> None:
    """Where a name was first declared, valid or not: a later duplicate names that line."""
    meta = value.get("metadata") if isinstance(value, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    if isinstance(name, str) and is_dns1123(name):
        at = bounded.line_for(lines, ("metadata", "name"))
        result.declared.setdefault(name, f"{result.named(file)}:{at}")


def _parse(text: str, file: str, result: LoadResult) -> list[Document] | None:
    """The file's documents, or None with the file marked broken (where, and why)."""
    import yaml

    from controller.store.sources import yamlread, yamlwords

    try:
        return yamlread.documents(text)
    except yaml.MarkedYAMLError as exc:
        line, problem = yamlwords.syntax_error(exc, text)
        _broken(result, ManifestError(file, line, None, problem))
    except yaml.reader.ReaderError as exc:  # a character YAML refuses (NUL, ...): say where
        _broken(result, ManifestError(file, *_none_field(yamlread.reader_error_line(text, exc))))
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        _broken(result, ManifestError(file, None, None, f"invalid YAML: {exc}"))
    return None


def _os_words(exc: OSError | RuntimeError, path: str) -> str:
    """Why a file or folder could not be read, and the next move, without errno's numbers
    (``[Errno 13] Permission denied: '<the path again>'``)."""
    if isinstance(exc, PermissionError):
        return (
            f"permission denied to reconcile's user (uid {os.geteuid()}): make it readable "
            "to that user, or run reconcile as its owner"
        )
    loop = "loop" in str(exc) if isinstance(exc, RuntimeError) else exc.errno == errno.ELOOP
    if loop:  # Python's Path.resolve raises RuntimeError for it (3.11, 3.12)
        return "a symlink loop: point the link at a file"
    target = exc.filename if isinstance(exc, FileNotFoundError) else None
    if target is not None and str(target) != path:  # read through a link (bounded.py)
        return f"a symlink to {_tail(str(target))!r}, which does not exist"
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def _tail(path: str, most: int = 80) -> str:
    """A long path cut at its head: its file's name is what the reader looks for (cut at
    the end, a deep folder's link lost it, as `short` does to any text)."""
    return path if len(path) <= most else "…" + path[-(most - 1) :]


def _none_field(where: tuple[int, str]) -> tuple[int, None, str]:
    return where[0], None, where[1]


def _broken(result: LoadResult, error: ManifestError) -> None:
    result.errors.append(error)
    result.broken_sources.add(error.file)


def _load_document(
    value: Any, lines: dict[Path_, int], line: int, file: str, result: LoadResult, text: str
) -> None:
    if not isinstance(value, dict):
        result.errors.append(ManifestError(file, line, None, _not_a_mapping(value)))
        result.broken_sources.add(file)
        return
    foreign = _foreign_kind(value)
    if foreign is not None:  # a Kubernetes object (or other tool's file) in the folder
        result.errors.append(ManifestError(file, line, "apiVersion", foreign))
        result.broken_sources.add(file)
        return
    meta = value.get("metadata")
    raw_name = meta.get("name") if isinstance(meta, dict) else None
    name = raw_name if is_dns1123(raw_name) else None
    try:
        deployment = Deployment.model_validate(value)
    except ValidationError as exc:
        errors = _validation_errors(exc, value, file, lines, name, text)
        result.errors.extend(errors)
        if name is None:
            result.broken_sources.add(file)  # which deployment it was is unknown
        else:
            result.invalid_names.setdefault(name, str(result.error(errors[0])))
            selector = _raw_selector(value)
            if selector:
                result.invalid_selectors.setdefault(name, selector)
        return
    # `MODE: 0755` reached the engine as "493", `"-ngl 99"` as one word: refused, not guessed
    lossy = _number_not_as_written(value, lines, text) or _glued_flag(deployment.spec)
    if lossy is not None:
        _invalid(result, deployment, file, lines, *lossy)
        return
    problem = _recipe_problem(deployment)
    if problem is not None:  # a spec its engine's recipe refuses (no model...): invalid too
        field_ = re.search(r"\bspec\.\w+", problem)
        loc = tuple(field_.group().split(".")) if field_ else ("spec",)
        _invalid(result, deployment, file, lines, loc, problem)
        return
    # vLLM's --config file sets what the recipe sets or reads; on a cluster the file is
    # the engine's node's, not this one's.
    config = None if on_cluster(result.backend) else config_problem(deployment.spec)
    if config is None and not on_cluster(result.backend):  # llama.cpp's, read for the probes
        config = key_file_problem(deployment.spec)
    if config is not None:
        index, why = config
        _invalid(result, deployment, file, lines, ("spec", "args", index), why)
        return
    clash = _mount_clash(deployment.spec)
    if clash is not None:  # checked here, not by the model: a stored record's spec loads
        index, why = clash
        at = ("spec", "container", "volumes", index)
        path = f"spec.container.volumes[{index}]"
        error = ManifestError(file, bounded.line_for(lines, at), path, why, deployment.name)
        result.errors.append(error)
        result.invalid_names.setdefault(deployment.name, str(result.error(error)))
        result.invalid_selectors.setdefault(deployment.name, deployment.spec.node_selector)
        return
    refusals = cluster_refusals(deployment.spec, result.backend)
    if refusals:  # fields the cluster backend cannot honour: invalid there, named
        for path, why in refusals:
            loc = tuple(path.split("."))
            error = ManifestError(file, bounded.line_for(lines, loc), path, why, deployment.name)
            result.errors.append(error)
        first = result.errors[-len(refusals)]
        result.invalid_names.setdefault(deployment.name, str(result.error(first)))
        result.invalid_selectors.setdefault(deployment.name, deployment.spec.node_selector)
        return
    # vLLM's --config file, read here (a local node's): its edit is a change of the spec
    digest = "" if on_cluster(result.backend) else config_digest(deployment.spec)
    hash_ = with_config(spec_hash(deployment.spec), digest)
    # llama.cpp's key file, read here once: its first key for the probes, its bytes for
    # the hash (keyed by the pass: reconciler/run.resolve_secrets)
    keys = None if on_cluster(result.backend) else key_file_bytes(deployment.spec)
    key = "" if keys is None else first_key(keys)
    _add(
        result,
        Entry(
            deployment,
            file,
            line,
            hash_,
            config_digest=digest,
            file_key=key,
            key_file=keys,
            field_lines=lines,
        ),
    )


def _glued_flag(spec: DeploymentSpec) -> tuple[Loc, str] | None:
    """An argv item of args (or command, past its program) that is a flag and its value."""
    for name, items in (("command", (spec.command or ())[1:]), ("args", spec.args)):
        glued = hints.glued_flag(items)
        if glued is not None:
            index, why = glued
            return ("spec", name, index + (name == "command")), why
    return None


def _invalid(
    result: LoadResult,
    deployment: Deployment,
    file: str,
    lines: dict[Path_, int],
    loc: tuple[str | int, ...],
    problem: str,
) -> None:
    """A valid document its engine would not run as written: an error at ``loc``'s line,
    named by its field (an item of spec.args is spec.args)."""
    where = ".".join(part for part in loc if isinstance(part, str))
    line = bounded.line_for(lines, loc)
    error = ManifestError(file, line, where, problem, deployment.name)
    result.errors.append(error)
    result.invalid_names.setdefault(deployment.name, str(result.error(error)))
    result.invalid_selectors.setdefault(deployment.name, deployment.spec.node_selector)


def _not_a_mapping(value: Any) -> str:
    """A document that is no mapping; a list of manifests (`- apiVersion: ...`) is the one
    people write, for a file of several."""
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return (
            "a document must be a mapping, not a list of them: write each manifest as its "
            "own document, separated by a line `---`"
        )
    kind = {list: "a list", str: "text", bool: "a boolean"}.get(type(value), "a number")
    return f"a document must be a mapping (apiVersion: reconcile/v1, kind: ...), not {kind}"


def _raw_selector(value: dict[Any, Any]) -> dict[str, str]:
    """An invalid document's ``spec.nodeSelector`` when it is a valid one itself, else {}
    (a node that cannot tell whose it is treats it as its own: the error is shown)."""
    spec = value.get("spec")
    raw = spec.get("nodeSelector") if isinstance(spec, dict) else None
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and not key_problem(k) and not value_problem(v)
        for k, v in raw.items()
    ):
        return {}
    return dict(raw)


def _foreign_kind(value: dict[Any, Any]) -> str | None:
    """Why a document that names another apiVersion is not ours (None: it may be ours).

    ``kubectl``'s ``apps/v1`` Deployment in the folder is not a reconcile manifest with
    errors: it gets no record (nothing to show as Pending), only this message.
    """
    api, kind = value.get("apiVersion"), value.get("kind")
    if not {"apiVersion", "kind", "metadata", "spec"} & set(value):
        # a CI workflow, a compose file: each of its keys would be "unknown field"
        return (
            "not a reconcile manifest (no apiVersion, kind, metadata or spec: another "
            "tool's file?): reconcile reads apiVersion reconcile/v1, kind Deployment; keep "
            "other files out of the manifests folder"
        )
    if not isinstance(api, str) or api == "reconcile/v1" or not api or _ours(value):
        return None
    what = f"{clip(api)} {clip(kind)}" if isinstance(kind, str) else clip(api)
    return (
        f"not a reconcile manifest ({what}): reconcile reads apiVersion reconcile/v1, kind "
        "Deployment; keep Kubernetes objects out of the manifests folder (`reconcile export` "
        "makes them from it)"
    )


def _ours(value: dict[Any, Any]) -> bool:
    """A document with ``spec.engine`` is a reconcile manifest whatever its apiVersion
    (``v1``, ``apps/v1`` out of habit): it is checked as one, so the error is that field's
    and its deployment shows as invalid, not "keep Kubernetes objects out"."""
    spec = value.get("spec")
    return isinstance(spec, dict) and "engine" in spec


def _recipe_problem(deployment: Deployment) -> str | None:
    """Render the spec once with stand-in ports: what the recipe refuses, before any pass."""
    from controller.core.engines import RecipeError, recipe_for
    from controller.core.render import render

    extra = tuple(range(2, 2 + recipe_for(deployment.spec.engine).extra_ports))
    # A spec.source gives the recipe its model: the file a pull will put in the cache.
    pulled = "/stand-in/pulled-model" if deployment.spec.source is not None else None
    entry = Entry(deployment, "", 0, "")
    try:
        render(entry, devices=(), port=1, extra_ports=extra, model_path=pulled)
    except RecipeError as exc:
        return str(exc)
    return None


def _mount_clash(spec: DeploymentSpec) -> tuple[int, str] | None:
    """The first volume mounted where an earlier one is (podman and docker refuse two
    mounts at one container path, but only at the start) and why; None: none is."""
    volumes = spec.container.volumes if spec.container is not None else ()
    seen: dict[str, int] = {}
    for index, volume in enumerate(volumes):
        inside = posixpath.normpath(volume.split(":")[1])  # `/x/` and `/x` are one place
        if inside in seen:
            return index, (
                f"volume {short(volume)} mounts at {inside}, as volumes[{seen[inside]}] "
                "does: podman and docker refuse two mounts at one container path when the "
                "engine starts; keep one, or mount this one elsewhere"
            )
        seen[inside] = index
    return None


def _add(result: LoadResult, entry: Entry) -> None:
    name = entry.name
    first = result.entries.get(name)
    if first is None and name not in result.invalid_names:
        result.entries[name] = entry
        return
    # One name for two node classes (`chat` with gpu=a100 and with gpu=h100): a node reads
    # only what its labels select, so it is declared twice only where they select both, as
    # a Kubernetes name is unique within its namespace alone.
    if result.elsewhere(entry):
        return
    if first is not None and result.elsewhere(first):
        result.entries[name] = entry  # the one this node selects
        return
    if result.fleet and first is not None:
        first = _selected_with(result, first, entry)
        if first is None:
            return
    # Each says the line of metadata.name, not the document's first (`# comment`, apiVersion)
    named_at = ("metadata", "name")
    where = result.declared.get(name, "an invalid document")
    if first is not None:
        where = f"{result.named(first.source)}:{first.line_at(named_at)}"
    message = f"duplicate deployment name {name!r}: also declared in {where}"
    at = entry.line_at(named_at)
    error = ManifestError(entry.source, at, "metadata.name", message, name)
    result.errors.append(error)
    if first is not None:
        result.entries.pop(name, None)
        also = f"{result.named(entry.source)}:{at}"
        other = f"duplicate deployment name {name!r}: also declared in {also}"
        first_at = first.line_at(named_at)
        result.errors.append(ManifestError(first.source, first_at, "metadata.name", other, name))
    result.invalid_names[name] = str(result.error(error))  # where, as every invalid one says


def _selected_with(result: LoadResult, first: Entry, entry: Entry) -> Entry | None:
    """The declaration of ``entry``'s name that one node could select with it (their
    nodeSelectors agree where both have a key); None: none could, and it is kept apart."""
    selector = entry.deployment.spec.node_selector
    for other in [first, *result.apart.get(entry.name, [])]:
        if not disjoint(other.deployment.spec.node_selector, selector):
            return other
    result.apart.setdefault(entry.name, []).append(entry)
    return None


def missing_text(path: str) -> str:
    """A missing ``-f`` path in words: `-f web.yaml` names a manifest file, not a folder."""
    what = "manifest file" if path.endswith(SUFFIXES) else "manifests folder"
    from controller.store.sources.nearmiss import near_path  # read only when one is missing

    return f"{what} {path} does not exist{near_path(path)}"


def is_single_file(path: Path) -> bool:
    """``-f web.yaml`` (kubectl's habit): a manifest named itself, not a folder."""
    return path.name.endswith(SUFFIXES) and not path.is_dir()


def _listing(folder: Path, strict: bool) -> list[Path]:
    """The manifest files ``-f`` names: a folder's, or one file's (missing: FileNotFoundError)."""
    single = is_single_file(folder)
    if strict:
        security.check_folder(folder.parent if single else folder)
    if not single:
        return manifest_files(folder)
    if not folder.exists() and not folder.is_symlink():
        raise FileNotFoundError(folder)
    return [folder]


def manifest_files(folder: Path) -> list[Path]:
    """``*.yaml``/``*.yml`` in one folder (not recursive), skipping hidden and editor temp files."""
    out = []
    for child in sorted(folder.iterdir()):
        if child.name.startswith(".") or not child.name.endswith(SUFFIXES):
            continue
        out.append(child)
    return out


def load(
    folders: Iterable[Path],
    *,
    insecure: bool = False,
    backend: str = "local",
    cache_file: Path | None = None,
    repo: Path | None = None,
    labels: Mapping[str, str] | None = None,
    fleet: bool = False,
) -> LoadResult:
    """Every manifest of ``folders``; as root, only files and folders root alone can write.

    ``cache_file``: the parse cache (a pass under the lock passes it; read verbs do not).
    ``repo``: the git checkout the folders are in (``Config.repo``): each error names its
    file as the repository does (``manifests/a.yaml:3``), not by the checkout's place.
    ``labels``: the node's, whose share is read (``LoadResult.labels``); ``fleet``: every
    node's (``LoadResult.fleet``).
    """
    result = LoadResult(backend=backend, repo=repo, labels=labels, fleet=fleet)
    cache = ParseCache(cache_file) if cache_file is not None else None
    strict = security.strict(insecure)
    seen: set[str] = set()  # real paths: `-f m -f m/a.yaml` (or one folder twice) reads a.yaml once
    folders = list(folders)  # read twice: for its files, then (none found) for near misses
    for folder in folders:
        if repo is not None and (target := _out_of_repo(folder, repo)):
            why = f"is a symlink out of the repository (to {short(target, 80)})"
            _unusable(result, str(folder), why, f"{why}: refused unread, nothing pruned; "
                      "make it a folder in the repository, and push")  # fmt: skip
            continue
        try:
            files = _listing(folder, strict)
        except FileNotFoundError:
            result.missing_folders.append(str(folder))
            continue
        except NotADirectoryError:  # `-f /etc/passwd`: there, but no folder and no manifest
            if not folder.exists():  # `-f file/x`: a path through a file is not there
                result.missing_folders.append(str(folder))
                continue
            why = f"is not a folder, nor a manifest file ({', '.join(SUFFIXES)})"
            _unusable(result, str(folder), why, f"{why}: -f takes a folder or one manifest file")
            continue
        except security.InsecureManifest as exc:  # prunes nothing, like a missing folder
            _unusable(result, str(folder), "is refused (others can write it)", str(exc))
            continue
        except OSError as exc:  # no permission, a symlink loop (ELOOP)...
            words = _os_words(exc, str(folder))
            _unusable(result, str(folder), f"cannot be listed ({words})", f"cannot list: {words}")
            continue
        for path in files:
            real = os.path.realpath(path)
            if real in seen:  # the same file again is not a second declaration of its names
                continue
            if os.path.isfile(real):  # links to one device are each refused and named
                seen.add(real)
            result.files.append(str(path))
            _load_guarded(path, result, strict, cache)
    if cache is not None and not result.missing_folders:  # a missing folder: keep its files'
        cache.save()
    if not result.missing_folders and not result.prune_safe:  # a puzzle: say what is there
        from controller.store.sources.nearmiss import no_manifest

        result.no_manifest = no_manifest(folders, result.files, result.named)
    _check_model_names(result)
    _check_fallbacks(result)
    result.errors = [result.error(e) for e in result.errors]
    return result


def _out_of_repo(folder: Path, repo: Path) -> str | None:
    """Where a git source's folder leads, when a symlink on its way takes it out of the
    checkout (``manifests -> /etc/reconcile``, ``-> ../../elsewhere``); else None. A
    manifest's own symlink may not leave its folder (``bounded``), but the folder itself
    was followed anywhere: a commit could make the node read, and run, a folder of the
    node's that the repository does not hold, and prune what the repository declares."""
    target = os.path.realpath(folder)
    return None if Path(target).is_relative_to(os.path.realpath(repo)) else target


def _unusable(result: LoadResult, folder: str, why: str, error: str) -> None:
    """A folder ``-f`` names that is there but gives nothing: it prunes nothing, as a
    missing one, and the error says what it is instead."""
    result.missing_folders.append(folder)
    result.unusable[folder] = why
    result.errors.append(ManifestError(folder, None, None, error))


def _load_guarded(path: Path, result: LoadResult, strict: bool, cache: ParseCache | None) -> None:
    """``load_file``, whose unexpected error becomes that file's error (invariant 11).

    The last guard: a bug in checking one manifest (a type no check expected) must
    never end a pass or the daemon; the file is broken, so what it declared before
    is left alone, and every other file loads as usual.
    """
    try:
        load_file(path, result, strict, cache)
    except Exception as exc:
        file = str(path)
        for name in [n for n, e in result.entries.items() if e.source == file]:
            del result.entries[name]  # half a file is not the file
        why = f"{type(exc).__name__}: {short(str(exc), 120)}"
        message = (
            f"could not be checked (an internal error, {why}); what it declared is left "
            "as it was. Please report this with the file."
        )
        _broken(result, ManifestError(file, None, None, message))


def _check_model_names(result: LoadResult) -> None:
    """Model names only the gateway could not route (DESIGN "The gateway").

    A ``spec.model`` (or an alias equal to one) shared by several deployments is a
    pool the gateway balances over; what stays an error is real ambiguity: an alias
    listed by two deployments, or a model or alias equal to another deployment's
    ``metadata.name`` (which must reach that deployment alone).
    """
    entries = list(result.entries.values())
    named = {e.name: e for e in entries}
    aliased: dict[str, Entry] = {}
    clashes: dict[str, str] = {}
    for entry in entries:
        spec = entry.deployment.spec
        for model in (*([spec.model] if spec.model else []), *spec.aliases):
            owner = named.get(model)
            if owner is not None and owner is not entry:
                why = "one deployment's metadata.name and another's model or alias"
                _clash(result, clashes, entry, owner, model, why)
        for alias in spec.aliases:
            first = aliased.setdefault(alias, entry)
            if first is not entry:
                _clash(result, clashes, entry, first, alias, "an alias of two deployments")
    for name, message in clashes.items():
        del result.entries[name]
        result.invalid_names[name] = message


# Checked as written, here and not by the spec's model: a record's stored spec carries
# every field at its default (fallbackAfter: 30 with no fallbacks), and must validate.
_FALLBACK_AFTER = ("spec", "fallbackAfter")
_ALONE = (
    "fallbackAfter only applies with fallbacks (how long a request waits for a Ready "
    "instance before it goes to one): add fallbacks: [<model>], or remove fallbackAfter"
)


def _check_fallbacks(result: LoadResult) -> None:
    """``spec.fallbacks`` names routable models of other deployments (DESIGN "Routing that
    helps the engine"): a name nothing serves, or one of the deployment's own names, makes
    it invalid. Two deployments falling back on each other are fine: the gateway never
    follows a fallback back to a model it already tried."""
    entries = list(result.entries.values())
    routable = {n for e in entries for n in routable_names(e.name, e.deployment.spec)}
    bad: dict[str, str] = {}
    for entry in entries:
        if not entry.deployment.spec.fallbacks and _FALLBACK_AFTER in entry.field_lines:
            at = entry.field_lines[_FALLBACK_AFTER]
            error = ManifestError(entry.source, at, "spec.fallbackAfter", _ALONE, entry.name)
            result.errors.append(error)
            bad.setdefault(entry.name, str(result.error(error)))
        own = set(routable_names(entry.name, entry.deployment.spec))
        for i, name in enumerate(entry.deployment.spec.fallbacks):
            if name in own:
                why = f"{name!r} is this deployment's own name: a fallback is another model"
            elif name not in routable:
                known = ", ".join(sorted(routable - own)[:20]) or "none but its own"
                why = f"no deployment serves {name!r} (routable names: {known})"
            else:
                continue
            line = result.line_of(entry, ("spec", "fallbacks", i))  # the item's, not the doc's
            error = ManifestError(entry.source, line, f"spec.fallbacks[{i}]", why, entry.name)
            result.errors.append(error)
            bad.setdefault(entry.name, str(result.error(error)))
    for name, message in bad.items():
        del result.entries[name]
        result.invalid_names[name] = message


def _clash(
    result: LoadResult, clashes: dict[str, str], mine: Entry, other: Entry, model: str, why: str
) -> None:
    """Both deployments are invalid, each error naming the other's file and line."""
    for a, b in ((mine, other), (other, mine)):
        also = f"{b.name!r}, {result.named(b.source)}:{b.line}"
        message = (
            f"model name {model!r} is {why} (also {also}): the gateway could not tell where "
            "it goes; rename one or drop the alias"
        )
        field_ = "spec.aliases" if model in a.deployment.spec.aliases else "spec.model"
        if model == a.name:
            field_ = "metadata.name"
        result.errors.append(ManifestError(a.source, a.line, field_, message, a.name))
        clashes.setdefault(a.name, str(result.errors[-1]))
