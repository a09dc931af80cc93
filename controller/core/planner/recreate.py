"""A changed spec's instance gives way: stopped, then placed again with the new spec.

Except a Ready one whose new spec's model files are not in the cache: they are pulled
first while it serves (a :class:`Prefetch`, which the pull gate makes a Pull that writes
no record), as a new image is pulled before its recreate (the launcher's
``Backend.prepared``). The download's minutes are then not minutes without an engine,
and a download that fails stops nothing: the engine serves on, the failure is reported.
"""

from __future__ import annotations

from controller.core.actions import Replace
from controller.core.manifest.specs import Entry
from controller.core.planner.context import Context, Judged, Prefetch
from controller.core.planner.lifecycle import running
from controller.core.state import Phase, RecordView


def recreate(
    ctx: Context, view: RecordView, entry: Entry, why: str, fields: tuple[str, ...]
) -> list[Judged]:
    """Replace the instance, or pull its new files first while it serves on."""
    rec = view.record
    if view.alive and rec.phase is Phase.READY and not cached(ctx, entry):
        return [Prefetch(entry, why, fields, rec.name), *running(ctx, view)]
    return [Replace(name=rec.name, reason=why, fields=fields, entry=entry)]


def cached(ctx: Context, entry: Entry) -> bool:
    """The spec's model files are in the cache (or it has none to pull)."""
    source = entry.deployment.spec.source
    if source is None:
        return True
    pull = ctx.observed.pulls.get(source.key)
    return pull is not None and pull.cached
