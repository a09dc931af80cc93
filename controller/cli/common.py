"""Helpers every verb shares: the node configuration from flags, the output format."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from controller.store.config.node import Config, GitFlags, resolve

# The exit codes of every verb, in one place (sysexits' 64 for usage errors).
EXIT_OK = 0  # done; in sync; everything Ready
EXIT_FAIL = 1  # invalid input, not converged, or failed
EXIT_CHANGES = 2  # `plan`: changes pending
EXIT_USAGE = 64  # bad flags or arguments (EX_USAGE)

# Seconds between looks of every CLI loop that follows or waits on files the daemon and
# the gateway write (status -w, events -w, logs -f, requests -f, restart, rollback): a pass
# writes at most every 0.2 s and a person reads no faster; there is no event to wait on.
FOLLOW_PERIOD = 0.5
# Seconds between a CLI stop's looks at the gateways' answers to its drain: an idle engine
# stops this soon after (`drain --evict` is expected to be quick), with no watch thread.
DRAIN_POLL = 0.05


if TYPE_CHECKING:
    from pathlib import Path

    from controller.core.state import Record
    from controller.reconciler.launcher import GatewayDrain
    from controller.reconciler.run import Preview, Reconciler


def stopped_daemon(daemon: int) -> str:
    """The daemon on the state dir, ``daemon`` its pid, is stopped (SIGSTOP, a debugger;
    ``startlock.stopped``): it holds its lock and acts on nothing. Who, and the move."""
    return (
        f"the daemon (pid {daemon}) on this state dir is stopped (SIGSTOP, a debugger; "
        f"`kill -CONT {daemon}` resumes it)"
    )


def config(args: argparse.Namespace, *, lenient: bool = False, warn: bool = True) -> Config:
    """The node configuration: flags (parsed once, by the parser's types) > environment >
    node.yaml > defaults, resolved in ``store.node.resolve`` alone.

    ``lenient``: a read verb (or `down`, which needs no limit to stop engines): a broken
    node config is a warning naming its file and line, and the verb goes on. ``warn``:
    False for a verb that says the warnings itself, in its own words (`plan`)."""
    cfg = resolve(
        manifests=args.manifests,
        state_dir=args.state_dir,
        node=args.node,
        devices=args.devices,
        owner=args.owner,
        allow_empty=args.allow_empty,
        lock_timeout=args.lock_timeout,
        insecure_manifests=args.insecure_manifests,
        max_instances=args.max_instances,
        node_config=args.node_config,
        metrics_file=args.metrics_file,
        metrics_port=args.metrics_port[1] if args.metrics_port else None,
        backend=args.backend,
        ray_address=args.ray_address,
        git=GitFlags(
            url=getattr(args, "git", None),
            branch=getattr(args, "branch", None),
            tag=getattr(args, "tag", None),
            path=getattr(args, "git_path", None),
            interval=getattr(args, "interval", None),
            timeout=getattr(args, "git_timeout", None),
        ),
        lenient=lenient,
    )
    if warn:
        say_warnings(cfg)
    return cfg


def say_warnings(cfg: Config) -> None:
    for warning in cfg.warnings:
        print(f"warning: {warning}", file=sys.stderr)


def output_format(args: argparse.Namespace, default: str, allowed: tuple[str, ...]) -> str | None:
    fmt: str = args.output or default
    if fmt not in allowed:
        print(f"reconcile: unknown output format {fmt!r} ({', '.join(allowed)})", file=sys.stderr)
        return None
    return fmt


def no_such(name: str, known: Iterable[str], where: object, gone: Iterable[str] = ()) -> str:
    """The error for a deployment NAME the state dir lacks, with the name it is one slip
    from (``wbe`` for ``web``), else the names there are: the next move, not a dead end.
    ``gone``: removed deployments whose logs are kept (`logs` reads them), listed apart:
    under "known" they read as deployments the node still has."""
    from difflib import get_close_matches

    from controller.cli.mistyped import kind_meant
    from controller.core.manifest.excerpt import did_you_mean

    live = sorted(set(known))
    old = sorted(set(gone) - set(live))
    names = sorted({*live, *old})
    hint = did_you_mean(name, names) or next(iter(get_close_matches(name, names, 1, 0.6)), None)
    said = f"; did you mean {hint!r}?" if hint else ""
    kind, slash, bare = name.rpartition("/")
    if slash and kind and bare in names:  # kubectl's TYPE/NAME (`deployment/web`)
        hint, said = bare, f"; did you mean {bare!r}? (NAME alone: no kubectl TYPE/ before it)"
    if kind_meant(name):  # `get pods`: not "did you mean 'prod'?"
        hint, said = name, f"; {kind_meant(name)}"
    listed = [f"known: {', '.join(live)}"] if live else []
    listed += [f"logs kept of removed deployments: {', '.join(old)}"] if old else []
    shown = f" ({'; '.join(listed)})" if listed and not hint else ""
    return f"reconcile: no deployment named {name!r} in {where}{said}{shown}"


def say_if_absent(cfg: Config) -> None:
    """A look at a state dir that does not exist finds nothing: say so on stderr, or
    ``--state-dir /var/lib/reconcil`` (a slip) reads as a node running nothing."""
    if not cfg.state_dir.exists():
        print(
            f"reconcile: {cfg.state_dir} does not exist: nothing has run with this state dir"
            " (is --state-dir or RECONCILE_STATE_DIR the daemon's?)",
            file=sys.stderr,
        )


def looks(
    deadline: float | None = None, *, reader: bool = True, now: bool = True
) -> Iterator[None]:
    """A follow loop's turns: one now (or, ``now=False``, after the look the caller has
    just had), then one every FOLLOW_PERIOD until ``deadline`` (``time.monotonic()``) has
    passed or, for a loop that prints as it goes (``reader``), the reader of stdout is
    gone (``| head``)."""
    if now:
        yield
    while not (reader and reader_gone()):
        if deadline is not None and time.monotonic() >= deadline:
            return
        time.sleep(FOLLOW_PERIOD)
        yield


def reader_gone() -> bool:
    """stdout is a pipe whose reader closed (`status -w | head -1` after its line): the
    kernel flags the write end at once, so a watch ends without waiting for news to write
    (`events -w | head -2` waited for an event that might never come)."""
    import select

    poller = select.poll()
    poller.register(sys.stdout.fileno(), select.POLLERR)
    return any(event & select.POLLERR for _, event in poller.poll(0))


def selected(labels: Mapping[str, str], args: argparse.Namespace) -> bool:
    """``-l SELECTOR`` (repeatable): every requirement of each must hold, as kubectl's."""
    return all(r.holds(labels) for selector in args.selector for r in selector)


