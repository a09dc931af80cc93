"""`reconcile history [-o json]` and `reconcile rollback [REV] | --resume | --dry-run`.

Both need only the state dir: the source is the one it remembers. A rollback pins the
source at an older commit (``pinned`` in ``<state>/git/source.json``): the node keeps
fetching (``source`` shows how far behind it is) but applies nothing new until
``--resume``. The pin is applied by a pass: the running daemon's (woken at once), or
this command's own when no daemon runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

from controller.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, config, looks, output_format
from controller.cli.common import reconciler as build
from controller.core.manifest.names import base_name
from controller.errors import LockTimeout
from controller.host.procs import live_identity
from controller.reconciler.run import notifications_for
from controller.redact import printable
from controller.store.config.node import Config
from controller.store.instances.events import Journal
from controller.store.instances.records import RecordStore
from controller.store.lock import FileLock
from controller.store.sources.git import source as gitsource
from controller.store.statedir import StateDir

APPLY_WAIT = 60.0  # seconds to wait for the daemon's pass to apply the pin


def cmd_history(args: argparse.Namespace) -> int:
    fmt = output_format(args, "table", ("table", "json"))
    if fmt is None:
        return EXIT_USAGE
    cfg = config(args, lenient=True)
    # A read verb moves nothing aside; a damaged source.json (named by the peek) leaves
    # the history readable: it is where its refusal sends the operator for a commit.
    followed = gitsource.peek_status(cfg.state_dir) is not None
    if not followed and not StateDir(cfg.state_dir).git_history.exists():
        return _no_source(cfg)
    entries = gitsource.peek_history(cfg.state_dir)
    if fmt == "json":  # the contract's fields; the spec hashes are the node's own memo
        print(json.dumps([{k: v for k, v in e.items() if k != "specs"} for e in entries], indent=2))
        return EXIT_OK
    print(f"{'REVISION':<13} {'APPLIED AT':<26} {'OUTCOME':<12} {'BY':<14} {'AUTHOR':<16} SUBJECT")
    for e in entries:  # a commit's author and subject are the committer's text: shown
        author, subject = printable(e.get("author", "")), printable(e.get("subject", ""))
        print(
            f"{e['revision'][:12]:<13} {e.get('applied_at', ''):<26} {e.get('outcome', ''):<12}"
            f" {e.get('by', ''):<14} {author[:16]:<16} {subject}"
        )
    return EXIT_OK


def cmd_rollback(args: argparse.Namespace) -> int:
    cfg = config(args)
    st = gitsource.read_status(cfg.state_dir)
    if st is None or cfg.git is None:
        return _no_source(cfg)
    source = gitsource.GitSource(cfg.state_dir, cfg.git, always_fetch=False, identify=live_identity)
    if args.resume:
        if st.pinned is None:  # nothing to lift: no event, no pass (a script may ask twice)
            print(f"not pinned: already following {st.branch or st.tag}")
            return EXIT_OK
        target, why = None, f"resumed: following {st.branch or st.tag} again"
    else:
        found = _target(cfg, source, st, args.rev, dry_run=args.dry_run)
        if found is None:
            return EXIT_FAIL
        target, why = found, f"rolled back to {found[:12]} (from {(st.applied or '-')[:12]})"
        if args.dry_run:
            return _show_change(cfg, source, st, target)
    from controller.cli.operate.restartverb import daemon_pid

    daemon = daemon_pid(cfg.state_dir)
    if target is None and daemon:  # without one, this command's own pass fetches first
        _fetch_for_resume(source, daemon)
    lacked = target if target is not None and _in_checkout(source, target) is None else None
    _pin(source, target, daemon)
    if lacked is not None:  # fetched by its id by the move
        return _apply_then_say(cfg, st.owner, lacked, why, daemon)
    _journal(cfg, st.owner, target, why)
    print(why)
    return _apply(cfg, target, daemon)


def _apply_then_say(cfg: Config, owner: str, target: str, why: str, daemon: int | None) -> int:
    """A commit the checkout lacks is the move's to fetch, and the remote may refuse it:
    "rolled back to" it, its event and its RolledBack notification (whose ``revision`` is
    the commit applied) wait for the move, and a move that failed claims none of them (it
    is said by the move: a `checkout` event, PullFailed, the pin standing). One the daemon
    has not tried within the wait is announced, as a pin on a held commit is."""
    code = _apply(cfg, target, daemon)
    st = gitsource.read_status(cfg.state_dir)
    if st is not None and (st.applied == target or st.move_target != target):
        _journal(cfg, owner, target, why)
        print(why)
    return code


def _target(
    cfg: Config,
    source: gitsource.GitSource,
    st: gitsource.SourceStatus,
    rev: str | None,
    *,
    dry_run: bool = False,
) -> str | None:
    if rev is None:
        good = gitsource.last_good(cfg.state_dir, but=st.applied)
        if good is None:
            print(
                "reconcile: no earlier commit whose deployments were all Ready: name one"
                " (reconcile history lists what was applied)",
                file=sys.stderr,
            )
        return good
    held = _in_checkout(source, rev)
    if held is not None:
        return held
    sha = rev.lower() if gitsource.SHA.match(rev.lower()) else _named(source, rev)
    if sha is None:
        return None
    if sha != rev.lower() and (held := _in_checkout(source, sha)) is not None:
        return held  # a tag or branch the checkout holds the commit of (it fetches no tags)
    if dry_run:  # its manifests are not here to read
        print(
            f"reconcile: {rev[:12]} is not in the node's checkout, and a dry run fetches"
            f" nothing: roll back to it (reconcile rollback {rev}: the move fetches it),"
            " or dry-run a commit reconcile history lists",
            file=sys.stderr,
        )
        return None
    print(f"reconcile: {sha[:12]} is not in the node's checkout: the move fetches it by its id")
    return sha


def _in_checkout(source: gitsource.GitSource, rev: str) -> str | None:
    try:
        return gitsource.git(source.repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except gitsource.GitFailed:
        return None


def _named(source: gitsource.GitSource, rev: str) -> str | None:
    """The commit of a tag or branch ``rev`` on the remote (the checkout fetches no tags),
    or None, said: the next move is the commit's id."""
    how = (
        "name a commit reconcile history lists, or a commit by its whole id (40 hex digits;"
        f" `git rev-parse {rev}^{{commit}}` in a clone prints a tag's)"
    )
    try:
        sha = source.named_on_remote(rev)
    except gitsource.GitFailed as exc:
        print(
            f"reconcile: {rev!r} is no commit the node has fetched, and the remote could not"
            f" be asked for a tag or branch of that name ({exc}): {how}",
            file=sys.stderr,
        )
        return None
    if sha is None:
        print(
            f"reconcile: {rev!r} is no commit the node has fetched, nor a tag or branch of"
            f" the remote: {how}",
            file=sys.stderr,
        )
    return sha


