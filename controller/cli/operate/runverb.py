"""One function per verb: wire the configuration to the reconciler and print."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from controller.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, config
from controller.cli.common import reconciler as build
from controller.redact import SECRET, printable

# What `validate` adds to `no manifest in DIR (…)`, where a pass says "nothing pruned".
NOTHING_TO_VALIDATE = "nothing to validate (--allow-empty if that is meant)"
WAIT_LIMIT = 600.0  # seconds: `--once --wait` with no --timeout (README: default 10m)

if TYPE_CHECKING:
    from controller.daemon.loop import FrontDoor
    from controller.store.config.node import Config
    from controller.store.sources.manifests import LoadResult, ManifestError


def _print_errors(result_errors: list[object]) -> None:
    for error in result_errors:
        print(f"error: {error}", file=sys.stderr)


# -- the control loop and --once ---------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    cfg = config(args)
    if said := token_on_command_line(getattr(args, "git", None), os.environ):
        print(f"warning: {said}", file=sys.stderr)  # once, at the start: a reload says none
    if args.wait and not args.once:
        print("reconcile: --wait needs --once", file=sys.stderr)
        return EXIT_USAGE
    if args.timeout is not None and not args.wait:  # else a limit given in vain, silently
        print("reconcile: --timeout is --wait's limit: add --once --wait", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        from controller.cli.look.opverbs import cmd_plan

        return cmd_plan(args)
    if args.metrics_port and args.once:
        print("reconcile: --metrics-port is for the daemon; use --metrics-file", file=sys.stderr)
        return EXIT_USAGE
    listen = args.listen or os.environ.get("RECONCILE_LISTEN")
    if listen and args.once:
        print("reconcile: --listen is for the daemon (drop --once)", file=sys.stderr)
        return EXIT_USAGE
    gateway_only = getattr(args, "gateway_only", ())  # main.py's gateway group
    alone = [f"--{n.replace('_', '-')}" for n in gateway_only if _given(getattr(args, n, None))]
    if alone and not listen:  # else a certificate or key file given in vain, without a word
        said = ", ".join(alone)
        print(
            f"reconcile: {said}: the gateway's, which runs with --listen [HOST:]PORT",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if not args.once:
        from controller.daemon.loop import run_daemon

        raise_fd_limit()
        front: FrontDoor | None = None
        if listen:  # aiohttp is imported only here: --once start-up does not pay for it
            from controller.cli.gateway.gatewayflags import front_door

            made = front_door(args, cfg, listen)
            if isinstance(made, int):
                return made
            front = made
        metrics_at = args.metrics_port  # (host, port), bound after the lock
        if front is None and (cfg.metrics_file is not None or cfg.metrics_port is not None):
            _with_gateway_series(cfg.state_dir)  # one an earlier daemon left serving
        return run_daemon(
            cfg,
            resync=args.resync,
            reload=lambda: config(args),
            front=front,
            metrics_at=metrics_at,
        )
    code = _once(args, cfg)
    if cfg.notify:  # no daemon to post what the pass queued: one try each, now
        from controller.daemon.webhooks import Sender

        Sender(cfg.state_dir, cfg.notify).flush()
    return code


# What a token's user part looks like (`https://TOKEN@host/repo`): GitHub's and GitLab's
# prefixes, or anything as long as a token (no person's user name is 20 characters).
TOKEN_PREFIXES = ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-")
TOKEN_LENGTH = 20


def token_on_command_line(url: str | None, environ: Mapping[str, str]) -> str | None:
    """The warning when ``--git``'s URL carries a secret (a password, or a token as its
    user): every local user reads this process's command line. None when it carries none
    (a user name whose password RECONCILE_GIT_PASSWORD gives is none). Never the secret."""
    try:
        parts = urlsplit(url) if url else None
    except ValueError:
        return None
    if parts is None or parts.scheme.lower() not in ("http", "https") or not parts.username:
        return None
    from controller.store.sources.git.run import PASSWORD_VARIABLE  # with a git source only

    user = parts.username
    token = len(user) >= TOKEN_LENGTH or user.startswith(TOKEN_PREFIXES)
    if parts.password is None and (environ.get(PASSWORD_VARIABLE) or not token):
        return None
    return (
        "--git's URL carries a credential, which every local user can read on this "
        "process's command line (`ps`) for as long as it runs; git itself never sees it "
        "there. Give it instead in node.yaml's `git: {url: ...}` (a file of mode 0600, "
        "and no --git), or name the user alone (`--git https://USER@HOST/REPO`) with "
        f"the token in {PASSWORD_VARIABLE} in reconcile's environment (a systemd "
        "EnvironmentFile of mode 0600), or in git's own credential helper"
    )


def _sops_files_missing(loaded: LoadResult) -> list[ManifestError]:
    """Each sopsFile not in the repository beside its manifest (a typo in its path, a file
    not committed), found without decrypting: a CI job's `validate` has no age key, and
    passed a commit that every node then refused, told "`reconcile validate` lists every
    error"."""
    from controller.host import secrets
    from controller.store.sources.manifests import ManifestError

    found = []
    for entry in [*loaded.entries.values(), *chain.from_iterable(loaded.apart.values())]:
        try:
            secrets.in_repository(entry.deployment.spec, Path(entry.source).parent)
        except secrets.SecretError as exc:
            loc = ("spec", "envFrom", exc.index)
            found.append(loaded.error(ManifestError(
                entry.source, loaded.line_of(entry, loc), f"spec.envFrom[{exc.index}]",
                str(exc), entry.name,
            )))  # fmt: skip
    return found


