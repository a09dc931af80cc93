"""One pass: load -> observe -> plan -> (lock -> reserve) -> execute -> result.

A pass runs rounds until nothing changes (a replace stops the old engine in one
round and starts the new one in the next), at most MAX_ROUNDS. The pass lock
keeps passes on one state dir from overlapping; the placement lock is held only
for reading and writing records (invariant 7), never across a spawn or a wait.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from controller import failpoints
from controller.backends.base import Backend
from controller.core.actions import (
    Action,
    AnyAction,
    Conflict,
    Fetch,
    Hold,
    HoldChange,
    Reap,
    Restart,
    Start,
    Stop,
    only_starts_new,
)
from controller.core.devices.capacity import kinds_of, only_kinds
from controller.core.devices.inventory import Inventory
from controller.core.devices.placement import (
    Ledger,
    Placed,
    Selector,
    Spread,
    Unplaced,
    bound_selectors,
    ledger_for,
    near_of,
    place,
)
from controller.core.engines import MODULES, RecipeError, recipe_for
from controller.core.manifest import backendnames
from controller.core.manifest.labels import kept_apart, kept_note, matches, share, skip_note
from controller.core.manifest.names import base_name, is_next
from controller.core.manifest.sources import Source
from controller.core.manifest.specs import (
    Entry,
    document_hash,
    with_config,
    with_key_file,
    with_secrets,
)
from controller.core.plan import EMPTIED, Desired, plan, rekeyed, waits_turn
from controller.core.pulls import PullView
from controller.core.state import MarkedProcess, Observed, Phase, ProcessRef, Record, backoff_cause
from controller.errors import ConfigError
from controller.host import bootclock, gpuhealth
from controller.host.devices import gpu_memory
from controller.host.procs import identity, live_identity
from controller.logsetup import get_logger
from controller.reconciler import lateexits, pulling, replaced, strays, unreachable
from controller.reconciler.autoscaling import Autoscaler
from controller.reconciler.executor import Executor
from controller.reconciler.gpuwatch import DeviceWatch
from controller.reconciler.leases import Lease, RecordMaker, kept_count
from controller.reconciler.liveness import LivenessProber
from controller.reconciler.memwait import MemoryGate
from controller.reconciler.observe import observe, port_holders
from controller.reconciler.probekeys import keys_of
from controller.reconciler.pulling import puller_of
from controller.reconciler.volumes import refuse_missing_volumes
from controller.store import diskspace
from controller.store.config import nodelabels, secretkey, stateid
from controller.store.config.node import Config, read_drain
from controller.store.instances import logfiles
from controller.store.instances.events import REMOVED, REMOVED_OUTCOME, Journal
from controller.store.instances.records import RecordProblem, RecordStore, Snapshot
from controller.store.lock import FileLock
from controller.store.side import activation, devicehealth, measured, restart
from controller.store.side.observed import Seen
from controller.store.side.observed import note as note_seen
from controller.store.sources import keyfile, security
from controller.store.sources.git import rev as gitrev
from controller.store.sources.manifests import LoadResult, ManifestError, load
from controller.store.sources.nearmiss import NOTHING_PRUNED
from controller.store.statedir import StateDir

if TYPE_CHECKING:  # loaded where used: a pass with no git source, hooks or envFrom skips them
    from controller.host.secrets import Unread
    from controller.store.instances.outbox import Notifications
    from controller.store.sources.git.source import GitSource, SyncResult

log = get_logger("reconcile")

MAX_ROUNDS = 5
# The journal's action for an engine left running that no pass here may adopt or stop.
SPARE = "spare"


@dataclass
class PassResult:
    actions: list[Action] = field(default_factory=list)
    errors: list[ManifestError] = field(default_factory=list)
    problems: list[RecordProblem] = field(default_factory=list)
    records: dict[str, Record] = field(default_factory=dict)
    owner: str = ""
    names: set[str] = field(default_factory=set)  # records the manifests want: every replica
    prune_blocked: str | None = None
    missing_folders: list[str] = field(default_factory=list)
    folder_problems: list[str] = field(default_factory=list)  # each missing folder, in words
    folder_errors: list[str] = field(default_factory=list)  # of those, the ones no error says
    no_manifest: str = ""  # no manifest found: where, and what is there (LoadResult's)
    probes: dict[str, str] = field(default_factory=dict)  # name -> last probe answer
    outcomes: dict[tuple[str, str], int] = field(default_factory=dict)  # (action, outcome) -> n
    pulls: dict[str, PullView] = field(default_factory=dict)  # the last round's model pulls
    # engines kept serving because their new spec cannot start (an image that did not pull)
    held: dict[str, str] = field(default_factory=dict)
    # this set's engines of quarantined records given their record back: name -> engine
    adopted: dict[str, MarkedProcess] = field(default_factory=dict)
    # engines found by their spawn note alone that no manifest here declares: name -> what
    # holds what, why reconcile leaves it running, and the next move (strays.unproven)
    unproven: dict[str, str] = field(default_factory=dict)

    node: str | None = None  # records of other nodes are theirs to judge, not this pass's
    git: SyncResult | None = None  # the git source's fetch and move before this pass
    specs: dict[str, str] = field(default_factory=dict)  # deployment -> its spec's hash
    sources: dict[str, Source] = field(default_factory=dict)  # deployment -> its source
    skipped: dict[str, str] = field(default_factory=dict)  # left to other nodes -> selector
    invalid: set[str] = field(default_factory=set)  # the manifests that did not load, by name
    broken: dict[str, str] = field(default_factory=dict)  # a file that did not load -> its error
    # A pass run at once (run_pass's at_once) whose plan was more than new starts, or one
    # whose manifests changed as it read them (``unchanged``): it did nothing, and waits
    # for the folder to settle.
    deferred: bool = False

    def ours(self) -> list[Record]:
        return [
            r for r in self.records.values() if r.owner == self.owner and not r.elsewhere(self.node)
        ]

    def left_and_kept(self) -> tuple[dict[str, str], list[str]]:
        """The deployments left to other nodes (name -> selector), and those skipped whose
        engine this node runs on, their manifest not loading (a record here: invariant 4)."""
        here = {base_name(r.name) for r in self.ours()} & self.invalid
        return kept_apart(self.skipped, here)

    def fleet_notes(self) -> list[str]:
        """What ``--once`` (and its ``--wait``) says of this node's share of a fleet: the
        deployments left to other nodes, and those kept here with their spec invalid."""
        skipped, kept = self.left_and_kept()
        return [note for note in (skip_note(skipped), kept_note(kept)) if note]

    @property
    def ok(self) -> bool:
        """--once's exit status: every manifest valid, nothing Pending or Failed."""
        if self.errors or self.problems or any(isinstance(a, Conflict) for a in self.actions):
            return False
        return not self.stuck()

    def stuck(self) -> list[Record]:
        """This set's records Pending or Failed: what ``--once`` exits 1 on (waiting for
        its turn on a shared device is no failure: the next pass starts it)."""
        return [
            r for r in self.ours() if r.phase in (Phase.PENDING, Phase.FAILED) and not waits_turn(r)
        ]

    @property
    def unfetched(self) -> bool:
        """Following git, no commit of the source checked out (its first fetch under way,
        or failed): there is no folder to speak of yet, only git's words."""
        return self.git is not None and not self.git.revision

    def failing(self) -> list[str]:
        """Why ``--once`` exits 1 though the pass itself went through (cron mails on it):
        a manifests folder missing or empty (nothing pruned), a deployment crash-looping,
        an engine kept because its new spec cannot start (its image did not pull), a model
        pull that keeps failing, an engine serving its old spec while the drain holds the
        new one (as what the drain keeps Pending does), the git source's fetch failing
        (this run's, or beside the daemon the daemon's: the source's PullFailed)."""
        out = [] if self.unfetched else self._folder_lines()  # no checkout: git's words
        if self.git is not None and self.git.error:
            rev = self.git.revision
            running = f"still running {rev[:12]}" if rev else "nothing applied yet"
            out.append(f"git: {self.git.error} ({running}; nothing pruned)")
        if self.git is not None and self.git.daemon_failing:  # the source's PullFailed
            out.append(f"git: {self.git.daemon_failing}")
        if self.prune_blocked and not self.missing_folders and not self.unfetched:
            out.append(f"{self.no_manifest or 'no manifest'}: {NOTHING_PRUNED}")
        out += [failed_text(r) for r in self.ours() if r.exec_failed or r.crash_looping]
        out += self.conflicts()  # a log line alone: `--once -q` exited 1 saying nothing
        out += [f"{name}: {why}" for name, why in sorted(self.held.items())]
        out += self.held_changes()
        return out + list(pulling.failing(self.ours(), self.pulls, self.sources).values())

    def conflicts(self) -> list[str]:
        """The deployments not run because another manifest set owns their name: why."""
        return [f"{a.name}: {a.reason}" for a in self.actions if isinstance(a, Conflict)]

    def _folder_lines(self) -> list[str]:
        """Each missing folder once, with what the pass did not do (a warning said it
        again); an unusable one's error, with its next move, is among ``errors``."""
        tail = f": {NOTHING_PRUNED}" if self.prune_blocked else ""
        return [problem + tail for problem in self.folder_errors]

    def held_changes(self) -> list[str]:
        """The spec changes the node's drain holds (their engines serve on): name: why."""
        held = [a for a in self.actions if isinstance(a, HoldChange) and not a.over]
        return [f"{a.name}: {a.reason}" for a in held]

    @property
    def converged(self) -> bool:
        """``--once``'s exit 0, and the metrics' ``last_pass_ok``: the pass went through
        (``ok``) and nothing is failing (a crash loop, a pull failing, an emptied folder),
        so an alert on the metric fires where cron would mail."""
        return self.ok and not self.failing()

    def rollout_phases(self) -> list[tuple[str, str]]:
        """Each instance's deployment and phase, as the commit's rollout goes: one Ready on
        another spec than the manifests' (a change the drain holds) is Progressing, not a
        commit proven good (its new spec, run after uncordon, may yet fail)."""
        out = []
        for rec in self.ours():
            name, phase = base_name(rec.name), str(rec.phase)
            if rec.phase is Phase.READY and self.specs.get(name, rec.spec_hash) != rec.spec_hash:
                phase = "Progressing"
            out.append((name, phase))
        return out

    @property
    def all_ready(self) -> bool:
        """Every wanted instance Ready on its current spec (``kubectl rollout status``): a
        rolling update is done once its ``@next`` took over, not while the old instance
        still serves. An OnDemand deployment parked Idle is where it should be."""
        ours = self.ours()
        ready = {
            r.name
            for r in ours
            if r.phase is Phase.IDLE
            or (
                r.phase is Phase.READY
                and self.specs.get(base_name(r.name), r.spec_hash) == r.spec_hash
            )
        }
        return self.ok and self.names <= ready and not any(is_next(r.name) for r in ours)


