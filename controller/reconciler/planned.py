"""What a start `reconcile plan` shows would run: its reservation rendered as the pass
renders it, handed to the backend's ``command_line`` (nothing started, nothing written).

The planner never learns what a backend runs (a process's argv, a container runtime's
`run`): the plan's actions carry the devices and port, and this edge asks the backend.

A replace's new engine is placed by a later round of the pass, once the old one is down:
:class:`NextRound` plans that round now (the replaced records gone, what they held free),
with the planner the pass uses, and shows its start as a start's, where it would go if
placed now; or why it would not start now.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from controller.backends.base import CommandLine, StartRequest
from controller.core.actions import Action, Replace, Restart, Start
from controller.core.engines import RecipeError
from controller.core.plan import Desired
from controller.core.state import Observed
from controller.reconciler.leases import RecordMaker
from controller.reconciler.run import Preview, identity_of_self

# Each start draws its own nonce (the container's name and marker carry it): not known
# before the pass, so the plan names it so.
PLANNED_NONCE = "<nonce>"


def command_line(preview: Preview, action: Action, observed: Observed) -> CommandLine | None:
    """What ``action`` would run if a pass applied it now; None for an action that starts
    nothing this round (a replace's new engine: :class:`NextRound`), a backend that
    renders on the engine's node, or a recipe that cannot render (the plan says why)."""
    placed = _placement(action, observed)
    if placed is None or not isinstance(action, Start | Restart):
        return None
    devices, port, extra = placed
    try:
        lease = _maker(preview).reservation(
            action.entry, devices=devices, port=port, extra_ports=extra, name=action.name
        )
    except RecipeError:
        return None
    record = replace(lease.record, nonce=PLANNED_NONCE)
    log_path = preview.store.log_path(action.name)
    launch = StartRequest(
        entry=action.entry, record=record, rendered=lease.rendered, log_path=log_path
    )
    return preview.backend.command_line(launch)


def _placement(
    action: Action, observed: Observed
) -> tuple[tuple[str, ...], int, tuple[int, ...]] | None:
    """The devices, port and extra ports the start takes: a Start's own, a Restart's
    record's (it respawns in place)."""
    if isinstance(action, Start):
        return action.devices, action.port, action.extra_ports
    view = observed.records.get(action.name) if isinstance(action, Restart) else None
    port = view.record.port if view is not None else None
    if view is None or port is None:
        return None
    return view.record.devices, port, view.record.extra_ports


def _maker(preview: Preview) -> RecordMaker:
    cfg = preview.config
    return RecordMaker(
        store=preview.store,
        inventory=preview.inventory,
        owner=cfg.owner,
        node=cfg.node,
        me=identity_of_self(),
        backend=preview.backend.name,
        model_path=preview.puller.model_path,
    )


class NextRound:
    """What each replace's new engine would run: the round after the replaces' teardown,
    planned on first use (nothing started, nothing written)."""

    def __init__(
        self, preview: Preview, desired: Desired, observed: Observed, actions: Sequence[Action]
    ) -> None:
        self.preview = preview
        self.desired = desired
        self.observed = observed
        self.replaced = {a.name for a in actions if isinstance(a, Replace)}
        self._later: dict[str, Action] | None = None

    def __call__(self, action: Replace) -> tuple[CommandLine | None, str]:
        """The new engine's command line as if placed now (None: it would not start now),
        and where it would be placed, or why it would not start now."""
        later = self._round().get(action.name)
        if isinstance(later, Start):
            devices = ", ".join(later.devices) or "none"
            where = f"if placed now: port {later.port}, devices {devices}"
            line = command_line(self.preview, later, self.observed)
            return line, f"a later round of the pass places it; {where}"
        if later is None:
            return None, "a later round of the pass places it"
        said = f"{later.verb}: {later.reason}"
        return None, f"a later round of the pass places it; it would not start now ({said})"

    def _round(self) -> dict[str, Action]:
        if self._later is None:
            kept = {n: v for n, v in self.observed.records.items() if n not in self.replaced}
            after = replace(self.observed, records=kept)
            planned = self.preview.plan(self.desired, after)
            self._later = {a.name: a for a in planned if a.name in self.replaced}
        return self._later