def _given(value: object) -> bool:
    """A flag on the command line: a store_true set, a value given (0 too)."""
    return value is not None and value is not False


def _once(args: argparse.Namespace, cfg: Config) -> int:
    clash = _beside_the_daemon(cfg) or _labels_unloaded(cfg) or _daemon_reads_older(cfg)
    if clash:
        print(f"reconcile: {clash}", file=sys.stderr)
        return EXIT_FAIL
    if cfg.metrics_file is not None:
        _with_gateway_series(cfg.state_dir)
    reconciler = build(cfg)
    if reconciler.git is not None:  # the source's fetch state is a live daemon's
        reconciler.git.beside_daemon = _daemon_following(cfg)
    if args.wait:
        from controller.cli.render.waiting import wait_until_ready

        limit = WAIT_LIMIT if args.timeout is None else args.timeout
        return EXIT_OK if wait_until_ready(reconciler, limit) else EXIT_FAIL
    result = reconciler.run_pass()
    report(result, quiet=args.quiet)
    for why in result.failing():
        print(f"error: {why}", file=sys.stderr)
    return EXIT_OK if result.converged else EXIT_FAIL


def _with_gateway_series(state_dir: Path) -> None:
    """The metrics of a `--once`, or of a daemon without ``--listen``, carry the gateway's
    series, as those of a daemon that runs it do: a gateway outlives the daemon that
    started it and serves on beside cron's passes or a daemon started without
    ``--listen``, writing its figures in the state dir (``gateway/metrics.prom``, every
    half second). Those of a gateway no longer alive are left out (stale counters of a
    crashed one), looked at each time the metrics are rendered; one alive is asked, as
    the daemon that runs it asks, so a stopped or hung one says so (``gateway_series``)."""
    from controller.daemon.metrics import add_source, gateway_series
    from controller.gateway.lifecycle import handover, registry

    def series() -> str:
        live = registry.current_live(state_dir)
        return gateway_series(*handover.scrape(state_dir, live)) if live else ""

    add_source(series)


def _beside_the_daemon(cfg: Config) -> str | None:
    """Why a `--once` must not run: it names another git source than the one the daemon
    on its state dir follows. Each would take the source's state as a new source's (a
    rollback's pin dropped, its fetches forgotten) at every pass, so a mistyped
    --git-path once undid a `reconcile rollback` for good."""
    if cfg.git is None:
        return None
    from controller.cli.operate.restartverb import daemon_pid
    from controller.store.sources.git.source import SourceStatus, followed_instead

    other = followed_instead(cfg.state_dir, cfg.git)
    pid = daemon_pid(cfg.state_dir) if other is not None else None
    if other is None or pid is None:
        return None
    ours = SourceStatus.fresh(cfg.git).said()
    return (
        f"the daemon (pid {pid or '?'}) on state dir {cfg.state_dir} follows {other.said()};"
        f" this run names {ours}: run it with the daemon's --git, --branch/--tag and"
        " --git-path (or none of them), or stop the daemon to follow another source"
    )