def reconciler(cfg: Config) -> Reconciler:
    """A reconciler on the configured backend, with the after-pass hooks the flags ask for."""
    from controller.backends.choose import inventory_for, open_backend
    from controller.reconciler.run import Reconciler
    from controller.store.instances.records import RecordStore

    inventory = inventory_for(cfg)
    hooks = []
    if cfg.metrics_file or cfg.metrics_port:  # imported only then: --once stays fast
        from controller.daemon.metrics import exporters

        hooks = exporters(cfg, inventory)
    store = RecordStore(cfg.state_dir)  # one for the state dir: the backend's is the pass's
    made = Reconciler(cfg, open_backend(cfg, store), inventory, hooks, store)
    # Its stops (drain --evict, down, the passes of restart) drain the engine from the
    # gateway first, as the daemon's do: it outlives the daemon, and serves meanwhile.
    made.executor.launcher.drain = gateway_drain(cfg.state_dir)
    return made


def gateway_drain(state_dir: Path) -> GatewayDrain:
    """The daemon keeper's drain, polled: the answers in flight through the gateways of
    ``state_dir`` end (or the engine's grace period runs out) before its stop. A fault
    is said and the stop goes on (an undrained stop still stops, as the daemon's)."""

    def drain(old: Record, new: Record | None) -> None:
        from controller.gateway.lifecycle import registry

        def poll(seconds: float) -> None:
            time.sleep(min(seconds, DRAIN_POLL))

        try:
            answered = registry.drain(state_dir, old, new, poll)
        except OSError as exc:
            why = f"the gateway's drain failed ({exc})"
            print(f"reconcile: {old.name}: {why}; stopping it undrained", file=sys.stderr)
            return
        if not answered:
            print(
                f"reconcile: {old.name}: requests in flight did not end within its grace "
                f"period ({old.grace_seconds:g}s, stopGracePeriodSeconds); stopping it",
                file=sys.stderr,
            )

    return drain


def preview(cfg: Config) -> Preview:
    """The read-only observer and planner (``reconcile plan``): no executor, no locks."""
    from controller.backends.choose import inventory_for, open_backend
    from controller.reconciler.run import Preview
    from controller.store.instances.records import RecordStore

    store = RecordStore(cfg.state_dir)
    return Preview(cfg, open_backend(cfg, store), inventory_for(cfg), store)