AfterPass = Callable[["PassResult", float], None]


class Preview:
    """The read-only half of a pass: desired state, observation, plan. No locks, no writes.

    ``reconcile plan`` uses it alone; the :class:`Reconciler` adds the executor.
    """

    def __init__(
        self,
        config: Config,
        backend: Backend,
        inventory: Inventory,
        store: RecordStore | None = None,
    ) -> None:
        self.config = config
        # One store per state dir: the daemon hands its own (the backend holds it too).
        self.store = store if store is not None else RecordStore(config.state_dir)
        self.backend = backend
        self.inventory = inventory
        self.puller = puller_of(backend, config.state_dir)  # spec.source: the backend's pulls
        self.autoscaler = Autoscaler(config.state_dir, Journal(config.state_dir))
        self.scale_writes = False  # `plan` shows the autoscaler's counts, keeps none
        # Only a pass moves a record (or device file) it cannot read aside; `plan` and
        # `status --refresh` name it where it lies (store.peek).
        self.sets_aside = False
        self.liveness: LivenessProber | None = None  # `plan` probes no liveness
        # `plan`'s ({}: filled by desired()): a deployment's sopsFile no age key here opens
        # (a CI job) is planned as unchanged, not invalid. None (a pass, status): invalid,
        # so no engine starts without its secrets.
        self.unread_secrets: dict[str, list[Unread]] | None = None
        # The last plan's `Observed.images_on`: the act side places as the plan did.
        self.images_on: dict[str, frozenset[str]] = {}

    def desired(self, loaded: LoadResult) -> Desired:
        # spec.envFrom read here, at the edge: the planner sees a hash. As root its files
        # are held to the manifests' rule (and opted out of it with them).
        strict = security.strict(self.config.insecure_manifests)
        untrusted = security.path_problem if strict else None
        unread = self.unread_secrets
        resolve_secrets(loaded, self._secrets_key, untrusted, here=self._runs_here, unread=unread)
        if unread:
            self._as_recorded(loaded, unread)
        if self.backend.name == backendnames.LOCAL:  # a cluster's folders are its nodes'
            refuse_missing_volumes(loaded, here=self._runs_here)
        entries, skipped, invalid, labelled = self._share(loaded)
        return Desired(
            owner=self.config.owner,
            entries=entries,
            skipped=skipped,
            invalid=invalid,
            broken_sources=frozenset(loaded.broken_sources),
            source_errors=_source_errors(loaded),
            emptied=self._emptied(loaded),
            prune=(loaded.prune_safe or self._may_empty(loaded)) and labelled,
            activations=activation.read_all(self.config.state_dir, peek=not self.sets_aside),
            restarts=restart.read_all(self.config.state_dir, peek=not self.sets_aside),
            revision=gitrev.revision_of(self.config.manifests, check_dirty=not self.config.git),
            # Always the node's checkout: another set's record may name a file in it.
            repo=StateDir(self.config.state_dir).git_checkout,
            folders=tuple(str(f) for f in self.config.manifests),  # as files are named
            replicas=self.autoscaler.counts(
                entries,
                lambda: self.snapshot().records.values(),
                time.time(),
                write=self.scale_writes,
            ),
        )

    def _as_recorded(self, loaded: LoadResult, unread: Mapping[str, list[Unread]]) -> None:
        """Each deployment whose sopsFile values are unknown here (``unread``) planned as
        if they were unchanged: its record's hash where its spec, --config file and key
        file are the record's (a field changed is a change: its hash stays its own)."""
        records = self.snapshot().records
        for name in unread:
            entry, rec = loaded.entries.get(name), records.get(name)
            if entry is None or rec is None or rec.owner != self.config.owner:
                continue
            base = with_config(document_hash(rec.stored_spec), entry.config_digest)
            if rec.stored_spec and with_key_file(base, entry.key_file_digest) == entry.hash:
                loaded.entries[name] = replace(entry, hash=rec.spec_hash)

    def _runs_here(self, entry: Entry) -> bool:
        """Whether this node runs ``entry`` (``_share``'s rule). The envFrom files and
        volumes of a deployment left to other nodes are theirs (a sopsFile encrypted for
        their age keys, a file only they hold): never read here."""
        labels = self.reads()
        return labels is None or matches(_selector(entry), labels)

    def reads(self) -> Mapping[str, str] | None:
        """The labels whose share of the manifests this node reads (``load``'s): one name
        declared for two node classes is two deployments of other nodes here. None: a
        backend that selects nodes itself (Ray) reads them all, each name once."""
        return None if self.backend.selects_nodes else (self.config.labels or {})

    def _secrets_key(self) -> bytes | None:
        """The key of envFrom's digests: a pass makes it, a preview only reads it (none
        yet: no record holds a keyed hash, and the unkeyed one foresees the pass)."""
        state = self.config.state_dir
        return secretkey.ensure(state) if self.sets_aside else secretkey.peek(state)

    def _may_empty(self, loaded: LoadResult) -> bool:
        """`--allow-empty` prunes on an empty or missing folder, never on one not read."""
        return self.config.allow_empty and not loaded.unread

    def _emptied(self, loaded: LoadResult) -> frozenset[str]:
        """The emptied files whose deployments stay: none under `--allow-empty`, which
        says an empty manifest means what it says."""
        return frozenset() if self.config.allow_empty else frozenset(loaded.emptied)

    def _share(
        self, loaded: LoadResult
    ) -> tuple[dict[str, Entry], dict[str, str], dict[str, str], bool]:
        """This controller's share: (entries, skipped name -> selector, invalid name ->
        error, whether a prune may go ahead as far as labels go).

        On one node, spec.nodeSelector is matched against node.yaml's labels; labels that
        could not be read start no selected deployment and prune nothing (invariant 5).
        A backend that selects nodes itself (Ray, by its nodes' labels) gets every
        deployment: the selector is its to match when it places, and a selector no node
        matches is a Pending deployment, not another node's."""
        if self.backend.selects_nodes:
            return dict(loaded.entries), {}, dict(loaded.invalid_names), True
        labels = self.config.labels
        entries, skipped = share(loaded.entries, labels or {}, _selector)
        # An invalid manifest whose selector can be read and names other nodes is skipped
        # (no Pending record here), yet stays invalid: an engine this node runs for it is
        # kept (invariant 4), as a typo moves nothing the node it names would refuse too.
        selectors = loaded.invalid_selectors
        names = {n: n for n in loaded.invalid_names}
        _, others = share(names, labels or {}, lambda n: selectors.get(n, {}))
        return entries, {**skipped, **others}, dict(loaded.invalid_names), labels is not None

    def snapshot(self) -> Snapshot:
        """The records: a pass quarantines one it cannot read, a preview only names it."""
        return self.store.load() if self.sets_aside else self.store.peek()

    def observe(
        self, *, probe: bool = True, desired: Desired | None = None
    ) -> tuple[Observed, list[RecordProblem]]:
        """``desired``: the pass's entries, whose engines' API keys the probes present
        (probekeys.py; None: only what the records' spec documents give)."""
        live = self.backend.devices()
        if live is not None:  # a cluster: plan against the nodes that are there now
            self.inventory = live
        snapshot = self.snapshot()
        one_backend(snapshot.records.values(), self.backend.name, self.config.state_dir)
        observed = observe(
            snapshot,
            self.backend,
            drain=read_drain(self.config.state_dir),
            probe=probe,
            node=self.config.node,
            liveness=self.liveness if probe else None,
            keys=keys_of(desired),
        )
        health = devicehealth.read if self.sets_aside else devicehealth.peek
        peaks = measured.read if self.sets_aside else measured.peek
        observed = dataclasses.replace(
            observed,
            pulls=self.puller.observe(),
            unhealthy=health(self.config.state_dir).faults,
            measured=peaks(self.config.state_dir),
        )
        return observed, snapshot.problems

    def spare_others(self, desired: Desired, observed: Observed) -> Observed:
        """Each orphan of another set whose record was torn after it started left running,
        what it holds held (strays.spare_others); a pass and `plan` alike."""
        if self.backend.name != backendnames.LOCAL or not observed.orphans:
            return observed
        return strays.spare_others(desired, observed, owner=self.config.owner,
                                   store=self.store, inventory=self.inventory)  # fmt: skip

    def foresee_strays(self, desired: Desired, observed: Observed) -> Observed:
        """The engines no readable record accounts for, judged as a pass judges them before
        it plans, nothing written (`plan`, `rollback --dry-run`): this set's that the pass
        adopts shown adopted (strays.foresee), another set's spared."""
        if self.backend.name != backendnames.LOCAL or not observed.orphans:
            return observed
        observed = strays.foresee(desired, observed, owner=self.config.owner, store=self.store,
                                  inventory=self.inventory, extra=extra_ports())  # fmt: skip
        return self.spare_others(desired, observed)

    def plan(self, desired: Desired, observed: Observed) -> list[AnyAction]:
        # The OnDemand demand read again beside `now`: the copy read with the manifests is
        # older by the round's probes (seconds on a loaded host), and an engine a request
        # was waiting for was parked with the gateway's heartbeat fresh on disk.
        demand = activation.read_all(self.config.state_dir, peek=not self.sets_aside)
        desired = replace(desired, activations=demand)
        now = datetime.now(UTC)
        observed = _rekeyed(desired, observed)  # a preview's: a pass wrote them first (_rekey)
        waits, self.images_on = pulling.fetching(self.backend, desired, observed.records, now)
        asked = [] if self.backend.places_engines else _own_ports(desired)
        holders = port_holders(asked, observed.listening)
        return plan(
            desired,
            replace(observed, fetching=waits, images_on=self.images_on, port_holders=holders),
            self.inventory,
            now,
            extra_ports=extra_ports(),
            limits=self.config.limits,
        )