def _show_change(
    cfg: Config, source: gitsource.GitSource, st: gitsource.SourceStatus, target: str
) -> int:
    """The plan a pass would make against ``target``'s manifests (``reconcile plan``'s
    read-only Preview), changing nothing: the manifests are read from git into a temp dir."""
    from controller.cli.common import preview
    from controller.cli.render import planview
    from controller.host import secrets
    from controller.store.sources.manifests import load

    with tempfile.TemporaryDirectory(prefix="reconcile-rollback-") as tmp:
        folder = _export(source.repo, target, st.path, Path(tmp))
        # named as the repository does (a pass names them so): not by the temp dir
        view = preview(cfg)
        view.unread_secrets = {}  # as `plan`: a sopsFile no key here opens is unknown
        loaded = load(
            [folder],
            insecure=cfg.insecure_manifests,
            backend=cfg.backend,
            repo=Path(tmp),
            labels=view.reads(),
        )
        # the records' files lie in the checkout, outside this folder: no manifest "moved"
        desired = dataclasses.replace(view.desired(loaded), revision=target, folders=(str(folder),))
        # envFrom's values first, as `plan`: a Starting engine keyed from them or a key
        # file is probed with its key (probekeys.py), not refused and shown Starting.
        observed, problems = view.observe(desired=desired)
        observed = view.foresee_strays(desired, observed)
        found = planview.changes(view.plan(desired, observed), desired, observed)
    errors = [str(e) for e in loaded.errors] + [p.message for p in problems]
    print(f"rollback {(st.applied or '-')[:12]} -> {target[:12]} would make this plan:")
    print(planview.text(found, errors))
    print("".join(f"note: {n}\n" for n in secrets.unread_notes(view.unread_secrets)), end="")
    return EXIT_FAIL if errors else EXIT_OK


