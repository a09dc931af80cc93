"""`reconcile plan`: the planner's actions as terraform/Nomad-style changes, for people or JSON.

Each deployment gets one class: ``create`` (+), ``in-place`` (~: the record changes,
the engine keeps running), ``replace`` (-/+, naming the fields that force it),
``destroy`` (-), ``restart`` (a crashed engine's back-off is over), ``wait`` (!: it
cannot start now, and why), or ``unchanged``. Only the first five are changes
(exit 2); a deployment already waiting for the same reason is not one. A preemption is
a destroy of the engine whose deployment then waits Pending: exit 1, as `--once`'s.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from controller.backends.base import CommandLine
from controller.core.actions import (
    Action,
    Conflict,
    Fetch,
    Hold,
    HoldChange,
    MarkReady,
    MarkSpec,
    Park,
    PlanClass,
    Preempt,
    Pull,
    Reject,
    Release,
    Replace,
    Update,
)
from controller.core.imagepulls import NEVER
from controller.core.manifest.names import instance_of, is_next
from controller.core.manifest.sources import Source
from controller.core.plan import Desired, is_turn, makes_room
from controller.core.pulls import size_text
from controller.core.state import Observed, Phase, Record
from controller.pull.sizes import remote_size
from controller.reconciler.pulling import FAILING_AFTER
from controller.redact import printable

if TYPE_CHECKING:
    from controller.core.manifest.specs import DeploymentSpec, Entry


# What ``plan`` says of a Pull: the bytes to download (asked of the server when no pull
# has said yet), and whether the pull keeps failing (then ``--once`` would exit 1).
@dataclass(frozen=True, slots=True)
class PlanNote:
    """What ``plan`` adds to a Pull: the bytes to download, and whether it keeps failing."""

    text: str  # "2.1 GB to download", "1.0 of 2.1 GB left to download", "unknown size"
    bytes: int | None  # still to download; None: unknown
    failing: bool  # failed FAILING_AFTER times in a row: `--once` would exit 1


def plan_note(
    action: Pull, observed: Observed, size: Callable[[Source], int | None] = remote_size
) -> PlanNote:
    view = observed.pulls.get(action.key)
    source = action.entry.deployment.spec.source
    origin = source.origin if source is not None else None
    failure = view.failure_for(origin) if view is not None else None
    failing = failure is not None and failure.attempts >= FAILING_AFTER
    progress = view.progress if view is not None else None
    if progress is not None and progress.bytes_total is not None:
        left = max(progress.bytes_total - progress.bytes_done, 0)
        if not progress.bytes_done:
            return PlanNote(f"{size_text(left)} to download", left, failing)
        whole = size_text(progress.bytes_total)
        return PlanNote(f"{size_text(left)} of {whole} left to download", left, failing)
    total = size(source) if source is not None else None
    if total is None:
        return PlanNote("unknown size", None, failing)
    return PlanNote(f"{size_text(total)} to download", total, failing)


# Each action's class is its `plan_class`; "unchanged" is a deployment no action touches.
Kind = PlanClass | Literal["unchanged"]
SYMBOL: dict[Kind, str] = {
    "create": "+",
    "in-place": "~",
    "replace": "-/+",
    "destroy": "-",
    "restart": "↻",
    "wait": "!",
    "unchanged": " ",
}
CHANGES: tuple[Kind, ...] = ("create", "in-place", "replace", "destroy", "restart")
# What a preemption leaves (as the pass's event says): `--once` exits 1 on the Pending.
PREEMPT_OUTCOME = "stopped, then Pending until room returns"


@dataclass(frozen=True, slots=True)
class Change:
    name: str
    kind: Kind
    action: str  # the planner's verb
    reason: str
    fields: tuple[str, ...] = ()
    pending: bool = True  # False: a wait that is already recorded as such
    download: dict[str, Any] | None = None  # a Pull: {"bytes": n or null} still to download
    runs: CommandLine | None = None  # a start's: what it would run (a process, a container)
    placed: str | None = None  # a replace's new engine: where a later round places it
    rolling: bool = False  # an unchanged instance on its old spec, waiting its turn to roll

    def as_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "change": self.kind,
            "action": self.action,
            "reason": self.reason,
            "fields": [f"spec.{f}" for f in self.fields],
        }
        if self.runs is not None:
            doc["runs"] = {"argv": list(self.runs.argv), "env": list(self.runs.env)}
        if self.placed is not None:
            doc["placed"] = self.placed
        return doc if self.download is None else {**doc, "download": self.download}

    def runs_text(self) -> list[str]:
        """The start's lines under its change: its argv as a shell would take it, then
        the names of the variables it is given (their values are never shown); a replace's
        new engine, where it is placed."""
        lines = [f"      placed: {printable(self.placed)}"] if self.placed else []
        if self.runs is None:
            return lines
        argv = printable(shlex.join(self.runs.argv))
        env = ", ".join(self.runs.env) or "none"
        return [f"      runs: {argv}", f"      env: {printable(env)}", *lines]


# What a start would run (``reconciler/planned.py``); None: nothing to show.
Runs = Callable[[Action], CommandLine | None]


# A replace's new engine (``planned.NextRound``): what it would run as if placed now
# (None: it would not start now), and where a later round places it, or why it would not.
Later = Callable[[Replace], tuple[CommandLine | None, str]]


def _nothing(_action: Action) -> CommandLine | None:
    return None


def _unknown(_action: Replace) -> tuple[CommandLine | None, str]:
    return None, ""


def changes(
    actions: Sequence[Action],
    desired: Desired,
    observed: Observed,
    runs: Runs = _nothing,
    later: Later = _unknown,
) -> list[Change]:
    """``runs``: what each start would run, shown under its change; ``later``: what a
    replace's new engine would."""
    # A manifest fixed, a drain's hold ended, the manifests' commit moved: the record's
    # words are bookkeeping beside the change or look that follows (one change a name,
    # counted once: it showed as two, e.g. "unchanged Starting" and "unchanged Ready").
    others = {a.name for a in actions if not _bookkeeping(a)}
    kept = [a for a in actions if not (_bookkeeping(a) and a.name in others)]
    wanted = desired.instances()  # record names to exist: every replica
    out = [_shown(_change(a, observed, wanted), a, runs, later) for a in kept]
    touched = {a.name for a in actions}
    ours = {n for n, v in observed.records.items() if v.record.owner == desired.owner}
    for name in sorted((set(desired.entries) | ours) - touched):
        view = observed.records.get(name)
        phase = str(view.record.phase) if view else "not started"
        rolling = view is not None and _waits_its_turn(view.record, wanted.get(name))
        if rolling:
            phase += ", on its old spec: the rolling update replaces it in turn"
        out.append(Change(name, "unchanged", "none", phase, pending=False, rolling=rolling))
    return out