class Reconciler(Preview):
    """One pass and its rounds; the backend and the after-pass hooks come from outside."""

    def __init__(
        self,
        config: Config,
        backend: Backend,
        inventory: Inventory,
        after_pass: Sequence[AfterPass] = (),
        store: RecordStore | None = None,
    ) -> None:
        super().__init__(config, backend, inventory, store)
        self.scale_writes = True  # under the pass lock: a changed count is kept, with its event
        self.sets_aside = True
        # --once: each Ready engine's liveness probed once per pass (the daemon hands in
        # its background prober instead).
        self.liveness = LivenessProber()
        layout = StateDir(config.state_dir)
        self.pass_lock = FileLock(layout.pass_lock, what="pass lock")
        self.placement_lock = FileLock(layout.placement_lock, what="placement lock")
        # The daemon's stop flag: checked between rounds, so a pass ends after the round
        # in flight (SIGTERM finishes what it started, then exits).
        self.interrupted: Callable[[], bool] = lambda: False
        # The pass's nodeSelectors: the nodes they pick are placed on last (Spread).
        self._selectors: frozenset[Selector] = frozenset()
        self.maker = RecordMaker(
            store=self.store,
            inventory=inventory,
            owner=config.owner,
            node=config.node,
            me=identity_of_self(),
            backend=backend.name,
            model_path=self.puller.model_path,
        )
        self.executor = Executor(
            store=self.store,
            backend=backend,
            journal=Journal(config.state_dir),
            maker=self.maker,
            log_max_bytes=config.log_max_bytes,
            log_keep=config.log_keep,
            memory=self._memory_gate(),
            puller=self.puller,
            reserve=self._reserve_now,
        )
        self.adopter = strays.Adopter(
            store=self.store,
            backend=backend,
            maker=self.maker,
            executor=self.executor,
            placement_lock=self.placement_lock,
            lock_timeout=config.lock_timeout,
            extra_ports=extra_ports,
        )
        self._observed: Observed | None = None  # the current round's (see _start)
        # Called after every pass with its result and how long it held the pass lock.
        self.after_pass = list(after_pass)
        self.device_watch = DeviceWatch(config.state_dir, gpuhealth.choose(inventory))
        # --git: the checkout this reconciler fetches and moves (the daemon fetches when due)
        self.git: GitSource | None = None
        # The daemon fetches on a thread of its own (daemon/gitfetch.py): its passes only move
        self.fetched_apart = False
        if config.git:
            from controller.store.sources.git.source import GitSource

            self.git = GitSource(config.state_dir, config.git, identify=live_identity)
        self.notify = notifications_for(config)
        if self.notify is not None:
            self.executor.notify = self.notify
            self.device_watch.on_fault = self._device_fault

    def snapshot(self) -> Snapshot:
        """The records: a pass quarantines one it cannot read, a preview only names it."""
        return self.store.load() if self.sets_aside else self.store.peek()

    def observe(
        self, *, probe: bool = True, desired: Desired | None = None
    ) -> tuple[Observed, list[RecordProblem]]:
        self.device_watch.look()  # before the records: a fault seen now moves them now
        seen = super().observe(probe=probe, desired=desired)
        self.puller.settle()  # what plan only reads: noted under the pass lock
        self.device_watch.measure(seen[0], self.config.node)  # the next round plans with it
        self.maker.inventory = self.inventory  # moved with a cluster's nodes (Preview.observe)
        return seen

    # -- a pass ---------------------------------------------------------------------------

    def run_pass(
        self,
        *,
        lock_timeout: float | None = None,
        at_once: Callable[[], bool] | None = None,
        unchanged: Callable[[], bool] | None = None,
    ) -> PassResult:
        """One pass. ``at_once``: the pass runs before the manifests' folder settled (the
        daemon's first whole change after a quiet spell); it applies its plan only when
        that plan starts new deployments and nothing else, and ``at_once()`` (asked once
        the manifests are read) says no other folder change came meanwhile. Else it does
        nothing (``deferred``): the change may be one file of several still landing.
        ``unchanged()``, asked as ``at_once()`` is, of any pass: False (a manifest was
        written as the pass read it, maybe read as a prefix) and it does nothing too."""
        # Before anything is written there: a folder not its engines' is left as it is.
        replaced.refuse_beside_strangers(self.backend, self.config.state_dir, self.config.owner)
        self.store.ensure()
        stateid.ensure(self.config.state_dir)  # before the first spawn: its engines carry it
        self._remember_labels()
        timeout = self.config.lock_timeout if lock_timeout is None else lock_timeout
        with self._fetch_first() as git_held, self.pass_lock.hold(timeout), self._rotating():
            started = time.monotonic()
            failpoints.hit("reconciler.pass.locked")
            synced = self._sync_git(git_held)
            # Read the manifests once the lock is ours: a pass that waited for another
            # must not act on what the folder held before it waited.
            loaded = self._load()
            if self.git is not None:
                failpoints.hit("git.pass.moved")
            self.executor.take_tally()  # `down` and drains between passes are not this pass's
            if self.liveness is not None:
                self.liveness.begin_pass(self.config.owner)
            seen_at = datetime.now(UTC)  # what `status` says its view's age is from
            result = self._rounds(loaded, at_once, unchanged)
            self.executor.launcher.forget_stops(result.records)
            if not result.deferred:  # the cluster answered: its records are known again
                unreachable.clear(self.store, result.records, self.config.owner)
            if not result.deferred and result.prune_blocked is None:  # as a prune is
                entries = loaded.entries.values()
                pulling.drop_unused_image_pulls(self.backend, entries, result.records.values())
                self.backend.drop_unused_env_files(self._all_records)
                here = [r for r in result.ours() if not r.elsewhere(self.config.node)]
                lateexits.read_late(self.store, self.backend, here, self.executor.event)
            result.git = synced
            if self.git is not None and not result.deferred:  # the history follows them
                if not loaded.unread:  # no commit of the source ran: none has an outcome
                    invalid = self.git.note_invalid(
                        result.errors,
                        folder=_folder_problem(result, loaded),
                        conflicts=result.conflicts(),
                    )
                    self._auto_rollback(result, invalid)
                self._say_move_failed(result, synced)
                self._notify_source(result)
            result.outcomes = self.executor.take_tally()
            result.held = self.executor.take_held()
            note_seen(self.config.state_dir, _seen(result, self.config.node, seen_at))
            seconds = time.monotonic() - started
        for note in diskspace.notes():  # a full disk: the pass went on, but say so
            log.warning("disk full", detail=note)
        if not result.deferred:  # a deferred pass did nothing: nothing to tell
            for hook in self.after_pass:
                hook(result, seconds)
        return result

    def _remember_labels(self) -> None:
        """The labels read in node.yaml, kept for when it goes missing (a disk not
        mounted): every reader then takes them, and nothing is stopped for want of them."""
        cfg = self.config
        if cfg.labels_file is not None and cfg.labels is not None:
            nodelabels.remember(cfg.state_dir, cfg.labels_file, cfg.labels)

    @contextlib.contextmanager
    def _rotating(self) -> Iterator[None]:
        """Rotate the engines' logs as the pass ends, failed or not: a chatty engine's log
        that filled the state dir's disk failed every pass at its first write, and the
        rotation after it, which alone could make room, never came."""
        try:
            yield
        finally:
            logfiles.rotate_all(self.store.logs, self.config.log_max_bytes, self.config.log_keep)

    def _load(self) -> LoadResult:
        """The manifests; a git source's only from a checkout at its applied commit. With
        none (the daemon's first fetch, or one of another url or path, in flight) nothing
        of it is read: no folder, which prunes nothing (``--allow-empty`` or not), so the
        records' engines are kept as they run, and the fetch's end brings the move."""
        if self.git is not None and not self.git.current:
            return LoadResult(
                backend=self.config.backend,
                repo=self.config.repo,
                missing_folders=[str(f) for f in self.config.manifests],
                unread=True,
            )
        return load(
            self.config.manifests,
            insecure=self.config.insecure_manifests,
            backend=self.config.backend,
            cache_file=StateDir(self.config.state_dir).manifest_cache,
            repo=self.config.repo,
            labels=self.reads(),
        )

    @contextlib.contextmanager
    def _fetch_first(self) -> Iterator[FileLock | None]:
        """The git source's fetch, when due, before the pass lock, under git.lock alone,
        which is held on for the pass's move (yielded): a `--once`'s. The daemon's passes
        never fetch (``fetched_apart``): its thread does (daemon/gitfetch.py), its first
        too, so a remote that hangs holds no pass, at its start or ever; they move, or
        run on the commit applied, or on nothing of the source yet (``_load``)."""
        if self.git is None or self.fetched_apart:
            yield None
            return
        with self.git.hold() as lock:
            self.git.fetch_when_due(lock)
            yield lock

    def _sync_git(self, held: FileLock | None) -> SyncResult | None:
        """The git source's checkout moved to the commit to apply, under the pass lock (and
        git.lock): no pass reads a checkout half-moved. ``held``: git.lock, taken for the
        fetch (``_fetch_first``), let go once the checkout moved."""
        if self.git is None:
            return None
        from controller.store.sources.git.source import shown_url

        synced = self.git.apply(held)
        if not self.fetched_apart:  # a `--once`: its fetch's failure stands for each pass
            self.git.standing(synced)
        if held is not None:
            held.release()  # moved: a fetch may start (it writes no work tree)
        for what in synced.events:
            log.info("git source", change=what, url=shown_url(self.git.settings.url))
        return synced

    def _auto_rollback(self, result: PassResult, invalid: bool) -> None:
        """``invalid``: the commit's manifests cannot all be applied (note_invalid)."""
        assert self.git is not None
        drain = read_drain(self.config.state_dir)
        drained = drain is not None and drain.active(datetime.now(UTC), bootclock.read())
        phases = result.rollout_phases()
        rolled = self.git.note_outcome(phases, result.specs, invalid=invalid, drained=drained)
        if rolled is None:
            return
        log.warning("git auto-rollback", detail=rolled)
        for rec in result.ours():
            self.executor.journal.append(rec.name, "auto-rollback", rolled, "pinned")
        if self.notify is not None:
            names = sorted({base_name(r.name) for r in result.ours()})
            back_to = self.git.status().pinned  # the commit it runs from the next pass on
            self.notify.emit("RolledBack", rolled, revision=back_to, deployments=names)

    def _say_move_failed(self, result: PassResult, synced: SyncResult | None) -> None:
        """A move's first failure for its commit (a pin whose commit the checkout lacks),
        journaled for each of the source's deployments, once: its retries are quiet."""
        if synced is None or synced.move_failed is None:
            return
        for rec in result.ours():
            self.executor.journal.append(rec.name, "checkout", synced.move_failed, "failed")

    def _notify_source(self, result: PassResult) -> None:
        """The git source's state (`reconcile source`'s), notified when it changes."""
        if self.notify is None:
            return
        from controller.store.sources.git.source import (
            DEGRADED,
            degraded,
            phases_of,
            read_status,
            state_of,
        )

        st = read_status(self.config.state_dir)
        if st is None:
            return
        if st.pinned and st.applied != st.pinned and not st.stuck_move:
            # autoRollback pins after this pass's move: Pinned, told now, named the commit
            # rolled back from, and again at the next pass's move; told once, by that pass
            return
        phases = phases_of(result.ours())
        state, message = state_of(st, phases)
        names: list[str] = []
        if state == DEGRADED:  # a manifest that did not load: its engine runs on, named too
            kept = [r.name for r in result.ours() if not r.spec_valid]
            names = sorted({*degraded(phases), *kept})
        self.notify.source_state(state, message, st.applied, deployments=names)

    def _device_fault(self, device: str, why: str) -> None:
        assert self.notify is not None
        held = [base_name(r.name) for r in self.store.load().records.values()
                if device in r.devices and not r.elsewhere(self.config.node)]  # fmt: skip
        self.notify.emit("Unhealthy", why, revision=self.maker.revision, deployments=held)

    def _memory_gate(self) -> MemoryGate:
        """NVML's word before a start (the fake file's, by device key, where one is set),
        ended by the daemon's stop: read late, as the daemon sets ``interrupted`` after."""
        fake = gpuhealth.fake_free_memory()
        return MemoryGate(
            read=gpu_memory if fake is None else fake,
            by_key=fake is not None,
            interrupted=lambda: self.interrupted(),
        )

    def _rounds(
        self,
        loaded: LoadResult,
        at_once: Callable[[], bool] | None,
        unchanged: Callable[[], bool] | None,
    ) -> PassResult:
        desired = self.desired(loaded)
        self.maker.revision = desired.revision  # what the records state (and Update compares)
        self._selectors = bound_selectors(e.deployment.spec for e in desired.entries.values())
        result = PassResult(
            errors=[*loaded.errors, *self._emptied_errors(loaded)],
            owner=self.config.owner,
            node=self.config.node,
        )
        result.names = set(desired.instances())
        result.specs = {name: entry.hash for name, entry in desired.entries.items()}
        result.sources = pulling.sources_of(desired.entries.values())
        result.skipped = dict(desired.skipped)
        result.invalid = set(desired.invalid)
        result.broken = dict(desired.source_errors)
        result.prune_blocked = _prune_blocked(loaded, self._may_empty(loaded))
        result.missing_folders = list(loaded.missing_folders)
        result.folder_problems = loaded.folder_problems()
        result.folder_errors = loaded.folder_errors()
        result.no_manifest = loaded.no_manifest
        self._rekey(desired)
        settled: Observed | None = None  # the last round's view, when it changed nothing
        for _ in range(MAX_ROUNDS):
            if self.interrupted():
                break  # the daemon is stopping: the round in flight was finished
            observed, problems = self.observe(desired=desired)
            adopted = self.adopter.rebuild(desired, observed) if observed.orphans else {}
            if adopted:
                result.adopted.update(adopted)
                observed, more = self.observe(desired=desired)  # the adopted one has a record
                problems = [*problems, *more]
            self._tell_unproven(desired, observed, result)
            observed = self.spare_others(desired, observed)
            _add_problems(result, problems)  # a quarantine is seen by one round only
            result.pulls = dict(observed.pulls)
            result.probes.update(
                {n: v.probe.detail for n, v in observed.records.items() if v.probe}
            )
            actions = self.plan(desired, observed)
            if not _applies(actions, observed, at_once, unchanged):
                result.deferred = True
                settled = observed
                break
            at_once = unchanged = None  # the first round's plan decides
            if not self._execute(actions, observed, result):
                # A (re)start or fetch that waits for its image's pull asks for no further
                # round, but it wrote its record (Pulling): the round's view is stale then.
                pulls = any(isinstance(a, Start | Restart | Fetch) for a in actions)
                settled = None if pulls else observed
                break
        if settled is not None:  # nothing written since it read them (the pass lock is ours)
            result.records = {name: view.record for name, view in settled.records.items()}
        else:
            final = self.store.load()
            _add_problems(result, final.problems)
            result.records = final.records
        if result.prune_blocked is not None:  # what --once, --wait and notify say of them
            result.records = {n: _as_read(r, result.owner) for n, r in result.records.items()}
        self._end_histories(desired, result)
        return result

    def _tell_unproven(self, desired: Desired, observed: Observed, result: PassResult) -> None:
        """Each engine no pass may adopt or stop (strays.unproven) said by this pass, and
        journalled under its name once per engine: its port and devices were held with
        nothing said anywhere."""
        if self.backend.name != backendnames.LOCAL or not observed.orphans:
            return
        notes = StateDir(self.config.state_dir).spawn_notes
        found = strays.unproven(desired, observed, owner=self.config.owner,
                                inventory=self.inventory, notes=notes)  # fmt: skip
        for one in found:
            result.unproven[one.name] = words = one.words()
            outcome = f"left running: pid {one.pid}"
            told = self.executor.journal.read(base_name(one.name))
            if not any(e.get("action") == SPARE and e.get("outcome") == outcome for e in told):
                self.executor.event(one.name, SPARE, words, outcome)

    def _end_histories(self, desired: Desired, result: PassResult) -> None:
        """A journal of this set's whose deployment has no record and no manifest ends
        with ``removed``, once, as a prune ends one: `down` (or a drain) dropped its last
        record, then its manifest went (launcher ``_drop``: that event names the set).
        Only where the folder can prune (invariant 5) and every file was read: a broken
        or emptied file's names are not known."""
        if result.deferred or result.prune_blocked is not None or not desired.prune:
            return
        if desired.broken_sources or desired.emptied:
            return
        journal = self.executor.journal
        kept = {base_name(n) for n in result.records}
        kept |= {*desired.entries, *desired.invalid, *desired.skipped}
        for name in sorted(set(journal.names()) - kept):
            last = journal.read(name, last=1, history=True)
            open_ours = last and last[-1].get("owner") == self.config.owner
            if open_ours and last[-1].get("action") != REMOVED:
                self.executor.event(name, REMOVED, "manifest removed", REMOVED_OUTCOME)

    def _rekey(self, desired: Desired) -> None:
        """Records a release before hashed otherwise (before the secrets key, before vLLM's
        --config file or llama.cpp's key file was hashed), what they ran on unchanged, get
        today's hash on disk before the pass looks: their engines keep running."""
        entries = desired.entries.values()
        if not any(e.unkeyed_digest or e.config_digest or e.key_file_digest for e in entries):
            return
        for record in rekeyed(desired, self.store.load().records.values()):
            self.store.write(record)
            log.info("record re-keyed", deployment=record.name, detail="an older hash")

    def _execute(
        self, actions: Sequence[AnyAction], observed: Observed, result: PassResult
    ) -> bool:
        """Apply one round's actions; True when anything changed (plan again)."""
        changed = False
        # An orphan's port was seen as another process's by this round's plan (its record
        # gone, nothing counts it as ours): a start beside its reap was refused "port in
        # use". Reaps go alone; the next round places against what they freed.
        reaps = [a for a in actions if isinstance(a, Reap)]
        actions = reaps or actions
        # Teardowns may each wait out a grace period: they run concurrently.
        teardowns = [a for a in actions if a.tears_down]
        starts = [a for a in actions if isinstance(a, Start)]
        rest = [a for a in actions if not a.tears_down and not isinstance(a, Start)]
        for action in rest:
            changed |= self.executor.apply(action)
            _note(result, action)
        if teardowns:
            changed |= any(self.concurrently(teardowns))
            for teardown in teardowns:
                _note(result, teardown)
        if starts:
            changed |= self._start(starts, observed, result)
        return changed

    def _start(self, starts: Sequence[Start], observed: Observed, result: PassResult) -> bool:
        self._observed = observed  # the round's: what the reservations place against
        try:
            started = self.executor.start(starts)
        finally:
            self._observed = None
        for start in started:
            _note(result, start)
        return bool(started)

    def _reserve_now(self, starts: Sequence[Start]) -> list[tuple[Start, Lease | Record]]:
        """The executor's reservations: against the observations of the round that starts
        them, or (a start applied alone) of a fresh look at the node."""
        observed = self._observed if self._observed is not None else self.observe()[0]
        return self._reserve(starts, observed)

    def _reserve(
        self, starts: Sequence[Start], observed: Observed
    ) -> list[tuple[Start, Lease | Record]]:
        """Under the placement lock: re-read records, re-place, write the reservations
        (a Lease: the record and its rendering) or the Pending records saying why not."""
        out: list[tuple[Start, Lease | Record]] = []
        # The planner's order (highest priority first): re-placing in it under the lock
        # reproduces the plan's fits, so a tight best-fit packing cannot come out short.
        ordered = sorted(starts, key=lambda s: (-s.entry.deployment.spec.priority, s.name))
        with self.placement_lock.hold(self.config.lock_timeout):
            fresh = self.store.load()
            ledger = ledger_for(fresh.records.values(), observed)
            for start in ordered:
                current = fresh.records.get(start.name)
                if current is not None and not _unplaced(current):
                    continue  # another pass placed it meanwhile
                near = near_of(start.entry, observed.pulls, self.images_on)  # as plan had them
                taken, refused = self._lease(start, ledger, near)
                taken = count_kept(current, taken)
                record = taken.record if isinstance(taken, Lease) else taken
                if is_next(start.name) and not isinstance(taken, Lease):
                    continue  # a rolling `@next` that cannot start: no Pending over the old
                if refused and current is not None and current.message == record.message:
                    continue  # the recipe's refusal is on record already: no further round
                self.store.write(record)
                failpoints.hit("reconciler.reserve.after_write")
                out.append((start, taken))
            failpoints.hit("reconciler.reserve.before_release")
        return out

    def _lease(
        self, start: Start, ledger: Ledger, near: frozenset[str]
    ) -> tuple[Lease | Record, bool]:
        """A reservation taken in ``ledger``, or a Pending record saying why not.

        The flag is True when the recipe refused the spec (no placement can help).
        """
        short = self.backend.unplaceable(start.entry.deployment.spec)
        if short is not None:  # the cluster has no room: same as a recipe refusal, no rounds
            return self.maker.pending(start.entry, short, name=start.name), True
        placed = self._place(start, ledger, near)
        if isinstance(placed, Unplaced):
            return self.maker.pending(start.entry, placed.reason, name=start.name), False
        try:
            lease = self.maker.reservation(
                start.entry,
                name=start.name,
                devices=placed.devices,
                port=placed.port,
                extra_ports=placed.extra_ports,
            )
        except RecipeError as exc:  # the recipe refuses this spec: say so, go on
            return self.maker.pending(start.entry, str(exc), name=start.name), True
        record = lease.record
        ledger.take(start.name, placed.devices, placed.ports, record.shareable, record.memory)
        return lease, False

    def _place(self, start: Start, ledger: Ledger, near: frozenset[str]) -> Placed | Unplaced:
        spec = start.entry.deployment.spec
        inventory = only_kinds(self.inventory, kinds_of(start.devices))  # the plan's kinds
        extra = extra_ports().get(spec.engine, 0)
        # As the planner placed it: replicas apart, selector-bound nodes last, the nodes
        # holding its files first.
        spread = Spread(start.entry.name, self._selectors, near)
        placed = place(spec, inventory, ledger, extra, spread=spread)
        bindable = self.backend.port_bindable
        while isinstance(placed, Placed) and not all(map(bindable, placed.ports)):
            # /proc/net missed a bound (not yet listening) socket: skip that port.
            ledger.listening = ledger.listening | {p for p in placed.ports if not bindable(p)}
            placed = place(spec, inventory, ledger, extra, spread=spread)
        return placed

    def _emptied_errors(self, loaded: LoadResult) -> list[ManifestError]:
        """An error for each emptied file one of this set's records came from: `--once`
        exits 1 on it (cron mails), since what it declared runs on though it says nothing."""
        emptied = self._emptied(loaded)
        if not emptied:
            return []
        records = self.store.load().records.values()
        sources = {r.source for r in records if r.owner == self.config.owner}
        return [
            loaded.error(ManifestError(f, None, None, EMPTIED)) for f in sorted(emptied & sources)
        ]

    # -- teardown of a whole manifest set ---------------------------------------------------

    def down(self, which: Callable[[Record], bool] = lambda _: True, *, strays: bool = False
             ) -> tuple[list[str], dict[str, str]]:  # fmt: skip
        """Stop every deployment this manifest set owns on this node (``reconcile down``),
        or those of them ``which`` selects (``-l``). ``strays``: the set's engines that no
        record accounts for go too (a whole set's `down`: they have no name to select).
        What went, and what did not (``stop_where``)."""
        owner = self.config.owner
        reaped = self._adopt_torn(strays)
        if strays:  # the explicit way to start afresh on a state dir replaced (replaced.py)
            reaped += self._reap_strangers()
        stopped, kept = self.stop_where(lambda r: r.owner == owner and which(r), "reconcile down")
        return reaped + stopped, kept

    def _adopt_torn(self, reap: bool) -> list[str]:
        """Under the pass lock, the engines of torn records adopted before `down` looks
        (with ``reap``, this set's still without a record reaped: their names)."""
        self.store.ensure()
        with self.pass_lock.hold(self.config.lock_timeout):
            return self.adopter.adopt_torn(
                lambda: self.observe(probe=False)[0], self._desired_now, strays=reap
            )

    def _reap_strangers(self) -> list[str]:
        """This set's engines of another state dir at this path, which its passes refuse
        to act beside, reaped as its strays are: the names of those."""
        with self.pass_lock.hold(self.config.lock_timeout):
            return self.adopter.reap_own(self.backend.strangers(), why=replaced.REAPED)

    def _desired_now(self) -> Desired:
        loaded = load(self.config.manifests, insecure=self.config.insecure_manifests,
                      backend=self.config.backend, repo=self.config.repo)  # fmt: skip
        return self.desired(loaded)

    def elsewhere(self) -> list[Record]:
        """This set's records that another node made: `down` there must stop them."""
        records = self.store.load().records.values()
        return [
            r for r in records if r.owner == self.config.owner and r.elsewhere(self.config.node)
        ]

    def stop_where(self, which: Callable[[Record], bool], reason: str, *, evict: bool = False
                   ) -> tuple[list[str], dict[str, str]]:  # fmt: skip
        """Under the pass lock, stop (concurrently) every record ``which`` selects: the
        names stopped, and those not (name -> why: an engine not proven ours, its record
        kept). ``evict``: each record stays, Pending (a drain's eviction: ``Stop.evict``).
        Each is drained from the gateway first (``Launcher.drain``, as the daemon's stops
        are): its answers in flight end, up to its grace period, before its SIGTERM."""
        self.store.ensure()
        with self.pass_lock.hold(self.config.lock_timeout):
            records = self.store.load().records.values()
            one_backend(records, self.backend.name, self.config.state_dir)
            chosen = [r for r in records if which(r) and not r.elsewhere(self.config.node)]
            stops = [Stop(name=r.name, reason=reason, drain=True, evict=evict) for r in chosen]
            self.concurrently(stops)
            self.backend.drop_unused_env_files(self._all_records)  # a start killed left one
            kept = self.executor.take_held()
            return [r.name for r in chosen if r.name not in kept], kept

    def _all_records(self) -> Iterable[Record]:
        return self.store.load().records.values()

    def concurrently(self, actions: Sequence[AnyAction]) -> list[bool]:
        """Apply teardowns at once: one slow grace period must not serialise the rest."""
        if not actions:
            return []
        pool = ThreadPoolExecutor(max_workers=min(16, len(actions)))
        cut = False  # a Ctrl-C: the teardowns under way finish, unless a second one comes
        try:  # a list, not any(): any() would stop early and drop a later teardown's error
            return list(pool.map(self.executor.apply, actions))
        except KeyboardInterrupt:
            cut = True
            names = ", ".join(sorted({a.name for a in actions}))
            log.warning("interrupted", detail=f"finishing the teardown under way of {names}"
                        " (each within its grace period); Ctrl-C again leaves it"
                        " Terminating, for the next pass to finish")  # fmt: skip
            pool.shutdown(wait=True)  # a second Ctrl-C raises out of this wait
            raise
        finally:  # after a second Ctrl-C, the CLI exits without them (cli/interrupted.py)
            pool.shutdown(wait=not cut)


