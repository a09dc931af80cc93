"""The `reconcile` command: parse arguments, configure logs, call the reconciler.

Exit codes live in ``exitcodes``; the verb -> handler table in ``verbs``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from controller.cli.exitcodes import EXIT_FAIL, EXIT_USAGE


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _common(suppress: bool) -> Parser:
    """Options accepted before or after the verb (the verb's copy must not reset them)."""
    d = argparse.SUPPRESS if suppress else None
    p = Parser(add_help=False)
    p.add_argument(
        "-f",
        "--manifests",
        action="append",
        metavar="DIR",
        default=d,
        help="manifests folder (repeatable; default ./manifests or $RECONCILE_MANIFESTS)",
    )
    p.add_argument("--state-dir", metavar="DIR", default=d, help="state dir ($RECONCILE_STATE_DIR)")
    p.add_argument(
        "--devices",
        metavar="LIST",
        default=d,
        help="static inventory, e.g. nvidia:0,nvidia:1 ($RECONCILE_DEVICES)",
    )
    p.add_argument("--node", metavar="NAME", default=d, help="node name ($RECONCILE_NODE)")
    p.add_argument("--owner", metavar="NAME", default=d, help="owner of the records this set makes")
    p.add_argument(
        "--max-instances",
        metavar="LIMITS",
        default=d,
        help="node capacity, e.g. 8 or 8,nvidia=2 ($RECONCILE_MAX_INSTANCES)",
    )
    p.add_argument(
        "--node-config",
        metavar="FILE",
        default=d,
        help="node config file ($RECONCILE_NODE_CONFIG; default <state-dir>/node.yaml)",
    )
    p.add_argument(
        "--backend",
        choices=("local", "ray"),
        default=d,
        help="where engines run: local (this node) or ray ($RECONCILE_BACKEND; default local)",
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        default=d,
        help="Ray cluster (head) address, needed with --backend ray"
        " ($RECONCILE_RAY_ADDRESS, then $RAY_ADDRESS)",
    )
    p.add_argument("-o", "--output", metavar="FORMAT", default=d, help="output format")
    p.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS if suppress else 0)
    p.add_argument(
        "-q", "--quiet", action="store_true", default=argparse.SUPPRESS if suppress else False
    )
    p.add_argument(
        "--insecure-manifests",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="as root, also load manifests others can write (off: refused, like cron)",
    )
    return p


def build_parser() -> Parser:
    parser = Parser(
        prog="reconcile",
        parents=[_common(False)],
        description="Keep local inference engines running as YAML specs say.",
    )
    parser.add_argument("--once", action="store_true", help="run one pass and exit")
    parser.add_argument("--wait", action="store_true", help="with --once: pass until all Ready")
    parser.add_argument("--timeout", default="10m", help="--wait limit (30s, 5m, 1h30m)")
    parser.add_argument(
        "--allow-empty",
        action="store_true",
        help="let a missing or empty manifests folder prune everything",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    parser.add_argument("--resync", default="5s", help="daemon: full pass interval")
    parser.add_argument("--lock-timeout", default="60s", help="wait this long for another pass")
    parser.add_argument(
        "--metrics-file", metavar="PATH", help="write Prometheus metrics here after each pass"
    )
    parser.add_argument(
        "--metrics-port",
        metavar="[HOST:]PORT",
        help="daemon: serve /metrics (default host 127.0.0.1)",
    )
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=Parser)
    common = _common(True)
    p = sub.add_parser("plan", parents=[common], help="show what a pass would do (exit 2: changes)")
    p.add_argument("--allow-empty", action="store_true")
    for verb in ("status", "get"):
        p = sub.add_parser(verb, parents=[common], help="deployments and their phases")
        p.add_argument("name", nargs="?")
    p = sub.add_parser("describe", parents=[common], help="spec, record, events, last log lines")
    p.add_argument("name")
    p = sub.add_parser("logs", parents=[common], help="the engine's log")
    p.add_argument("name")
    p.add_argument("-F", "--follow", dest="follow", action="store_true")
    p.add_argument("--tail", type=int, default=None, metavar="N", help="the last N lines")
    p.add_argument("-p", "--previous", action="store_true", help="the run before the last restart")
    sub.add_parser("validate", parents=[common], help="check manifests (exit 1 if any invalid)")
    sub.add_parser("schema", parents=[common], help="the JSON Schema of a manifest")
    sub.add_parser("devices", parents=[common], help="the inventory and who holds what")
    p = sub.add_parser("drain", parents=[common], help="start nothing new until uncordoned")
    p.add_argument(
        "--ttl", default="1h", help="the drain ends by itself after this (renew: drain again)"
    )
    p.add_argument("--reason", default="", help="why: shown in every denial and in status")
    p.add_argument("--evict", action="store_true", help="also stop running engines")
    sub.add_parser("uncordon", parents=[common], help="end a drain")
    p = sub.add_parser("down", parents=[common], help="tear down everything this set owns")
    p.add_argument("--allow-empty", action="store_true")
    return parser


def _fix_follow(argv: list[str]) -> list[str]:
    # `logs NAME -f` means follow (kubectl), while `-f DIR` elsewhere is a folder.
    if argv and "logs" in argv:
        i = argv.index("logs")
        argv = argv[:i] + [("-F" if a == "-f" else a) for a in argv[i:]]
    return argv


def _check_durations(parser: Parser, args: argparse.Namespace) -> None:
    """A malformed duration flag is a usage error (64), caught before anything runs."""
    from controller.core.durations import parse_duration

    for flag in ("timeout", "resync", "lock_timeout", "ttl"):
        value = getattr(args, flag, None)
        if value is not None:
            try:
                parse_duration(value)
            except ValueError as exc:
                parser.error(f"--{flag.replace('_', '-')}: {exc}")


def _check_backend(parser: Parser, args: argparse.Namespace) -> None:
    """A bad backend, or ray without an address, is a usage error (64) naming the flag."""
    from controller.errors import ConfigError
    from controller.store.node import resolve_backend

    try:
        resolve_backend(getattr(args, "backend", None), getattr(args, "ray_address", None))
    except ConfigError as exc:
        parser.error(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    args_list = _fix_follow(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args = parser.parse_args(args_list)
    _check_durations(parser, args)
    _check_backend(parser, args)
    from controller import logsetup as logs
    from controller.cli.verbs import dispatch
    from controller.errors import BackendUnavailable, ConfigError, LockTimeout, RecordError

    logs.configure(-1 if args.quiet else args.verbose)
    try:
        return dispatch(args)
    except (ConfigError, LockTimeout, RecordError, BackendUnavailable) as exc:
        print(f"reconcile: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except OSError as exc:  # ENOSPC, EIO, EACCES on the state dir: the pass stopped there
        where = f": {exc.filename}" if exc.filename else ""
        print(
            f"reconcile: I/O error{where}: {exc.strerror or exc}. Fix the disk or permissions"
            " and run again: the next pass resumes from the records on disk",
            file=sys.stderr,
        )
        return EXIT_FAIL
    except KeyboardInterrupt:
        return 130


def entry() -> None:
    sys.exit(main())