def _waits_its_turn(rec: Record, entry: Entry | None) -> bool:
    """An instance serving its old spec that no action touches: a rolling update under
    way replaces it once the new instances before it are Ready (a spec change of any
    other kind is an action of this plan: a replace, an update, a hold)."""
    return (
        entry is not None
        and not is_next(rec.name)
        and rec.phase in (Phase.READY, Phase.STARTING)
        and rec.spec_hash != entry.hash
    )


def _shown(change: Change, action: Action, runs: Runs, later: Later) -> Change:
    """A start (a create, a restart) with what it would run, and a replace with what its
    new engine would: nothing else runs anything."""
    if change.kind == "replace" and isinstance(action, Replace):
        line, placed = later(action)
        return replace(change, runs=line, placed=placed or None)
    if change.kind not in ("create", "restart"):
        return change
    said = runs(action)
    return change if said is None else replace(change, runs=said)


def _bookkeeping(action: Action) -> bool:
    return (
        (isinstance(action, MarkSpec) and action.valid)
        or (isinstance(action, HoldChange) and action.over)
        or (isinstance(action, Update) and action.revision_only)
    )


def _change(action: Action, observed: Observed, wanted: Mapping[str, object]) -> Change:
    if isinstance(action, Pull):
        return _pull(action, observed)
    # An observation (the probe passed), or bookkeeping (the manifests' commit moved with
    # no spec change: a CI checkout's plan is in sync though its HEAD is the PR's; a
    # drain's hold on a spec change ended, the edit undone: its words go)
    if (
        isinstance(action, MarkReady)
        or (isinstance(action, Update) and action.revision_only)
        or (isinstance(action, HoldChange) and action.over)
    ):
        # listed with the unchanged, so its reason is a phase as theirs is (`plan -o json`'s
        # "phase": it said "GET /health -> 200")
        return Change(action.name, "unchanged", action.verb, _phase_after(action, observed),
                      pending=False)  # fmt: skip
    kind = action.plan_class
    if isinstance(action, Park) and action.name not in observed.records:
        kind = "create"  # a new OnDemand deployment: its Idle record, no engine goes
    if isinstance(action, Release) and instance_of(action.name) in wanted:
        kind = "replace"  # a Failed or Pulling record of a changed spec: the next round starts it
    if isinstance(action, MarkSpec) and not action.valid:
        kind = "wait"  # a broken manifest: nothing is applied, it needs you (the engine runs on)
    fields = action.fields if isinstance(action, Replace | Update) else ()
    pending = True
    if isinstance(action, Hold | Reject):
        view = observed.records.get(action.name)
        rec = view.record if view else None
        pending = rec is None or rec.phase is not Phase.PENDING or rec.message != action.reason
    elif isinstance(action, HoldChange):  # the engine serves on: its record says it, or not yet
        view = observed.records.get(action.name)
        pending = view is None or view.record.message != action.reason
    elif isinstance(action, Conflict):
        pending = False
    reason = action.reason
    if isinstance(action, Preempt):  # the engine goes, the deployment stays and waits
        reason += f": {PREEMPT_OUTCOME}"
    return Change(action.name, kind, action.verb, reason, fields, pending)