def one_backend(records: Iterable[Record], backend: str, state_dir: Path) -> None:
    """Refuse a pass (or `down`) whose backend did not make the state dir's records: it
    would judge them as its own, find none of their engines, and start (or drop the
    records of) engines the other backend still runs: a second copy, the first lost."""
    others: dict[str, list[str]] = {}
    for rec in records:
        if rec.backend != backend:
            others.setdefault(rec.backend, []).append(rec.name)
    if not others:
        return
    made, names = sorted(others.items())[0]
    shown = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
    raise ConfigError(
        f"the state dir {state_dir} holds records of the {made} backend ({shown}) and this"
        f" runs --backend {backend}: a state dir is one backend's. Stop those with the"
        f" backend that made them (`reconcile down --backend {made}`), or give --backend"
        f" {backend} its own --state-dir. Nothing was changed"
    )


def notifications_for(config: Config) -> Notifications | None:
    """The queue of node.yaml's hooks (None without any); the source as payloads name
    it: the repository URL without credentials, or the manifests folders."""
    if not config.notify:
        return None
    from controller.store.instances.outbox import Notifications
    from controller.store.sources.git.source import shown_url

    if config.git is not None:
        source = shown_url(config.git.url)
    else:
        source = ",".join(str(p) for p in config.manifests)
    return Notifications(config.state_dir, config.notify, node=config.node, source=source)


