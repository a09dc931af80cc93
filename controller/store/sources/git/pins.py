"""What a pass notes of the commit it applied: manifests that cannot all be applied, how
its deployments converge (its history entry), and autoRollback's pin past the deadline."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from controller.store.sources.git.checkout import Checkout
from controller.store.sources.git.history import (
    changed_by,
    last_good,
    outcome_of,
    paused,
    read_history,
    write_history,
)
from controller.store.sources.git.status import (
    INVALID_KEPT,
    NOTHING_READ,
    SourceStatus,
    read_status,
)

if TYPE_CHECKING:
    from controller.store.sources.manifests import ManifestError


class Pins(Checkout):
    """Outcomes and autoRollback (a pass's notes)."""

    def note_invalid(
        self,
        errors: list[ManifestError],
        *,
        folder: str | None = None,
        conflicts: Sequence[str] = (),
    ) -> bool:
        """The pass's manifest errors at the commit it applied, and what is wrong with the
        manifests' folder there (``folder``: missing, or no manifest in it, which prunes
        nothing), and its deployments whose name another manifest set owns (``conflicts``:
        not run, and the source said Synced: a `--git-path` renamed, say): while there are
        any the source is Degraded (``state_of``), whatever its engines do (those of a
        broken file keep their last good spec: a typo tears nothing down, and says so here
        too). Whether there are any.

        Beside the daemon that follows this source (``beside_daemon``: a cron `--once`),
        an error whose fix is on the node is this run's alone: it read the node's secrets
        with its own environment (a crontab without the daemon's SOPS_AGE_KEY_FILE), so
        noting it made the node notify Degraded, then Synced at the daemon's next pass, at
        every run. The run's output says it; the daemon's passes note what they find."""
        if self.beside_daemon is not None:
            errors = [e for e in errors if not e.on_node]
        said = [f"{self.settings.path}: {folder}{NOTHING_READ}"] if folder else []
        said += [str(e) for e in errors]  # named as the repository does (``load``'s repo)
        said = [*said, *conflicts][:INVALID_KEPT]
        on_node = not folder and bool(errors) and errors[0].on_node  # said[0]'s fix
        st = read_status(self.state_dir)
        was = (st.invalid, st.invalid_at, st.invalid_on_node) if st is not None else None
        passed = st is not None and st.passed_at == st.applied
        if st is None or (passed and was == (said, st.applied if said else None, on_node)):
            return bool(said)  # most passes: nothing new to write

        def note(now: SourceStatus) -> None:
            now.invalid, now.invalid_at = said, now.applied if said else None
            now.invalid_on_node, now.passed_at = on_node, now.applied

        self.change_status(note)
        return bool(said)

    def note_outcome(
        self,
        phases: list[tuple[str, str]],
        specs: dict[str, str],
        *,
        invalid: bool = False,
        drained: bool = False,
    ) -> str | None:
        """The newest history entry follows its deployments as they converge (``phases``:
        deployment, phase per instance); past autoRollback's progressDeadline with the
        deployments the commit changed not all Ready, the source is pinned to the last good
        commit (what happened, in words, for the events; None when nothing did).

        The entry keeps its commit's spec hashes (``specs``, from its first pass): what it
        changed is what differs from the entry before, so a deployment the commit did not
        touch, failing since an older one, rolls nothing back. A commit whose manifests
        cannot all be applied (``invalid``: one does not load, or the folder is missing or
        empty) is Degraded however its engines run, never a good commit to roll back to,
        and rolled back past the deadline. ``drained``: the node's drain is active, and the
        deadline waits (``_paused``)."""
        entries = read_history(self.state_dir)
        if not entries or entries[-1]["outcome"] in ("Ready", "RolledBack"):
            return None
        newest = entries[-1]
        outcome = outcome_of([phase for _, phase in phases])
        if invalid and outcome != "Failed":
            outcome = "Degraded"
        news = "specs" not in newest or outcome != newest["outcome"]  # else nothing to write
        news |= paused(newest, drained, datetime.now(UTC))
        newest.setdefault("specs", specs)
        newest["outcome"] = outcome
        if news:
            write_history(self.state_dir, entries)
        if outcome == "Ready":
            return None
        touched = changed_by(entries, newest)
        if not invalid and outcome_of([p for name, p in phases if name in touched]) == "Ready":
            return None
        return self._auto_rollback(newest)

    def _auto_rollback(self, newest: dict[str, Any]) -> str | None:
        deadline = self.settings.progress_deadline
        if deadline is None or newest.get("by") in ("rollback", "auto-rollback"):
            return None
        if "paused_at" in newest:  # drained: nothing new can start, nothing is late
            return None
        try:  # from the drain's end, if one came after the commit (as Kubernetes' resume)
            since = datetime.fromisoformat(str(newest.get("resumed_at", newest["applied_at"])))
        except ValueError:
            return None
        if (datetime.now(UTC) - since).total_seconds() < deadline:
            return None
        good = last_good(self.state_dir, but=newest["revision"])
        if good is None:
            return None
        pinned: list[str] = []

        def pin(st: SourceStatus) -> None:
            if st.pinned is None:  # a rollback's pin stands
                st.pinned, st.auto_pinned = good, True
                pinned.append(good)

        self.change_status(pin)
        if not pinned:
            return None
        return (
            f"commit {newest['revision'][:12]} not Ready within {deadline:g}s"
            f" (progressDeadline): rolled back to {good[:12]}, pinned until a newer commit"
            " or reconcile rollback --resume"
        )
