"""The `reconcile` command: parse arguments, configure logs, call the reconciler.

Exit codes live in ``common``; the verb -> handler table in ``verbs``.
"""

from __future__ import annotations

import argparse
import errno
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from controller import __version__
from controller.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from controller.cli.helptext import epilog
from controller.cli.streams import outlive_reader
from controller.core.devices.capacity import parse_limits
from controller.core.manifest import backendnames
from controller.core.manifest.listen import split_listen
from controller.core.manifest.quantity import parse_duration
from controller.store.config.node import DEFAULT_LOCK_TIMEOUT

if TYPE_CHECKING:
    from controller.core.manifest.labelsyntax import Requirement


# Flag values parsed once, by argparse itself: a bad one is a one-line usage error (64).
#
# Every verb then reads typed values (seconds as floats, ``(host, port)``) from the
# namespace: nothing downstream parses a flag's text again.
def duration(text: str) -> float:
    """``30s``, ``5m``, ``1h30m`` or plain seconds, 0 or more."""
    negative = f"{text!r} is negative (examples: 30s, 5m, 1h)"
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        if text.strip().startswith("-") and _is_duration(text.strip()[1:]):  # -5m
            raise argparse.ArgumentTypeError(negative) from None
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds < 0:
        raise argparse.ArgumentTypeError(negative)
    return seconds


def _is_duration(text: str) -> bool:
    try:
        parse_duration(text)
    except ValueError:
        return False
    return True


def signed_values(argv: Sequence[str]) -> list[str]:
    """``--ttl -5m`` as ``--ttl=-5m``: argparse takes a token that starts with '-' and is
    not a plain number for a flag, so the value was "expected one argument" and its own
    check never said what is wrong with it. No flag of reconcile starts with a digit, nor
    does any word it takes (names, revisions), so such a token is always a value; after a
    switch (``--refresh -5``) argparse then says the switch takes none."""
    out: list[str] = []
    for token in argv:
        glue = out and out[-1].startswith("--") and len(out[-1]) > 2 and "=" not in out[-1]
        if glue and len(token) > 1 and token[0] == "-" and token[1].isdigit():
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def positive_duration(text: str) -> float:
    """A duration that must be more than zero (a drain of 0 s would end as it begins)."""
    seconds = duration(text)
    if seconds == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is zero: give a length (examples: 30s, 1h)")
    return seconds


def listen_address(example: str) -> Callable[[str], tuple[str, int]]:
    """``[HOST:]PORT`` -> (host, port), loopback when no host is given."""

    def parse(text: str) -> tuple[str, int]:
        found = split_listen(text)
        if found is None:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not PORT or HOST:PORT (example: {example})"
            )
        return found

    return parse


def count(text: str) -> int:
    """A whole number, 0 or more (``--tail -5`` read the whole log as if asked for none)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative: give 0 or more")
    return value


def max_instances(text: str) -> str:
    """``8``, ``nvidia=2`` or ``8,nvidia=2``, checked here; the text goes on to the config."""
    try:
        parse_limits(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def path_given(text: str) -> str:
    """A folder or file named: ``-f ""`` (``-f "$DIR"`` with DIR unset) read the current
    folder as the manifest set, and ``--state-dir ""`` fell back to the default one."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: name a path (an unset shell variable?)")
    return text


def state_folder(text: str) -> str:
    """A state dir is a folder, made where missing: one that is a file (or under one, a
    typo: `--state-dir manifests/demo.yaml`) went on into every verb, which said "I/O
    error: ...: Not a directory. Fix the disk or permissions", the wrong next move."""
    import os.path

    path = os.path.abspath(os.path.expanduser(text))
    there = path
    while not os.path.lexists(there) and os.path.dirname(there) != there:
        there = os.path.dirname(there)
    if os.path.isdir(there):
        return text
    where = "is a file" if there == path else f"lies under {there}, which is a file"
    raise argparse.ArgumentTypeError(
        f"{path} {where}, not a folder: name the state dir's folder (made if missing)"
    )