def identity_of_self() -> ProcessRef:
    ref = identity(os.getpid())
    assert ref is not None
    return ref


@functools.cache
def extra_ports() -> dict[str, int]:
    return {engine: _extra(engine) for engine in MODULES}


def _extra(engine: str) -> int:
    try:
        return recipe_for(engine).extra_ports
    except (ImportError, AttributeError):
        return 0


def _as_read(record: Record, owner: str) -> Record:
    """A record of this set (``owner``) as a pass that read no manifest shows it, as
    `status` does (``observed.Views.as_read``); another set's, as it is."""
    return record.unmarked() if record.owner == owner else record


def _selector(entry: Entry) -> Mapping[str, str]:
    return entry.deployment.spec.node_selector


def _source_errors(loaded: LoadResult) -> dict[str, str]:
    """The first error of each file that could not be loaded (for `status` to show)."""
    out: dict[str, str] = {}
    for error in loaded.errors:
        if error.file in loaded.broken_sources:
            out.setdefault(error.file, str(error))
    return out


def _add_problems(result: PassResult, problems: Sequence[RecordProblem]) -> None:
    seen = {p.message for p in result.problems}
    result.problems.extend(p for p in problems if p.message not in seen)


def _note(result: PassResult, action: Action) -> None:
    if isinstance(action, Hold | Conflict | HoldChange) and any(
        a.name == action.name and type(a) is type(action) for a in result.actions
    ):
        return
    result.actions.append(action)


