"""Node labels and ``spec.nodeSelector``: a field type of Kubernetes' label syntax (its
rules are ``labelsyntax.py``'s), the match, the share.

A fleet follows one repository; each node runs the deployments whose ``nodeSelector``
matches all its pairs against the node's ``node.yaml`` labels, and ignores the others
entirely (no record, no prune, no row). The choice is made here, before the planner
sees the entries: the labels are an input, like every other (no I/O).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Annotated, TypeVar

from pydantic import AfterValidator

from controller.core.manifest.labelsyntax import key_problem, value_problem


def _check(labels: dict[str, str]) -> dict[str, str]:
    for key, value in labels.items():
        problem = key_problem(key) or value_problem(value)
        if problem:
            raise ValueError(problem)
    return labels


# A pydantic field type: ``labels: Labels`` in node.yaml, ``nodeSelector: Labels`` in a spec.
Labels = Annotated[dict[str, str], AfterValidator(_check)]


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Kubernetes' nodeSelector: every pair of the selector is one of the node's labels."""
    return all(labels.get(key) == value for key, value in selector.items())


def disjoint(one: Mapping[str, str], other: Mapping[str, str]) -> bool:
    """No node's labels match both selectors: they give one key two values."""
    return any(key in other and other[key] != value for key, value in one.items())


def pairs(selector: Mapping[str, str]) -> str:
    """``gpu=h100,site=lab2``: a selector as ``kubectl get -l`` writes it."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


E = TypeVar("E")  # an entry: whatever carries a selector


def share(
    entries: Mapping[str, E],
    labels: Mapping[str, str],
    selector_of: Callable[[E], Mapping[str, str]],
) -> tuple[dict[str, E], dict[str, str]]:
    """Split ``entries`` into those whose selector matches ``labels`` and the skipped
    ones (name -> their selector, as ``pairs`` writes it). ``selector_of`` reads an
    entry's ``spec.nodeSelector`` (the specs import this module, not the other way)."""
    kept: dict[str, E] = {}
    skipped: dict[str, str] = {}
    for name, entry in entries.items():
        selector = selector_of(entry)
        if matches(selector, labels):
            kept[name] = entry
        else:
            skipped[name] = pairs(selector)
    return kept, skipped


def skip_note(skipped: Mapping[str, str], *, labels_read: bool = True) -> str | None:
    """What ``plan`` and ``--once`` say of the skipped deployments (None: none skipped):
    ``3 deployments skipped: nodeSelector gpu=h100 does not match this node's labels``."""
    if not skipped:
        return None
    selectors = sorted(set(skipped.values()))
    count = len(skipped)
    noun = "deployment" if count == 1 else "deployments"
    if not labels_read:
        return (
            f"{count} {noun} with a nodeSelector skipped: this node's labels could not be"
            " read (node.yaml); nothing they run is stopped"
        )
    verb = "does" if len(selectors) == 1 else "do"
    return (
        f"{count} {noun} skipped: nodeSelector {'; '.join(selectors)}"
        f" {verb} not match this node's labels"
    )


def kept_apart(
    skipped: Mapping[str, str], here: Collection[str]
) -> tuple[dict[str, str], list[str]]:
    """(``skipped`` less the deployments in ``here``, those kept: sorted). ``here``: the
    deployments whose manifest did not load with a record on this node. Such a manifest
    whose selector names other nodes is skipped, yet what this node ran for it stays
    (invariant 4): counted among the skipped, `status` said it ran nowhere here. (A valid
    one that no longer matches is skipped even while its engine stops: it is going.)"""
    kept = sorted(n for n in skipped if n in here)
    return {n: s for n, s in skipped.items() if n not in here}, kept


def kept_note(kept: Collection[str]) -> str | None:
    """``1 deployment kept here with its spec invalid: web (...)`` (None: none kept)."""
    if not kept:
        return None
    names = ", ".join(sorted(kept))
    if len(kept) == 1:
        return (
            f"1 deployment kept here with its spec invalid: {names} "
            "(nothing is moved until its manifest loads)"
        )
    return (
        f"{len(kept)} deployments kept here with their specs invalid: {names} "
        "(nothing is moved until their manifests load)"
    )