def node_name(text: str) -> str:
    """A node's name names a folder of records: no '/'."""
    if "/" in text:
        raise argparse.ArgumentTypeError(f"node name {text!r} may not contain '/'")
    return text


class Parser(argparse.ArgumentParser):
    # The command line main() parses: a "verb" that is a misspelt flag's value is said as
    # that flag (`--state-dri /tmp/x status` took /tmp/x for the verb).
    given: Sequence[str] = ()

    def error(self, message: str) -> NoReturn:
        """One line, and where to look: the whole usage block buried the mistake."""
        from controller.cli.mistyped import meant

        message = meant(message, _verbs(self), self.given, _flags(self, None))
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


VerbMaker = Callable[..., Parser]  # verb(name, help, parents=None) -> its parser

# `-o` means something for these verbs only (`--dry-run` is `plan`); elsewhere a usage error.
OUTPUT_VERBS = (
    "status",
    "get",
    "devices",
    "plan",
    "export",
    "events",
    "describe",
    "source",
    "history",
)


def _common(suppress: bool, folder_flag: tuple[str, ...] = ("-f", "--manifests")) -> Parser:
    """Options accepted before or after the verb (the verb's copy must not reset them).

    ``logs`` takes ``--manifests`` alone: its ``-f`` is ``--follow`` (kubectl).
    """
    d = argparse.SUPPRESS if suppress else None
    p = Parser(add_help=False)
    p.add_argument(
        *folder_flag,
        dest="manifests",
        action="append",
        type=path_given,
        metavar="DIR",
        default=d,
        help="manifests folder (repeatable; default ./manifests or $RECONCILE_MANIFESTS)",
    )
    p.add_argument(
        "--state-dir",
        type=path_given,
        metavar="DIR",
        default=d,
        help="state dir ($RECONCILE_STATE_DIR)",
    )
    p.add_argument(
        "--devices",
        metavar="LIST",
        default=d,
        help="static inventory, e.g. nvidia:0=80Gi,nvidia:1=24Gi ($RECONCILE_DEVICES)",
    )
    p.add_argument(
        "--node",
        type=node_name,
        metavar="NAME",
        default=d,
        help="node name ($RECONCILE_NODE)",
    )
    p.add_argument("--owner", metavar="NAME", default=d, help="owner of the records this set makes")
    p.add_argument(
        "--max-instances",
        type=max_instances,
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
        choices=backendnames.NAMES,
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
    p.add_argument(
        "-o",
        "--output",
        metavar="FORMAT",
        default=d,
        help=f"output format ({', '.join(OUTPUT_VERBS)}, logs --requests, gateway status;"
        " see each verb's --help)",
    )
    p.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS if suppress else 0)
    p.add_argument(
        "-q", "--quiet", action="store_true", default=argparse.SUPPRESS if suppress else False
    )
    p.add_argument(
        "--no-color",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="no ANSI colours (also: NO_COLOR set, or TERM=dumb)",
    )
    p.add_argument(
        "--insecure-manifests",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="as root, also load manifests others can write (off: refused, like cron)",
    )
    _git_flags(p, d)  # a source, as -f is: `plan --git URL` as `--git URL plan`
    return p