def _seen(result: PassResult, node: str, at: datetime) -> Seen:
    """This pass's note for `status`: when it looked, and the condition of a set whose
    folders held no manifest (its deployments run on, unpruned: invariant 5)."""
    blocked = None
    if result.prune_blocked:
        why = "; ".join(result.folder_problems) or result.no_manifest or "no manifest"
        blocked = f"{why}: {NOTHING_PRUNED}"
    skipped, kept = result.left_and_kept()
    return Seen(
        node=node,
        owner=result.owner,
        at=at,
        prune_blocked=blocked,
        skipped=skip_note(skipped),
        kept=kept_note(kept),
        held=_held_note(result),
        unloaded=_unloaded(result),
    )


def _unloaded(result: PassResult) -> list[str]:
    """The files that did not load and that no record of this set names: a new file with a
    YAML syntax error has no deployment to show Pending, so `status` says it from here."""
    named = {r.source for r in result.ours()}
    return [error for file, error in sorted(result.broken.items()) if file not in named]


def _held_note(result: PassResult) -> dict[str, str]:
    """This set's Ready engines whose new spec's model pull keeps failing, or whose new
    image did not pull (``result.held``): they serve the old spec, which `status` would
    otherwise show as all well while `--once` exits 1 (a Pulling record's own message says
    its failure already, and so does one kept as not proven ours)."""
    ours = result.ours()
    serving = {base_name(r.name) for r in ours if r.phase is Phase.READY}
    failing = pulling.failing(ours, result.pulls, result.sources)
    said = {r.name: r.message for r in ours}
    kept = {
        base_name(name): why
        for name, why in result.held.items()
        if base_name(name) in serving and said.get(name) != why
    }
    return kept | {
        name: f"{why.removeprefix(f'{name}: ')}: the engine serves its old spec meanwhile"
        for name, why in failing.items()
        if name in serving
    }