def _phase_after(action: Action, observed: Observed) -> str:
    """The phase a record has once ``action`` (an observation, bookkeeping) is applied."""
    if isinstance(action, MarkReady):
        return str(Phase.READY)
    view = observed.records.get(action.name)
    return str(view.record.phase) if view else "not started"


def _pull(action: Pull, observed: Observed) -> Change:
    """A Pull with the bytes it will download; one that keeps failing waits for you."""
    from controller.cli.render.planview import plan_note

    note = plan_note(action, observed)
    kind: Kind = "wait" if note.failing else action.plan_class
    reason = f"{action.reason} ({note.text})"
    return Change(action.name, kind, action.verb, reason, download={"bytes": note.bytes})


def pending(found: Sequence[Change]) -> list[Change]:
    """What a pass would actually change (exit 2 when any)."""
    return [c for c in found if c.pending and c.kind in (*CHANGES, "wait")]


def blocked(found: Sequence[Change]) -> list[Change]:
    """What cannot start now (a name owned elsewhere, no room, drained, invalid) or will
    not run after the pass (a preempted deployment, stopped and left Pending): a pass
    would leave it Pending and `--once` exit 1, so `plan` exits 1 too. A turn on a shared
    device is none: `--once` exits 0 on it, as the next pass starts it; nor is a start
    waiting for what this pass stops (`makes_room`): the pass starts it after them."""
    waits = [
        c for c in found if c.kind == "wait" and not is_turn(c.reason) and not makes_room(c.reason)
    ]
    return waits + [c for c in found if c.action == Preempt.verb]


def never_pulled(found: Sequence[Change]) -> list[Change]:
    """A start, or a replace's new engine, whose image the node lacks and pullPolicy Never
    will not pull: the pass leaves it Pending, or keeps the engine it would replace, and
    `--once` exits 1, so `plan` does too (it exited 2: changes pending)."""
    fetch = f"({Fetch.verb}: "
    return [
        c
        for c in found
        if (c.action == Fetch.verb and NEVER in c.reason)
        or (c.placed is not None and fetch in c.placed and NEVER in c.placed)
    ]


def summary(found: Sequence[Change]) -> dict[Kind, int]:
    counts = dict.fromkeys(SYMBOL, 0)
    for change in found:
        counts[change.kind] += 1
    return counts


def text(found: Sequence[Change], errors: Sequence[str]) -> str:
    lines = [f"error: {e}" for e in errors]
    width = max((len(c.name) for c in found), default=0)
    for c in sorted(found, key=lambda c: (c.kind == "unchanged", c.name)):
        why = c.reason
        if c.kind == "replace" and c.fields:
            why += f" (forces replacement: {', '.join('spec.' + f for f in c.fields)})"
        lines.append(f"{SYMBOL[c.kind]:>3} {c.name:<{width}}  {c.kind:<9}  {why}")
        lines += c.runs_text()
    n = summary(found)
    lines.append("")
    lines.append(
        f"Plan: {n['create']} to create, {n['in-place']} to update in place, "
        f"{n['replace']} to replace, {n['destroy']} to destroy, {n['restart']} to restart, "
        f"{n['wait']} waiting; {n['unchanged']} unchanged."
    )
    if blocked(found) or errors:
        lines.append("Not in sync: what waits or is invalid needs you (a pass exits 1).")
    elif not pending(found) and any(c.rolling for c in found):
        lines.append(
            "Rolling: a pass would change nothing now; the rolling update under way goes "
            "on by itself as its new instances get Ready."
        )
    elif not pending(found):
        lines.append("In sync: a pass would change nothing.")
    return "\n".join(lines)


def replicas(desired: Desired, notes: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The desired count of every deployment that has more than one replica or an
    autoscaler: the autoscaler's current count (and why), or the spec's."""
    out: dict[str, dict[str, Any]] = {}
    for name, entry in sorted(desired.entries.items()):
        spec = entry.deployment.spec
        scale = spec.autoscale
        if scale is None and spec.replicas == 1:
            continue
        item: dict[str, Any] = {"desired": desired.count(name)}
        if scale is not None:
            item["autoscale"] = {"min": scale.min, "max": scale.max}
            item["reason"] = notes.get(name, "") or _unscaled(spec)
        out[name] = item
    return out


def _unscaled(spec: DeploymentSpec) -> str:
    """Why the count is what it is before the autoscaler made a change: load may well have
    been seen (below the target), so never "no load seen"."""
    start = "spec.replicas" if "replicas" in spec.model_fields_set else "autoscale.min"
    return f"not scaled yet: {start}, where it starts"


def replicas_text(counts: Mapping[str, Mapping[str, Any]]) -> list[str]:
    lines = []
    for name, item in counts.items():
        scale = item.get("autoscale")
        line = f"    {name}: {item['desired']} desired"
        if scale is not None:
            line += f" (autoscale {scale['min']}..{scale['max']}: {item['reason']})"
        lines.append(line)
    return ["Replicas:", *lines] if lines else []