def build_parser(argv: Sequence[str] | None = None) -> Parser:
    """The command line's parser. ``argv``: the call's words, of which only the verbs
    named are built whole; another verb is its name and help (what the usage and a
    mistyped verb show), never parsed with (a verb parses only what follows its name).
    Its shared flags were ~5 ms of each call's CPU, most of a ``status``. None (and the
    completion script, made from the whole parser): every verb whole."""
    named = None if argv is None or "completion" in argv else frozenset(argv)
    parser = Parser(
        prog="reconcile",
        parents=[_common(False)],
        description="Keep local inference engines running as YAML specs say.",
        epilog=epilog("reconcile"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _run_flags(parser)
    _gateway_flags(parser)
    parser.set_defaults(selector=[])  # every verb's namespace has it: `-l` or not
    # `[VERB]`: with none, reconcile runs the control loop (the usage said VERB was required)
    sub = parser.add_subparsers(dest="verb", metavar="[VERB]", parser_class=Parser)
    verb = _verb_maker(sub, _common(True), named)
    _view_verbs(verb)
    _node_verbs(verb)
    _set_verbs(verb)
    p = verb("completion", "a shell completion script (bash, zsh, fish)", [])
    p.add_argument("shell", choices=("bash", "zsh", "fish"))
    p.set_defaults(parser=parser)  # the script is generated from the whole parser
    return parser


def _allow_empty(p: Parser, help_text: str) -> None:
    """``--allow-empty`` after the verb as before it: the verb's own default would
    overwrite ``reconcile --allow-empty plan``'s True (argparse keeps the last default)."""
    p.add_argument("--allow-empty", action="store_true", default=argparse.SUPPRESS, help=help_text)


def _verb_maker(sub: Any, common: Parser, named: frozenset[str] | None) -> VerbMaker:
    def verb(name: str, help_text: str, parents: list[Parser] | None = None) -> Parser:
        if named is not None and name not in named:  # not called (build_parser)
            unbuilt: Parser = sub.add_parser(name, help=help_text, add_help=False)
            return unbuilt
        p: Parser = sub.add_parser(
            name,
            parents=[common] if parents is None else parents,
            help=help_text,
            description=help_text[0].upper() + help_text[1:] + ".",
            epilog=epilog(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        return p

    return verb


def _run_flags(parser: Parser) -> None:
    """The control loop's and --once's own flags (before any verb)."""
    # The distribution by name: `reconcile` on the package index is an unrelated project.
    parser.add_argument(
        "--version", action="version", version=f"reconcile {__version__} (reconcile-engines)"
    )
    parser.add_argument("--once", action="store_true", help="run one pass and exit")
    parser.add_argument("--wait", action="store_true", help="with --once: pass until all Ready")
    parser.add_argument(
        "--timeout",
        type=positive_duration,
        default=None,  # not "10m": a --timeout without --wait must be told from none
        help="--wait limit (30s, 5m, 1h30m; default 10m)",
    )
    parser.add_argument(
        "--allow-empty",
        action="store_true",
        help="let a missing or empty manifests folder prune everything",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    parser.add_argument(
        "--resync",
        type=positive_duration,
        default="5s",
        help="daemon: full pass interval (default 5s)",
    )
    parser.add_argument(
        "--lock-timeout",
        type=duration,
        default=DEFAULT_LOCK_TIMEOUT,
        help=f"wait this long for another pass (default {DEFAULT_LOCK_TIMEOUT:g}s)",
    )
    parser.add_argument(
        "--metrics-file", metavar="PATH", help="write Prometheus metrics here after each pass"
    )
    parser.add_argument(
        "--metrics-port",
        type=listen_address("9101"),
        metavar="[HOST:]PORT",
        help="daemon: serve /metrics (default host 127.0.0.1)",
    )


def _git_flags(parser: Parser, default: Any) -> None:
    """The git source's flags (``default``: the verb's copy must not reset them)."""
    g = parser.add_argument_group('git source (daemon and --once; see README "GitOps")')
    g.add_argument(
        "--git", metavar="URL", default=default, help="follow this repository (instead of -f)"
    )
    g.add_argument(
        "--branch", metavar="NAME", default=default, help="the branch to follow (default main)"
    )
    g.add_argument(
        "--tag", metavar="NAME", default=default, help="follow a tag instead of a branch"
    )
    g.add_argument(
        "--git-path",
        metavar="PATH",
        default=default,
        help="the manifests folder in the repository (default: top)",
    )
    g.add_argument(
        "--interval",
        type=positive_duration,
        metavar="DURATION",
        default=default,
        help="fetch this often (default 1m; a webhook fetches at once)",
    )
    g.add_argument(
        "--git-timeout",
        type=positive_duration,
        metavar="DURATION",
        default=default,
        help="give up a fetch after this long (default 60s): a remote that hangs holds the pass",
    )


def _view_verbs(verb: VerbMaker) -> None:
    """Verbs that look: plan, status/get, describe, logs, events, validate, schema."""
    p = verb("plan", "show what a pass would do (exit 2: changes)")
    _allow_empty(p, "let a missing or empty manifests folder prune everything")
    _selector(p)
    for name in ("status", "get"):
        p = verb(name, "deployments and their phases")
        p.add_argument("names", nargs="*", metavar="NAME", help="only these (default: all)")
        _selector(p)
        p.add_argument("-w", "--watch", action="store_true", help="print each change as it happens")
        p.add_argument(
            "--refresh",
            action="store_true",
            help="look now (liveness, probes) instead of the last pass's view; acts on nothing",
        )
    p = verb("describe", "spec, record, events, last log lines")
    p.add_argument(
        "names", nargs="*", metavar="NAME", help="the deployments, in order (or select with -l)"
    )
    _selector(p)
    p = verb("logs", "the engines' logs", [_common(True, ("--manifests",))])
    p.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="the deployments (default: every one; several: each line behind its name)",
    )
    p.add_argument(
        "-f", "--follow", action="store_true", help="keep printing until the deployment goes"
    )
    p.add_argument("--tail", type=count, default=None, metavar="N", help="the last N lines")
    p.add_argument("-p", "--previous", action="store_true", help="the run before the last restart")
    p.add_argument(
        "--requests",
        action="store_true",
        help="the gateway's request log instead (who called what, status, timings; -o json)",
    )
    p.add_argument(
        "--replica",
        type=int,
        metavar="I",
        help="one replica's log (default: every replica's, each line behind its name)",
    )
    p = verb("events", "the event journal, newest last")
    p.add_argument("name", nargs="?", help="one deployment's events (default: all)")
    p.add_argument("-w", "--watch", action="store_true", help="keep printing new events")
    p = verb("validate", "check manifests (exit 1 if any invalid, or none found)")
    _allow_empty(p, "no manifest at all is valid")
    verb("source", "the git source followed: its commits and state (-o json)")
    verb("history", "the commits this node applied, newest last (-o json)")
    p = verb("rollback", "apply an older commit and pin the node there (--resume: follow again)")
    p.add_argument("rev", nargs="?", help="the commit (default: the last one all Ready)")
    p.add_argument("--resume", action="store_true", help="follow the branch again")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="the plan against the older commit (as `reconcile plan`), change nothing",
    )
    verb("schema", "the JSON Schema of a manifest")


def _node_verbs(verb: VerbMaker) -> None:
    """Verbs about this node: devices, drain, uncordon."""
    p = verb("devices", "the inventory, who holds what, each device's health")
    p.add_argument(
        "--clear",
        action="append",
        metavar="DEVICE",
        help="return an Unhealthy device (kind:id, e.g. nvidia:1) to placement; repeatable",
    )
    p = verb("drain", "start nothing new until uncordoned")
    p.add_argument(
        "--ttl",
        type=positive_duration,
        default="1h",
        help="the drain ends by itself after this (default 1h; renew: drain again)",
    )
    p.add_argument("--reason", default="", help="why: shown in every denial and in status")
    p.add_argument("--evict", action="store_true", help="also stop running engines")
    verb("uncordon", "end a drain")


def _set_verbs(verb: VerbMaker) -> None:
    """Verbs that act on a manifest set or its state: down, gateway, export, models."""
    p = verb("down", "tear down everything this set owns")
    p.add_argument(
        "names", nargs="*", metavar="NAME", help="only these deployments (each with every replica)"
    )
    p.add_argument("--allow-empty", action="store_true")
    p.add_argument(
        "--gateway",
        action="store_true",
        help="also stop the state dir's gateway process (left running otherwise)",
    )
    _selector(p)
    p = verb("restart", "a new instance of each replica (rolling when the strategy says so)")
    p.add_argument("names", nargs="+", metavar="NAME", help="the deployments to restart")
    p.add_argument(
        "--timeout",
        dest="restart_timeout",
        metavar="S",
        type=positive_duration,
        default="10m",
        help="wait this long for the new instances to be Ready (default 10m)",
    )
    p.add_argument("--no-wait", action="store_true", help="ask for the restart and return at once")
    p = verb(
        "gateway",
        "the gateway process: status, start, stop, restart (take the port over), or reload "
        "(node.yaml's gateway settings)",
    )
    p.add_argument(
        "action",
        nargs="?",
        default="status",
        choices=("status", "start", "stop", "restart", "reload"),
    )
    p = verb("ui", "the web page of the node: its URL on the gateway")
    p.add_argument("--open", action="store_true", help="also open it in a browser, if there is one")
    p = verb("export", "the manifests as Kubernetes objects")
    p.add_argument(
        "--lossy",
        action="store_true",
        help="drop fields Kubernetes cannot express (candidates, shareable...) with a warning",
    )
    p.add_argument("--namespace", metavar="NS", help="set metadata.namespace on every object")
    p = verb("models", "the model cache: files, sizes, users; prune what no manifest names")
    p.add_argument("action", nargs="?", default="list", choices=("list", "prune"))
    p.add_argument(
        "--dry-run", action="store_true", help="prune: say what would go, remove nothing"
    )


def _gateway_flags(parser: Parser) -> None:
    group = parser.add_argument_group('gateway (daemon only; see README "The gateway")')
    added: list[argparse.Action] = []

    def flag(*names: str, **how: Any) -> None:
        added.append(group.add_argument(*names, **how))

    flag(
        "--listen",
        metavar="[HOST:]PORT",
        help="serve the OpenAI-compatible gateway here (host default 127.0.0.1; $RECONCILE_LISTEN)",
    )
    flag(
        "--api-keys",
        metavar="FILE",
        help="require a key from FILE (one per line, chmod 600; $RECONCILE_API_KEYS)",
    )
    flag(
        "--insecure-listen",
        action="store_true",
        help="allow a non-loopback --listen without --api-keys (warns at every start)",
    )
    flag(
        "--tls-cert",
        metavar="FILE",
        help="serve HTTPS (TLS 1.2+) with this PEM certificate chain ($RECONCILE_TLS_CERT)",
    )
    flag(
        "--tls-key",
        metavar="FILE",
        help="the certificate's private key (chmod 600; $RECONCILE_TLS_KEY); SIGHUP reloads both",
    )
    flag(
        "--tls-client-ca",
        metavar="FILE",
        help="require a client certificate this CA signed; its CRL in the file revokes "
        "($RECONCILE_TLS_CLIENT_CA)",
    )
    flag("--max-body", type=int, metavar="BYTES", help="largest request body (32 MiB)")
    flag(
        "--max-body-total",
        type=int,
        metavar="BYTES",
        help=(
            "request bodies held at once, all together (128 MiB; one API key at most half);"
            " past it wait, then 503"
        ),
    )
    flag("--max-inflight", type=int, metavar="N", help="concurrent requests per deployment (128)")
    flag(
        "--max-queue", type=int, metavar="N", help="requests queued per deployment, then 429 (256)"
    )
    # Given without --listen they would do nothing: cmd_run refuses them by these names.
    parser.set_defaults(gateway_only=tuple(a.dest for a in added if a.dest != "listen"))


def _selector(p: Parser) -> None:
    p.add_argument(
        "-l",
        "--selector",
        action="append",
        type=_label,
        default=[],
        metavar="SELECTOR",
        help="only deployments whose labels match, as kubectl's -l: team=search,tier!=dev,"
        " gpu, !gpu, team in (a,b) (repeatable: all must match)",
    )


def _label(text: str) -> tuple[Requirement, ...]:
    """A selector as kubectl reads it; one that is none is a usage error naming what is
    wrong in it (it silently matched nothing: `-l 'bad key=@'`, `-l a=b,c=d`)."""
    from controller.core.manifest.labelsyntax import parse_selector

    try:
        return parse_selector(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _check_output(parser: Parser, args: argparse.Namespace) -> None:
    """`-o` where it means nothing is a usage error: silently ignoring it misleads scripts."""
    if args.output is None:
        return
    verb = "plan" if args.verb is None and args.dry_run else args.verb
    if verb == "logs" and args.requests:
        return  # logs --requests -o json (requestsverb.py checks the format)
    if verb == "gateway" and args.action == "status":
        return  # gateway status -o json (gatewayverbs.py checks the format)
    if verb not in OUTPUT_VERBS:
        what = f"`{verb}`" if verb else "the daemon or --once"
        known = [v for v in OUTPUT_VERBS if v in _verbs(parser)]
        known += ["logs --requests", "gateway status"]
        parser.error(f"-o/--output means nothing for {what}: only for {', '.join(known)}")


def _verbs(parser: Parser) -> Sequence[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


def _flags(parser: Parser, verb: str | None) -> list[str]:
    """The long flags a slip may have meant: the verb's, after one (the command's own, such
    as ``--once``, are refused there: ``status --once`` must not be told it meant ``--once``)."""
    chosen = parser
    for action in parser._actions:
        if verb is not None and isinstance(action, argparse._SubParsersAction):
            chosen = action.choices[verb]
    return [f for f in chosen._option_string_actions if f.startswith("--")]


def _check_environment(parser: Parser, args: argparse.Namespace) -> None:
    """A malformed flag or variable is a usage error (64), named: a flag's type checks
    its own text; the variable that stands in for it is checked here the same way."""
    import os

    from controller.core.devices.inventory import parse_static
    from controller.errors import ConfigError

    checks: tuple[tuple[str | None, str, str, Callable[[str], object]], ...] = (
        (args.devices, "--devices", "RECONCILE_DEVICES", parse_static),
        (args.max_instances, "--max-instances", "RECONCILE_MAX_INSTANCES", max_instances),
        (args.node, "--node", "RECONCILE_NODE", node_name),
        (args.state_dir, "--state-dir", "RECONCILE_STATE_DIR", state_folder),
    )
    for flag, name, variable, check in checks:
        text = flag if flag is not None else os.environ.get(variable)
        if not text:
            continue
        try:
            check(text)
        except (ConfigError, argparse.ArgumentTypeError) as exc:
            parser.error(f"{name if flag is not None else variable}: {exc}")


def _check_backend(parser: Parser, args: argparse.Namespace) -> None:
    """A bad backend, or ray without an address, is a usage error (64) naming the flag."""
    if args.verb == "completion":  # prints a script; runs at every shell start
        return
    from controller.errors import ConfigError
    from controller.store.config.node import resolve_backend

    try:
        resolve_backend(args.backend, args.ray_address)
    except ConfigError as exc:
        parser.error(str(exc))


def _check_source(parser: Parser, args: argparse.Namespace) -> None:
    """Flags that name two sources at once are a usage error (64), as README says every
    usage error is; node.yaml's settings are judged with the config (exit 1)."""
    for flag, dest in (("--git", "git"), ("--branch", "branch"), ("--tag", "tag")):
        if getattr(args, dest, None) == "":  # else taken as no flag: another source ran
            parser.error(f"{flag} is empty (an unset variable?): give its value, or drop it")
    if getattr(args, "git", None) and getattr(args, "manifests", None):
        parser.error(
            "-f and --git are one or the other: a node follows a repository or reads"
            " folders; drop one"
        )
    if getattr(args, "branch", None) and getattr(args, "tag", None):
        parser.error("--branch and --tag are one or the other: give a branch or a tag")
    if getattr(args, "manifests", None):  # else silently ignored: the folders are read
        given = [flag for flag, dest in _GIT_ONLY if getattr(args, dest, None) is not None]
        if given:
            parser.error(
                f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for a git source"
                " (--git URL, or git: in node.yaml), not for -f folders: drop "
                f"{'it' if len(given) == 1 else 'them'}"
            )


# The flags that only a git source reads, and their argparse names.
_GIT_ONLY = (
    ("--branch", "branch"),
    ("--tag", "tag"),
    ("--git-path", "git_path"),
    ("--interval", "interval"),
    ("--git-timeout", "git_timeout"),
)


def main(argv: Sequence[str] | None = None) -> int:
    plain = sys.stdout
    sys.stdout, sys.stderr = outlive_reader(sys.stdout), outlive_reader(sys.stderr)
    given = signed_values(sys.argv[1:] if argv is None else argv)
    parser = build_parser(given)
    parser.given = given
    args, extras = parser.parse_known_args(parser.given)
    if extras:  # argparse's own check, with the flag a slip was meant as
        from controller.cli.mistyped import unrecognized

        parser.error(unrecognized(extras, _flags(parser, args.verb), parser.given))
    if getattr(args, "watch", False) or getattr(args, "follow", False):
        sys.stdout = plain  # a follower ends when its reader goes (BrokenPipeError below)
    _check_environment(parser, args)
    _check_output(parser, args)
    _check_backend(parser, args)
    _check_source(parser, args)
    from controller import logsetup as logs
    from controller.cli.verbs import dispatch
    from controller.errors import (
        BackendUnavailable,
        ConfigError,
        ContainerError,
        LockTimeout,
        RecordError,
        StateDirReplaced,
    )

    logs.configure(-1 if args.quiet else args.verbose, colour=not args.no_color)
    try:
        return dispatch(args)
    except (ConfigError, LockTimeout, RecordError, BackendUnavailable, StateDirReplaced) as exc:
        print(f"reconcile: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except BrokenPipeError:  # `status -w | head -1`: the reader has what it wanted
        _quiet_stdout()
        return EXIT_OK
    except ContainerError as exc:  # the runtime did not answer (docker's daemon is down)
        print(
            f"reconcile: {exc}\nreconcile: the container runtime must answer for this: start "
            "it (or point DOCKER_HOST / CONTAINER_HOST at it) and run again; the records are "
            "kept, and the next pass resumes from them",
            file=sys.stderr,
        )
        return EXIT_FAIL
    except OSError as exc:  # ENOSPC, EIO, EACCES on the state dir: the pass stopped there
        denied = isinstance(exc, PermissionError) and _state_dir_denied(args, exc)
        if denied:
            print(f"reconcile: {denied}", file=sys.stderr)
            return EXIT_FAIL
        where = f": {exc.filename}" if exc.filename else ""
        fix = "Fix the disk or permissions"
        if exc.errno in (errno.EISDIR, errno.ENOTDIR):  # a hand's mkdir: nor does that
            fix = (
                "A folder stands where reconcile keeps a file (or a file where it keeps a"
                " folder): move it away"
            )
        if exc.errno == errno.EROFS:  # no free space or file mode mends that
            fix = (
                "Its disk is mounted read-only (after a disk error, the kernel remounts it so:"
                " see dmesg): mend it, mount it read-write again"
            )
        print(
            f"reconcile: I/O error{where}: {exc.strerror or exc}. {fix}"
            " and run again: the next pass resumes from the records on disk",
            file=sys.stderr,
        )
        return EXIT_FAIL
    except KeyboardInterrupt:
        from controller.cli.interrupted import interrupted

        return interrupted(args)


def _state_dir_denied(args: argparse.Namespace, exc: OSError) -> str | None:
    from controller.store.config.node import state_dir_denied

    filename = exc.filename if isinstance(exc.filename, str) else None
    return state_dir_denied(getattr(args, "state_dir", None), filename)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: the interpreter's last flush must not fail again."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def entry() -> None:
    """What a script installed before ``controller.cli.entry`` was the start still names."""
    from controller.cli import entry as start

    start()