def _unplaced(rec: Record) -> bool:
    """Waiting to be placed: holding nothing, with no engine (a Start may lease for it)."""
    waits = (Phase.PENDING, Phase.IDLE, Phase.PULLING)
    return rec.phase in waits or rec.unleased_backoff


def crash_text(rec: Record) -> str:
    """A crash-looping record, for `--once`'s and `plan`'s errors."""
    return f"{rec.name} is crash-looping ({rec.message or 'BackOff'})"


def exec_text(rec: Record) -> str:
    """A record whose last start could not exec its program, for `--once`'s, `--wait`'s
    and `plan`'s errors: its message names the program and the next move."""
    return f"{rec.name} did not start: {backoff_cause(rec.message)} (retried in its back-off)"


def failed_text(rec: Record) -> str:
    """Why ``rec`` (crash-looping, or its program not exec'd) fails `--once`."""
    return exec_text(rec) if rec.exec_failed else crash_text(rec)


def count_kept(current: Record | None, taken: Lease | Record) -> Lease | Record:
    """``taken`` with the restart count ``current`` carries for its spec (``kept_count``)."""
    record = taken.record if isinstance(taken, Lease) else taken
    restarts = kept_count(current, record)
    if not restarts:
        return taken
    if isinstance(taken, Lease):
        return Lease(replace(record, restarts=restarts), taken.rendered)
    return replace(taken, restarts=restarts)


