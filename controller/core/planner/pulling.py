"""Model files before placement: a start whose source is not in the cache pulls first.

Runs between judging and placing: each :class:`Want` (and :class:`Roll`) whose spec has a
``source`` not yet cached becomes a :class:`Pull` (phase Pulling: no device, no port),
or a :class:`Hold` (Pending) when the last pull found too little disk; a
:class:`Prefetch` (a Ready engine's recreate) a Pull that writes no record while the
engine serves, or its Replace once the files are there. A start whose container image
the backend has not fetched yet (``Observed.fetching``) becomes a :class:`Fetch`, which
holds nothing either and preempts nobody, but for the first few a cluster's nodes with
room that hold it take (its ``room``): placed into that room alone. A failed pull
waits out the usual back-off (``backoff(attempts)``: 10 s, 20 s ... 300 s); a dead one
(its process gone, no result) is resumed at once, as a first restart is.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from controller.core.actions import Fetch, Hold, Pull, Replace
from controller.core.manifest.names import replica_of
from controller.core.manifest.specs import Entry, next_name
from controller.core.planner.context import Context, Gated, Judged, Prefetch, Roll, Want
from controller.core.pulls import PullView, progress_text, size_text
from controller.core.state import backoff


def gate(ctx: Context, judged: list[Judged]) -> list[Gated]:
    """``judged`` with every start that needs a pull turned into one, and every
    Prefetch into its pull, or into its Replace once the files are there."""
    waiting = _waiting(judged)
    roomy = _into_room(ctx, judged)
    spawned: set[str] = set()  # one pull process per key and plan
    out: list[Gated] = []
    for item in judged:
        if not isinstance(item, Want | Roll | Prefetch):
            out.append(item)
            continue
        source = item.entry.deployment.spec.source
        view = ctx.observed.pulls.get(source.key) if source is not None else None
        if source is None or (view is not None and view.cached):
            out.append(_fetch(ctx, _replace(item), roomy))
            continue
        out.append(_pull(ctx, item, view or PullView(key=source.key), spawned, waiting))
    return out


def _replace(item: Want | Roll | Prefetch) -> Want | Roll | Replace:
    """A Prefetch whose files are in the cache is the recreate it waited for (judging
    makes one only for files it saw missing: this keeps the gate's output whole)."""
    if not isinstance(item, Prefetch):
        return item
    return Replace(name=item.name, reason=item.why, fields=item.fields, entry=item.entry)


def _fetch(
    ctx: Context, item: Want | Roll | Replace, roomy: frozenset[str]
) -> Want | Roll | Replace | Fetch:
    """A start whose container image (``Observed.fetching``: whatever the backend fetches
    first) is not on the node waits for it holding nothing: it is placed, and may preempt,
    only once it is there, so a pull that fails again and again stops no healthy engine
    and a pull in progress keeps no GPU from the starts sorted after it. One of ``roomy``
    goes into free room on a node that holds it, or waits for room, Pending (placing.py)."""
    if not isinstance(item, Want):
        return item  # a Roll's and a Replace's image: the backend's ``prepared``
    wait = ctx.observed.fetching.get(item.entry.name)
    if wait is None:
        return item
    if item.record in roomy:
        return dataclasses.replace(item, room_only=wait.why)
    return Fetch(name=item.record, reason=wait.why, entry=item.entry)


def _into_room(ctx: Context, judged: list[Judged]) -> frozenset[str]:
    """The starts the nodes with room that hold their image take meanwhile (each waiting
    deployment's ``ImageWait.room``): its first, in the order placing takes them."""
    wants: dict[str, list[str]] = {}
    for item in judged:
        if isinstance(item, Want):
            wants.setdefault(item.entry.name, []).append(item.record)
    out: set[str] = set()
    for name, records in wants.items():
        wait = ctx.observed.fetching.get(name)
        if wait is not None and wait.room:
            out.update(sorted(records, key=replica_of)[: wait.room])
    return frozenset(out)


def _pull(
    ctx: Context,
    item: Want | Roll | Prefetch,
    view: PullView,
    spawned: set[str],
    waiting: dict[str, tuple[str, ...]],
) -> Pull | Hold:
    entry = item.entry
    name = next_name(item.record) if isinstance(item, Roll) else item.record
    source = entry.deployment.spec.source
    failure = view.failure_for(source.origin if source is not None else None)
    due = failure is None or ctx.now >= failure.at + timedelta(seconds=backoff(failure.attempts))
    if failure is not None and not due and not view.running:
        retry_at = failure.at + timedelta(seconds=backoff(failure.attempts))
        why = f"pull failed: {failure.message}; retry at {retry_at:%H:%M:%S}"
        if failure.kind == "disk" and isinstance(item, Want):
            return Hold(name=name, reason=why, entry=entry)  # Pending: it needs the user
        return _action(item, name, _serving(item, why), view.key, spawn=False)
    spawn = not view.running and view.key not in spawned
    if spawn:
        spawned.add(view.key)
    reason = _serving(item, _reason(entry, view))
    return _action(item, name, reason, view.key, spawn=spawn, waiting=waiting)


def _serving(item: Want | Roll | Prefetch, reason: str) -> str:
    """A Prefetch's pull says what it waits to replace, and that the engine serves on."""
    if not isinstance(item, Prefetch):
        return reason
    return f"{item.why}: {reason} first; the running engine serves meanwhile"


def _action(
    item: Want | Roll | Prefetch,
    name: str,
    reason: str,
    key: str,
    *,
    spawn: bool,
    waiting: dict[str, tuple[str, ...]] | None = None,
) -> Pull:
    return Pull(
        name=name,
        reason=reason,
        entry=item.entry,
        key=key,
        spawn=spawn,
        record=isinstance(item, Want),
        waiting=(waiting or {}).get(key, (item.entry.name,)),
    )


def _reason(entry: Entry, view: PullView) -> str:
    source = entry.deployment.spec.source
    assert source is not None
    if view.running:
        return f"{progress_text(view.progress)} ({source.describe()})"
    progress = view.progress
    if progress is not None and progress.bytes_done:
        return f"resuming the pull of {source.describe()} from {size_text(progress.bytes_done)}"
    return f"pulling {source.describe()}"


def _waiting(judged: list[Judged]) -> dict[str, tuple[str, ...]]:
    """Cache key -> every deployment this plan starts from it (their journals hear of it)."""
    out: dict[str, list[str]] = {}
    for item in judged:
        if not isinstance(item, Want | Roll | Prefetch):
            continue
        if source := item.entry.deployment.spec.source:
            out.setdefault(source.key, []).append(item.entry.name)
    return {key: tuple(sorted(set(names))) for key, names in out.items()}  # replicas: once