def _labels_unloaded(cfg: Config) -> str | None:
    """Why a `--once` must not run: node.yaml's labels were edited and the daemon running
    this set has not reloaded them. The run stopped what the new labels leave to other
    nodes and the daemon's next pass started it again, at every cron run."""
    from controller.store.side import daemonset

    pid = _daemon_following(cfg)
    ran = daemonset.labels_of(cfg.state_dir, pid) if pid else None
    if ran is None or cfg.labels is None or ran == cfg.labels:
        return None
    return (
        f"node.yaml's labels ({_said(cfg.labels)}) are not those the daemon (pid {pid}) on"
        f" state dir {cfg.state_dir} runs with ({_said(ran)}): reload it (`systemctl reload"
        f" reconcile`, or kill -HUP {pid}) to apply them; this run changes nothing until"
        " then (each would undo the other's share of the fleet)"
    )


def _daemon_reads_older(cfg: Config) -> str | None:
    """Why a `--once` must not run: the package was upgraded and the daemon not restarted
    yet, so it reads no record of this version, and this run's set has records of an older
    one. The run wrote back as this version each one it changed; the daemon, unable to
    read them, stopped managing their engines (and its gateway stopped routing to them)
    until restarted."""
    from controller.core.state import VERSION
    from controller.store.instances.records import RecordStore
    from controller.store.side import daemonset

    pid = daemonset.daemon_pid(cfg.state_dir)
    reads = daemonset.records_read_by(cfg.state_dir, pid) if pid else VERSION
    if reads is not None and reads >= VERSION:
        return None
    older = RecordStore(cfg.state_dir).older(cfg.owner)
    if not older:
        return None
    return (
        f"the daemon (pid {pid}) on state dir {cfg.state_dir} is of an older reconcile,"
        f" which cannot read the records this one writes (version {VERSION}): this run"
        f" would write {', '.join(older)} back as version {VERSION} as it changed them,"
        " and that daemon would stop managing their engines. Restart the daemon onto this"
        " version first (`systemctl restart reconcile`), then run this again"
    )