def _applies(
    actions: Sequence[Action],
    observed: Observed,
    at_once: Callable[[], bool] | None,
    unchanged: Callable[[], bool] | None,
) -> bool:
    """The first round's plan may be applied (``run_pass``'s ``at_once``, ``unchanged``)."""
    if at_once is not None and not (only_starts_new(actions, observed.records) and at_once()):
        return False
    return unchanged is None or unchanged()


def _folder_problem(result: PassResult, loaded: LoadResult) -> str | None:
    """What kept the pass from pruning, said of the git source's path at its commit."""
    if result.prune_blocked is None:
        return None
    if not result.missing_folders:
        return "no manifest in it"
    first = result.missing_folders[0]
    if first in loaded.unusable:  # there, but refused (a file, a symlink out of the repository)
        return f"{loaded.unusable[first]} at this commit"
    return "no such folder at this commit" + loaded.near_folder(first)


def _prune_blocked(loaded: LoadResult, allow_empty: bool) -> str | None:
    if loaded.prune_safe or allow_empty:
        return None
    if loaded.missing_folders:
        return "; ".join(loaded.folder_problems())
    return loaded.no_manifest or "no manifest found"


def _own_ports(desired: Desired) -> list[int]:
    """The ports manifests ask for by number (`spec.port`): a scan from basePort steps
    over a taken one, so only these may be Pending for a port someone else holds."""
    return [port for e in desired.entries.values() if (port := e.deployment.spec.port)]


def _rekeyed(desired: Desired, observed: Observed) -> Observed:
    """``observed`` with the records :func:`rekeyed` gives the keyed hash (in memory)."""
    found = rekeyed(desired, (v.record for v in observed.records.values()))
    if not found:
        return observed
    views = dict(observed.records)
    for record in found:
        views[record.name] = replace(views[record.name], record=record)
    return replace(observed, records=views)


def _with_key_file(entry: Entry, data: bytes, key: bytes | None) -> Entry:
    """``entry`` with its hash covering its llama.cpp key file's bytes (``data``, their
    digest under ``key``): an edit of the file restarts the engine, which reads it only at
    its start."""
    digest = keyfile.digest(data, key)
    return replace(entry, key_file_digest=digest, hash=with_key_file(entry.hash, digest))


def resolve_secrets(
    loaded: LoadResult,
    key: Callable[[], bytes | None],
    untrusted: Callable[[Path], str | None] | None,
    *,
    here: Callable[[Entry], bool],
    unread: dict[str, list[Unread]] | None = None,
) -> None:
    """Each entry this node runs (``here``) with spec.envFrom gets its values and a hash
    that covers them, keyed with ``key()`` (asked once, when an entry names envFrom or a
    key file; None: unkeyed); one whose file is missing, too open, another user's (as
    root: ``untrusted``) or undecryptable becomes invalid, naming the file: Pending if it
    never ran, its running engine untouched (the planner's invalid-spec rule). llama.cpp's
    key file, read at load, joins the hash first, keyed the same way (``_with_key_file``).
    ``unread`` (`plan`'s): a sopsFile no age key here opens is noted there by deployment,
    the entry's hash left without the values (Preview._as_recorded plans it)."""
    key_once = functools.cache(key)  # read (a pass: made) only when a spec names a secret
    for name, entry in list(loaded.entries.items()):
        if entry.key_file is not None:
            entry = loaded.entries[name] = _with_key_file(entry, entry.key_file, key_once())
        if not entry.deployment.spec.env_from or not here(entry):
            continue
        from controller.host import secrets  # only where a spec names secrets

        missing: list[secrets.Unread] | None = None if unread is None else []
        folder = Path(entry.source).parent
        try:
            env = secrets.resolve(entry.deployment.spec, folder, untrusted, missing)
        except secrets.SecretError as exc:
            loc = ("spec", "envFrom", exc.index)
            error = loaded.error(ManifestError(
                entry.source, loaded.line_of(entry, loc), f"spec.envFrom[{exc.index}]",
                str(exc), name, on_node=exc.on_node,
            ))  # fmt: skip
            del loaded.entries[name]
            loaded.errors.append(error)
            loaded.invalid_names[name] = str(error)
            continue
        if unread is not None and missing:  # values unknown: no digest to cover
            unread[name] = missing
            loaded.entries[name] = dataclasses.replace(entry, secret_env=env, secrets_unread=True)
            continue
        unkeyed = secrets.unkeyed_digest(env)
        digest = unkeyed if (k := key_once()) is None else secrets.digest(env, k)
        loaded.entries[name] = dataclasses.replace(
            entry, secret_env=env, secret_digest=digest, unkeyed_digest=unkeyed,
            hash=with_secrets(entry.hash, digest),
        )  # fmt: skip
