"""A changed spec's instance gives way: stopped, then placed again with the new spec.

Except a Ready one whose new spec's model files are not in the cache: they are pulled
first while it serves (a :class:`Prefetch`, which the pull gate makes a Pull that writes
no record), as a new image is pulled before its recreate (the launcher's
``Backend.prepared``). The download's minutes are then not minutes without an engine,
and a download that fails stops nothing: the engine serves on, the failure is reported.

On a drained node (not ``--evict``) a running engine does not give way at all: nothing
would start in its place until uncordon, so it serves on with its old spec and its record
says the drain holds the change (a :class:`HoldChange`, said once); uncordon applies it.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.core.actions import Action, HoldChange, Replace
from controller.core.manifest.specs import Entry
from controller.core.planner.context import Context, Judged, Prefetch
from controller.core.planner.lifecycle import drain_held, running
from controller.core.state import CHANGE_HELD, Phase, Record, RecordView

CHANGE_FREED = "the drain holds its spec change no more"


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


def drain_holds(ctx: Context, view: RecordView) -> bool:
    """A running engine on a drained node: its replacement would be stopped, then Pending
    until uncordon (a drain that evicts stops it anyway)."""
    running_now = view.alive and view.record.phase in (Phase.READY, Phase.STARTING)
    return running_now and ctx.drain is not None and not ctx.drain.evict


def hold(ctx: Context, view: RecordView, why: str) -> list[Judged]:
    """The engine serves on (its own lifecycle goes on); its record says what waits, in
    words holding ``state.CHANGE_HELD`` (": held: "), by which ``unheld`` finds them."""
    held = HoldChange(name=view.record.name, reason=f"{why}: {drain_held(ctx)}")
    return [held, *running(ctx, view)]


def unheld(rec: Record, judged: Sequence[Judged]) -> list[Judged]:
    """A record that says the drain holds its change, which this plan holds no more nor
    tears down (uncordon's rolling update, the edit undone): those words go."""
    if CHANGE_HELD not in rec.message or any(_rewrites(j, rec.name) for j in judged):
        return []
    return [HoldChange(name=rec.name, reason=CHANGE_FREED, over=True)]


def _rewrites(judged: Judged, name: str) -> bool:
    """``judged`` writes record ``name``'s message itself: held again, or torn down."""
    if not isinstance(judged, Action) or judged.name != name:
        return False
    return isinstance(judged, HoldChange) or judged.tears_down
