"""A verb or flag that is not one of reconcile's: the one meant, a slip or another tool's habit.

argparse answers `reconcile stauts` with every verb there is; the one a person meant is
one letter away, or is kubectl's, docker compose's or systemctl's word for what reconcile
does another way (`apply`, `up`, `ps`, `rm`). A misspelt flag (`--onse`) was only an
"unrecognized argument".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import pairwise

from controller.core.manifest.excerpt import did_you_mean

# Other tools' verbs and reconcile's way to do what they do.
HABITS = {
    "apply": "`reconcile --once` (one pass; `reconcile` alone runs the daemon)",
    "up": "`reconcile --once --wait` (one pass, until Ready; `reconcile` alone runs the daemon)",
    "run": "`reconcile --once` (one pass; `reconcile` alone runs the daemon)",
    "start": "`reconcile --once` (one pass; `reconcile` alone runs the daemon)",
    "sync": "`reconcile --once` (one pass; `reconcile` alone runs the daemon)",
    "diff": "`reconcile plan`",
    "help": "`reconcile --help` (or `reconcile VERB --help`)",
    "ps": "`reconcile status`",
    "ls": "`reconcile status`",
    "list": "`reconcile status`",
    "top": "`reconcile status -o wide` (or `reconcile devices`)",
    "rm": "`reconcile down NAME`",
    "delete": "`reconcile down NAME`",
    "stop": "`reconcile down NAME`",
    "kill": "`reconcile down NAME`",
    "log": "`reconcile logs`",
    "version": "`reconcile --version`",
    "check": "`reconcile validate`",
    "lint": "`reconcile validate`",
    # Flux's and Argo CD's: a git source is held at a commit by a rollback's pin
    "suspend": "`reconcile rollback REV` with the commit `reconcile source` says is applied"
    " (the node keeps fetching, applies nothing new until `reconcile rollback --resume`)",
    "resume": "`reconcile rollback --resume` (follows the branch or tag again)",
    # kubectl's: `cordon` is one letter from `uncordon`, which does the opposite
    "cordon": "`reconcile drain` (nothing new starts; `--evict` stops what runs too)",
    "scale": "set `spec.replicas` in the manifest (or `spec.autoscale`): the next pass applies it",
    "edit": "edit the manifest file (`reconcile describe NAME` names it): the next pass applies it",
    "rollout": "`reconcile restart NAME` (rollout restart), `reconcile --once --wait` (status)",
    # kubectl's and docker's: a manifest's fields, a model fetched ahead, an object's detail
    "explain": "`reconcile schema` (every manifest field, its type and description; README"
    ' "A manifest" has them as a table)',
    "pull": "a pass pulls `spec.source` itself before the engine starts: `reconcile --once"
    " --wait` shows its progress, `reconcile models` the model cache",
    "inspect": "`reconcile describe NAME` (`-o json` for the whole record)",
}
# kubectl's flags and reconcile's way to do what they do.
FLAG_HABITS = {
    "--for": "`reconcile events NAME` (kubectl's `events --for`)",
    "--since": "`--tail N` (logs keep no time index)",
    "-A": "a node has no namespaces: `reconcile status` lists every deployment",
    "--all-namespaces": "a node has no namespaces: `reconcile status` lists every deployment",
    "--show-labels": "`-o json` (each item's `labels`), or select with `-l`",
}
# kubectl's resource types, given where reconcile takes a deployment's NAME (`get pods`).
_EVERY = "`reconcile status` with no NAME lists every deployment"
KINDS = {
    **dict.fromkeys(("all", "deployments", "deployment", "deploy", "pods", "pod", "po"), _EVERY),
    **dict.fromkeys(("nodes", "node", "no"), "`reconcile devices` shows the node's devices"),
    **dict.fromkeys(("events", "event", "ev"), "`reconcile events` with no NAME shows them all"),
}
_INVALID = re.compile(r"^argument \[VERB\]: invalid choice: '(?P<word>[^']*)' \(choose from ")


def meant(
    message: str, verbs: Sequence[str], given: Sequence[str] = (), flags: Sequence[str] = ()
) -> str:
    """``message`` (argparse's), with the verb meant when it names a mistyped one.

    ``given``: the command line; ``flags``: the long flags before a verb. A "verb" that
    follows a flag reconcile does not know is that flag's value: the flag is the slip.
    """
    found = _INVALID.match(message)
    if found is None:
        return message
    word = found["word"]
    slipped = _unknown_flag_before(word, given, flags)
    if slipped is not None:
        return unrecognized([slipped], flags)
    apart = _unit_apart([word], given)
    if apart is not None:  # `--timeout 10 minutes`: the unit was taken for the verb
        return f"{word!r} is no verb: a duration is one word: write `{apart}`"
    if "/" in word or word.endswith((".yaml", ".yml")):  # `reconcile manifests/` (compose's -f)
        return f"{word!r} is no verb: give a folder or manifest with -f (`reconcile -f {word}`)"
    habit = HABITS.get(word.lower())
    if habit is not None:
        return f"{word!r} is no verb of reconcile's: {habit}"
    close = did_you_mean(word, verbs, cutoff=0.75)
    if close is not None:
        return f"{word!r} is no verb: did you mean `{close}`?"
    return message


# The flags that take a duration (main.py's `duration` types; a test holds the two alike).
DURATION_FLAGS = frozenset(
    ("--ttl", "--timeout", "--resync", "--lock-timeout", "--interval", "--git-timeout")
)
# A duration's unit written as a word of its own (`--ttl 1 hour`): the letter it takes.
UNIT_WORDS = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), "s"),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), "m"),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), "h"),
}


def unrecognized(extras: Sequence[str], flags: Sequence[str], given: Sequence[str] = ()) -> str:
    """argparse's "unrecognized arguments" line, with the flag meant when one is a slip
    (``given``: the command line, where a unit left apart follows its number)."""
    message = f"unrecognized arguments: {' '.join(extras)}"
    apart = _unit_apart(extras, given)
    if apart is not None:
        return f"{message}: a duration is one word: write `{apart}`"
    # compared without the dashes every flag shares: with them `--once` is close to `--owner`
    names = {flag.removeprefix("--"): flag for flag in flags}
    for word in extras:
        if word.startswith("--"):
            close = did_you_mean(word.partition("=")[0][2:], names, cutoff=0.75)
            if close is not None:
                return f"{message}: did you mean `{names[close]}`?"
        habit = FLAG_HABITS.get(word.partition("=")[0])
        if habit is not None:
            return f"{message}: {habit}"
    return message


def _unit_apart(extras: Sequence[str], given: Sequence[str]) -> str | None:
    """``--ttl 1h`` for ``--ttl 1 hour``: a flag, a number, then a unit word left over."""
    for flag, number, unit in zip(given, given[1:], given[2:], strict=False):
        letter = UNIT_WORDS.get(unit.lower())
        if letter and unit in extras and flag in DURATION_FLAGS and number.isdigit():
            return f"{flag} {number}{letter}"
    return None


def _unknown_flag_before(word: str, given: Sequence[str], flags: Sequence[str]) -> str | None:
    """The flag just before ``word`` on the command line when it is none of ``flags`` (nor
    the start of one: argparse takes ``--state`` for ``--state-dir``)."""
    for before, after in pairwise(given):
        if after != word or not before.startswith("--") or "=" in before or before == "--":
            continue
        if not any(f.startswith(before) for f in flags):
            return before
    return None


def kind_meant(name: str) -> str | None:
    """What a kubectl resource type given as a deployment's NAME means here, if it is one."""
    habit = KINDS.get(name.lower())
    return None if habit is None else f"{name!r} is a kubectl resource type: {habit}"