def _said(labels: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "none"


def _daemon_following(cfg: Config) -> int | None:
    """The pid of the daemon on the state dir when it runs this run's set (its git source),
    else None: a `--once` beside it keeps its own fetch's outcome out of the source's state."""
    from controller.store.side import daemonset

    pid = daemonset.daemon_pid(cfg.state_dir)
    if not pid or daemonset.owner_of(cfg.state_dir, pid) != cfg.owner:
        return None
    return pid


def raise_fd_limit() -> None:
    """The daemon's soft RLIMIT_NOFILE up to its hard limit: the gateway holds an fd per
    client and per engine connection, on top of what passes use (the soft 1024 or less a
    service gets by default ran out under load: passes failed with EMFILE)."""
    import contextlib
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # "unlimited" is above what the kernel allows (fs.nr_open): ask for its default.
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft < target:
        with contextlib.suppress(ValueError, OSError):  # not allowed: the limit stays
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def report(result: object, *, quiet: bool = False) -> None:
    """What a pass leaves to say on stderr. Quiet (cron mails whatever is printed): only
    what ``--once`` exits 1 on, not a deployment Idle or waiting its turn as it should."""
    from controller.reconciler.run import PassResult

    assert isinstance(result, PassResult)
    _print_errors(list(result.errors))
    for problem in result.problems:
        print(f"error: {problem.message}", file=sys.stderr)
    # A missing or empty folder is an error of `failing`, which says nothing was pruned.
    for note in result.fleet_notes():  # this node's share of a fleet: the rest is other nodes'
        print(note)
    if not quiet:  # it fails nothing of ours: its journal keeps it for `events`
        for name, words in sorted(result.unproven.items()):
            print(f"warning: {name}: {printable(words)}", file=sys.stderr)
    for rec in result.stuck() if quiet else result.ours():
        if rec.message:
            print(f"{rec.name}: {rec.phase}: {printable(rec.message)}", file=sys.stderr)


def cmd_validate(args: argparse.Namespace) -> int:
    from controller.store.sources.manifests import load, missing_text

    cfg = config(args)
    loaded = load(  # the fleet's: one name may be declared once per node class
        cfg.manifests,
        insecure=cfg.insecure_manifests,
        backend=cfg.backend,
        repo=cfg.repo,
        fleet=True,
    )
    loaded.errors.extend(_sops_files_missing(loaded))
    _print_errors(list(loaded.errors))
    for folder in loaded.missing_folders:  # a mistyped CI or cron path must not go green
        if folder not in loaded.unusable:  # an unusable one's error said what it is
            print(f"error: {missing_text(folder)}", file=sys.stderr)
    if loaded.errors or loaded.missing_folders:
        return EXIT_FAIL
    if loaded.no_manifest and not args.allow_empty:  # kubectl: "no objects passed to apply"
        # A CI job checking a mistyped or emptied folder checked nothing: it must not pass.
        print(f"error: {loaded.no_manifest}: {NOTHING_TO_VALIDATE}", file=sys.stderr)
        return EXIT_FAIL
    count = len(loaded.entries) + sum(map(len, loaded.apart.values()))
    for warning in _validate_warnings(loaded):
        print(f"warning: {warning}", file=sys.stderr)
    print(f"{count} deployment(s) in {len(loaded.files)} file(s): valid")
    return EXIT_OK


# Not secrets though their names say TOKEN or KEY: a setting's word, a path to a file.
_NOT_A_SECRET = re.compile(r"^(true|false|yes|no|on|off|[0-9.]*|[/$~.].*)$", re.IGNORECASE)
# `${HF_TOKEN}`, `$HOME/x`: compose's and llama-swap's habit; no shell runs an engine.
_VARIABLE = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")
UNEXPANDED = (
    "{} is not expanded (no shell runs the engine): it gets the text as written; a "
    "value of the node's: a file spec.envFrom reads; else write the value out"
)
IN_THE_CLEAR = (
    "a secret's value written in the manifest, in the clear wherever it is kept: move it "
    "to a file spec.envFrom reads ({file: /etc/reconcile/NAME.env}, 0600, or {sopsFile: ...})"
)


def _validate_warnings(loaded: LoadResult) -> list[str]:
    """What is valid but surely not meant: a secret's value in the manifest (DESIGN's "a
    repository of manifests holds no secret in the clear"), said where a CI job runs
    validate, and a `$VAR` the engine gets as text. Never a secret's value."""
    said = []
    for entry in [*loaded.entries.values(), *chain.from_iterable(loaded.apart.values())]:
        spec = entry.deployment.spec
        items: list[tuple[tuple[str | int, ...], str, str]]
        items = [(("spec", "env", k), f"spec.env.{k}", v) for k, v in spec.env.items()]
        items += [(("spec", "args", i), f"spec.args[{i}]", a) for i, a in enumerate(spec.args)]
        for loc, path, value in items:
            why = _unexpanded(value) or _in_the_clear(loc, value)
            if why:
                where = f"{loaded.named(entry.source)}:{loaded.line_of(entry, loc)}"
                said.append(f"{where}: {path}: {why}")
    return said


def _unexpanded(value: str) -> str:
    found = _VARIABLE.search(value)
    return UNEXPANDED.format(found.group()) if found else ""


def _in_the_clear(loc: tuple[str | int, ...], value: str) -> str:
    name = str(loc[-1])
    secret = loc[1] == "env" and SECRET.search(name.upper().replace("TOKENIZER", ""))
    return IN_THE_CLEAR if secret and not _NOT_A_SECRET.match(value) else ""
