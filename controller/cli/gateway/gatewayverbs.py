"""``reconcile gateway status|start|stop|restart|reload``: the gateway process of a state dir.

The gateway outlives the daemon (README "The gateway"), so it has verbs of its own:
``stop`` drains and ends it (a daemon watching it then leaves it stopped: a clean
exit is no crash), ``restart`` starts a fresh one with node.yaml read again that takes
the port over with no failed request (what an upgrade does), or starts again one that
was killed with no daemon watching; ``start`` is restart where none serves; ``reload``
applies node.yaml's gateway settings (a SIGHUP of the same process where they are
unchanged); ``status`` says which one serves, and what a reload refused
(gatewaystatus.py: also said by `reconcile status`).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from controller import __version__
from controller.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, output_format
from controller.cli.gateway import startlock
from controller.cli.gateway.gatewaystatus import (
    last_crashed,
    none_runs,
    say_unreadable,
    status,
)
from controller.errors import ConfigError
from controller.gateway.lifecycle import registry, reloads
from controller.gateway.settings import (
    DRAIN_GRACE,
    Settings,
    said,
    settings_from_json,
    settings_to_json,
)
from controller.redact import redact_url
from controller.store.side import refused


def state_dir_of(args: argparse.Namespace, *, warn: bool = True) -> Path:
    from controller.cli.common import config

    return config(args, lenient=True, warn=warn).state_dir.absolute()


def stop_gateways(state_dir: Path) -> list[registry.GatewayInfo]:
    """SIGTERM every gateway of the state dir and wait for each to finish its requests;
    one that was killed is forgotten (`gateway restart` starts one from its settings)."""
    _ask_stop(state_dir)
    crashed = last_crashed(state_dir)
    if crashed is not None:
        registry.forget(state_dir, crashed.nonce)
    found = registry.live(state_dir)
    grace = max((float(i.settings.get("drain_grace", DRAIN_GRACE)) for i in found), default=0)
    return registry.stop_all(state_dir, grace)


def _ask_stop(state_dir: Path) -> None:
    """The stop wins over a daemon's restart: asked first (no start after it), then one
    under way waited for (``registry.start_lock``), so it is stopped with the rest. Where
    no gateway ever ran (no folder) nothing can be starting: nothing is written."""
    if not registry.folder(state_dir).is_dir():
        return
    last = registry.read_current(state_dir) or registry.read_stopped(state_dir)
    registry.ask_stopped(state_dir, last)
    with startlock.taken(state_dir, stopped_means=_STOP_GOES_ON):
        pass  # a barrier only: a start after it sees the ask


# What a verb does when the start lock's holder is stopped or hangs, and the truth of it.
_STOP_GOES_ON = (
    "what serves is stopped now; a gateway that start brings up once it goes on stops "
    "itself, the stop asked first: `reconcile gateway status` says whether one serves"
)
_START_GOES_ON = (
    "going on without it; a gateway that start brings up once it goes on takes the port "
    "over from this one"
)


def cmd_gateway(args: argparse.Namespace) -> int:
    # restart, start and reload read node.yaml themselves and say what is wrong with it
    # once, as an error
    state_dir = state_dir_of(args, warn=args.action not in _STARTS)
    if args.action == "stop":
        stopped = stop_gateways(state_dir)
        for info in stopped:
            print(f"stopped gateway pid {info.ref.pid} ({info.address})")
        if not stopped:
            print(f"no gateway runs for state dir {state_dir}")
        return EXIT_OK
    if args.action in _STARTS:
        # One start at a time: two restarts at once both said they took the port over.
        with startlock.taken(state_dir, stopped_means=_START_GOES_ON):
            return _STARTS[args.action](state_dir)
    fmt = output_format(args, "table", ("table", "json"))
    if fmt is None:
        return EXIT_USAGE
    return status(state_dir, fmt)


def _start(state_dir: Path) -> int:
    """`systemctl start`: one that serves is left as it is (exit 0, said); else as restart."""
    current = registry.current_live(state_dir)
    if current is None:
        return _restart(state_dir, verb="start")
    print(
        f"gateway pid {current.ref.pid} serves {current.address} already: nothing started "
        "(`reconcile gateway reload` applies node.yaml's gateway settings, "
        "`reconcile gateway restart` starts a fresh one)"
    )
    return EXIT_OK


def _reload(state_dir: Path) -> int:
    """`systemctl reload`: node.yaml's gateway settings read again, in the serving
    gateway, as a SIGHUP of the daemon does: unchanged, it re-reads its key file and TLS
    pair (SIGHUP); changed, a new one takes the port over (no connection dropped). What
    the checks refuse leaves it as it is."""
    from controller.cli.gateway.gatewayflags import reread
    from controller.gateway.lifecycle.keeper import preflight

    current = registry.current_live(state_dir)
    say_unreadable(state_dir, current)
    if current is None:
        print(f"reconcile: nothing to reload: {none_runs(state_dir)}", file=sys.stderr)
        return EXIT_FAIL
    try:
        served = _settings_of(current)
        settings = reread(served)
        preflight(settings)  # a bad file said here; the gateway's own re-read keeps the old
    except ConfigError as exc:
        _not_done("reloaded", exc, current, "reload")
        return EXIT_FAIL
    changed = [n for n in settings_to_json(settings) if getattr(served, n) != getattr(settings, n)]
    if changed:
        why = f"node.yaml changed its {', '.join(said(n) for n in changed)}"
        code = _take_over(state_dir, settings, current, why, verb="reload")
        if code == EXIT_OK:
            _say_traces(current, registry.read_current(state_dir))
        return code
    before = reloads.read(state_dir, current.nonce)  # None: it keeps no count (older)
    if not registry.signal_gateway(current, signal.SIGHUP):
        print(f"reconcile: gateway pid {current.ref.pid} ended meanwhile", file=sys.stderr)
        return EXIT_FAIL
    refused.clear(state_dir, refused.GATEWAY_SETTINGS)  # node.yaml's serve as read
    if before is not None:
        return _answered(state_dir, current, before)
    print(
        f"gateway pid {current.ref.pid} re-reads its key file and TLS pair (SIGHUP); "
        f"node.yaml's gateway settings are those it serves; its log: {registry.log_path(state_dir)}"
    )
    return EXIT_OK


def _answered(state_dir: Path, current: registry.GatewayInfo, before: reloads.Count) -> int:
    """The exit by the gateway's own answer to the SIGHUP: what it refused of its key file
    and TLS pair (changed since this verb checked them) is said, and fails the reload."""
    pid, log_path = current.ref.pid, registry.log_path(state_dir)
    if not reloads.wait_answer(state_dir, current.nonce, before, current.alive):
        gone = "ended before it answered" if not current.alive() else "did not answer"
        print(
            f"reconcile: gateway pid {pid} {gone} the SIGHUP within {reloads.ANSWER_WAIT:.0f} s;"
            f" `reconcile gateway status` says what serves and any refusal; its log: {log_path}",
            file=sys.stderr,
        )
        return EXIT_FAIL
    mine = (refused.API_KEYS, refused.TLS_PAIR)
    found = [r for r in refused.peek(state_dir) if r.gateway == current.nonce and r.subject in mine]
    for r in found:
        print(
            f"reconcile: gateway pid {pid} refused the reload ({r.subject}): {r.why}; "
            f"{refused.KEPT[r.subject]}: fix that and run `reconcile gateway reload` again",
            file=sys.stderr,
        )
    if found:
        return EXIT_FAIL
    print(
        f"gateway pid {pid} re-read its key file and TLS pair (SIGHUP) and serves with them; "
        f"node.yaml's gateway settings are those it serves; its log: {log_path}"
    )
    return EXIT_OK


def _restart(state_dir: Path, verb: str = "restart") -> int:
    """A fresh gateway with the settings the daemon's start would give it now: its flags
    as the serving one holds them, node.yaml read again (as `systemctl restart` reads the
    unit file). A node.yaml, key file or TLS pair the checks refuse leaves the serving
    one as it is. One killed or crashed with no daemon to start it again is started
    again (as `systemctl restart` starts a failed unit)."""
    from controller.cli.gateway.gatewayflags import reread

    current = registry.current_live(state_dir)
    say_unreadable(state_dir, current)
    crashed = last_crashed(state_dir) if current is None else None
    stopped = registry.read_stopped(state_dir) if current is None else None
    previous = current or crashed or stopped
    if previous is None:
        print(f"reconcile: {none_runs(state_dir)}", file=sys.stderr)
        return EXIT_FAIL
    try:
        settings = reread(_settings_of(previous))
    except ConfigError as exc:
        _not_done(f"{verb}ed", exc, current, verb)
        return EXIT_FAIL
    how = None
    if crashed is not None:
        how = f"started again: pid {previous.ref.pid} had ended without stopping"
    elif current is None:  # a daemon leaving it stopped follows this one (Keeper._maybe_start)
        how = f"started again: pid {previous.ref.pid} was stopped by `reconcile gateway stop`"
    code = _take_over(state_dir, settings, current, how, verb=verb)
    if code == EXIT_OK:
        _say_traces(previous, registry.read_current(state_dir))
    if code == EXIT_OK and crashed is not None:
        registry.forget(state_dir, crashed.nonce)
    return code


def _say_traces(before: registry.GatewayInfo, after: registry.GatewayInfo | None) -> None:
    """A gateway started here has this shell's environment, not the daemon's: traces the
    one before it sent and it does not (or sends elsewhere) are said, not left to be found
    missing in the collector (a trial's restart from a plain shell ended them silently)."""
    if after is None or not before.traces:
        return
    # Redacted here too: an entry an older gateway wrote holds the endpoint as given (the
    # same endpoint in a newer one's entry, redacted, is no change).
    was, now = redact_url(before.traces), redact_url(after.traces)
    if now == was:
        return
    went = f"sends them to {now}" if now else "sends none"
    print(
        f"warning: gateway pid {before.ref.pid} sent traces to {was}; pid "
        f"{after.ref.pid}, started with this shell's environment, {went}: set "
        "OTEL_EXPORTER_OTLP_ENDPOINT here as the daemon has it and run "
        "`reconcile gateway restart` again",
        file=sys.stderr,
    )


def _take_over(
    state_dir: Path,
    settings: Settings,
    current: registry.GatewayInfo | None,
    how: str | None,
    *,
    verb: str,
) -> int:
    """A gateway process with ``settings``, taking the port over from ``current`` (or
    binding it where none serves: ``how`` says why)."""
    from controller.gateway.lifecycle.keeper import preflight, start_process

    log_path = registry.log_path(state_dir)
    try:
        preflight(settings)  # said here, not by a gateway process that will not start
        proc, info = start_process(settings, log_path)
    except ConfigError as exc:
        _not_done(f"{verb}ed", exc, current, verb)
        return EXIT_FAIL
    refused.clear(state_dir, refused.GATEWAY_SETTINGS)  # node.yaml's serve now
    registry.clear_stopped(state_dir)  # a start asked for: an earlier stop is over
    if current is not None:
        took = f"took it over from pid {current.ref.pid}, which finishes its requests and exits"
        how = f"{took}: {how}" if how else took
    print(f"gateway pid {proc.pid} serves {info.address} ({how}); its log: {log_path}")
    return EXIT_OK


def _not_done(done: str, exc: ConfigError, current: registry.GatewayInfo | None, verb: str) -> None:
    left = f"pid {current.ref.pid} serves on as it was" if current else "nothing serves"
    print(
        f"reconcile: gateway not {done}: {exc}; {left}: fix that and run "
        f"`reconcile gateway {verb}` again",
        file=sys.stderr,
    )


_STARTS = {"restart": _restart, "start": _start, "reload": _reload}


def _settings_of(info: registry.GatewayInfo) -> Settings:
    """The settings ``info`` was started with, as this version reads them."""
    try:
        return settings_from_json(info.settings)
    except (KeyError, TypeError, ValueError) as exc:  # another version's (a downgrade)
        raise ConfigError(
            f"the settings of gateway pid {info.ref.pid} (reconcile {info.version}) are not "
            f"this reconcile's ({__version__}) to read ({type(exc).__name__}: {exc}): "
            "restart the daemon with --listen, which starts one of its own"
        ) from None