def _export(repo: Path, commit: str, path: str, into: Path) -> Path:
    """The manifest folder ``path`` as it is at ``commit``, written under ``into``; a
    folder missing at the commit comes out empty (the empty-folder guard, as a pass).

    As a checkout has it: a symlink is made a symlink (a pass follows one that stays in
    its folder and refuses one that leads out, and ``load`` checks these the same way),
    and a submodule is left out (a checkout leaves it empty). Each was read as a file:
    `git show` of a submodule failed (the dry-run ended in a traceback), and a link's
    target text was read as YAML."""
    spec = [] if path == "." else ["--", path]
    listed = gitsource.git(repo, "ls-tree", "-r", "-z", commit, *spec)
    for entry in filter(None, listed.split("\0")):
        meta, _, name = entry.partition("\t")
        mode, kind, _ = meta.split()
        if kind != "blob":  # a submodule's commit: none of its files is the repository's
            continue
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        content = gitsource.git(repo, "show", f"{commit}:{name}")
        if mode == _SYMLINK:
            target.symlink_to(content)
        else:
            target.write_text(content + "\n")
    folder = into / path
    if not folder.is_symlink():  # one that leads nowhere here is load's to say
        folder.mkdir(parents=True, exist_ok=True)
    return folder


_SYMLINK = "120000"  # git's mode of a symlink in a tree


def _pin(source: gitsource.GitSource, target: str | None, daemon: int | None) -> None:
    """The pin written (``source.json`` has a lock of its own). With a daemon its pass
    moves the checkout, stopping its own fetch for it (``GitSource.make_way``): no wait
    on a remote that hangs. Without one this command's own pass moves it, under git.lock:
    taken here first, so a wait for another reconcile's fetch is said, not silent; its
    collection (`git gc`, minutes for a large checkout) is stopped, never waited for."""

    def pin(st: gitsource.SourceStatus) -> None:
        st.pinned, st.auto_pinned = target, False
        # asked again: the move is tried now, not after an earlier failure's back-off
        st.move_error, st.move_target, st.move_failures, st.next_move_at = None, None, 0, 0.0

    if daemon:
        source.change_status(pin)
        return
    say = lambda lock: _say_waiting(lock, source.settings.timeout)  # noqa: E731
    with source.hold(waiting=say, rollback=True):  # a collection in flight is stopped
        source.change_status(pin)


def _fetch_for_resume(source: gitsource.GitSource, daemon: int) -> None:
    """The branch's newest commit, fetched before the pin is lifted: the daemon's pass
    applies the commit fetched last, up to its interval old (the bad one an autoRollback
    left, though a fix was pushed since), and its fetches are its own. As a `--once` beside
    the daemon fetches: a failure is said, and none of the daemon's state is touched."""
    source.beside_daemon = daemon
    say = lambda lock: _say_waiting(lock, source.settings.timeout)  # noqa: E731
    with source.hold(waiting=say) as lock:
        error = source.fetch_now(lock)
    if error is not None:
        last = (source.status().fetched or "-")[:12]
        print(
            f"reconcile: warning: the daemon resumes at the commit fetched last ({last}):"
            f" the fetch before resuming failed: {error}",
            file=sys.stderr,
        )


def _say_waiting(lock: FileLock, limit: float) -> None:
    """A rollback during an outage must not look hung: say what it waits for, and how long."""
    pid = lock.holder()
    who = f"pid {pid}" if pid else "another process"
    print(
        f"reconcile: waiting for the git checkout: {who} is using it (a fetch: at most"
        f" {limit:g}s); Ctrl-C changes nothing",
        file=sys.stderr,
        flush=True,
    )


def _journal(cfg: Config, owner: str, target: str | None, why: str) -> None:
    """Each of the source's deployments is told; a rollback (``target``) is notified too,
    naming the commit the node now runs, as every notification does."""
    action = "resume" if target is None else "rollback"
    journal = Journal(cfg.state_dir)
    names = []
    for rec in RecordStore(cfg.state_dir).peek().records.values():
        if rec.owner == owner:
            journal.append(rec.name, action, why, "pinned" if action == "rollback" else "resumed")
            names.append(base_name(rec.name))
    notify = notifications_for(cfg)
    if notify is not None and action == "rollback":  # queued: the daemon's sender posts it
        notify.emit("RolledBack", why, revision=target, deployments=names)


def _apply(cfg: Config, target: str | None, daemon: int | None) -> int:
    """The daemon's pass when one runs (woken now), else a pass of our own."""
    from controller.cli.operate.restartverb import wake

    if daemon:
        wake(cfg.state_dir, daemon)
        deadline = time.monotonic() + APPLY_WAIT
        for _ in looks(deadline, reader=False):  # a file the daemon writes
            st = gitsource.read_status(cfg.state_dir)
            if st is not None and st.applied == (target or st.fetched):
                return _daemon_outcome(cfg, deadline)
            if st is not None and target is not None and st.move_target == target:
                print(f"reconcile: not applied: {st.move_error}", file=sys.stderr)
                return EXIT_FAIL  # the daemon's move failed: said now, not after the wait
        print(f"reconcile: the daemon (pid {daemon}) has not applied it yet", file=sys.stderr)
        return EXIT_FAIL
    reconciler = build(cfg)
    if reconciler.git is not None and target is not None:
        reconciler.git.moves_only = True  # the commit is in the checkout: no fetch waited on
    result = reconciler.run_pass()
    st = gitsource.read_status(cfg.state_dir)
    if target is not None and (st is None or st.applied != target):  # its move failed
        print(f"reconcile: not applied: {st.move_error if st else 'no source'}", file=sys.stderr)
        return EXIT_FAIL
    if not result.ok:  # an exit 1 says why, as --once's does (a typo at the commit resumed)
        from controller.cli.operate.runverb import report

        report(result, quiet=True)
        return EXIT_FAIL
    return EXIT_OK


def _daemon_outcome(cfg: Config, deadline: float) -> int:
    """The daemon's pass that applied the commit notes whether its manifests load
    (``note_invalid``) before it lets go of the pass lock: waited for, then an exit 1 says
    why, as our own pass's does (a typo at the commit resumed)."""
    lock = FileLock(StateDir(cfg.state_dir).pass_lock, what="pass lock")
    try:
        lock.acquire(max(deadline - time.monotonic(), 1.0))
    except LockTimeout:  # applied and pinned (exit 0), as before; its outcome is not known
        print(
            "reconcile: warning: applied, but the daemon's pass at it has not ended:"
            " reconcile source says whether its manifests load",
            file=sys.stderr,
        )
        return EXIT_OK
    lock.release()
    st = gitsource.read_status(cfg.state_dir)
    if st is None or not st.invalid or st.invalid_at != st.applied:
        return EXIT_OK
    for error in st.invalid:
        print(f"error: {error}", file=sys.stderr)
    return EXIT_FAIL


def _no_source(cfg: Config) -> int:
    print(  # the next move, as `reconcile source` says it
        f"reconcile: state dir {cfg.state_dir} follows no git source"
        " (start the daemon with --git URL, or set git.url in node.yaml)",
        file=sys.stderr,
    )
    return EXIT_FAIL
