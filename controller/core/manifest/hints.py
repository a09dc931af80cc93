"""The next move for a value of the wrong shape, in the words its writer used. Pure.

pydantic says what was wanted ("Input should be a valid string"); what people wrote is
nearly always one of a few YAML slips: ``{port}`` unquoted (a mapping), ``true`` or
``1.0`` unquoted where text goes, a bare value where a mapping with one obvious field
goes (``devices: 1``), ``KEY=VALUE`` items where a mapping goes, a mapping where a list
goes. Each hint shows the line to write instead.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Sequence

from controller.core.manifest.excerpt import clip, short
from controller.redact import redact_args, redact_env

# A mapping written as its one obvious field's value (`devices: 1` is `devices: {count: 1}`),
# when the value is of that field's type; `tcpSocket` and `completion` take no field at all.
SHORTHAND: dict[str, tuple[str, type]] = {
    "devices": ("count", int),
    "container": ("image", str),
    "httpGet": ("path", str),
    "huggingFace": ("repo", str),
}
EMPTY = ("tcpSocket", "completion")
# `devices: {count: 0.5}`: a share of a device is asked for by its memory.
PART_OF_A_DEVICE = (
    ": a whole number of devices; to share one, give the memory each engine needs of it "
    "(devices: {count: 1, memory: 20Gi}): engines are then packed by memory"
)


# Fields of other tools (Kubernetes, compose, systemd) and where reconcile keeps them,
# by the mapping they were written in: the spelling is right, the name is another's.
ELSEWHERE: dict[tuple[str, ...], dict[str, str]] = {
    ("spec",): {
        "readinessProbe": "`readiness`",
        "startupProbe": "`readiness` (its `deadlineSeconds`)",
        "healthcheck": "`livenessProbe`",
        "health": "`livenessProbe` (or `readiness`)",
        "gpus": "`devices.count`",
        "gpu": "`devices.count`",
        "resources": "`devices` (`count`, `kind`, `memory`)",
        "environment": "`env`",
        "enviroment": "`env`",
        "ports": "`port` (one port; or `basePort`)",
        "containerPort": "`port`",
        "restart": "`restartPolicy`",
        "replicaCount": "`replicas`",
        "entrypoint": "`command`",
        "cmd": "`command`",
        "arguments": "`args`",
        "volumes": "`container.volumes`",
        "labels": "`metadata.labels`",
        "name": "`metadata.name`",
    },
    (): {"name": "`metadata.name`", "labels": "`metadata.labels`"},
}


# A required field not written, and the line that writes it.
MISSING = {
    ("apiVersion",): "`apiVersion: reconcile/v1`",
    ("kind",): "`kind: Deployment`",
    ("spec", "engine"): "`engine:` (vllm, llama-cpp, sglang, tgi, ollama or command)",
}


def for_missing(path: tuple[str | int, ...]) -> str:
    """A required field was not written: the line to add, where it has one answer."""
    line = MISSING.get(tuple(str(p) for p in path))
    return f": add {line}" if line else ""


def elsewhere(parent: tuple[str | int, ...], word: str) -> str | None:
    """Where reconcile keeps the field another tool names ``word`` at ``parent``."""
    return ELSEWHERE.get(tuple(str(p) for p in parent), {}).get(word)


def for_text(value: object, written: str | None = None) -> str:
    """Text was wanted; YAML made ``value`` something else from an unquoted scalar
    (``written``: that scalar's text in the file, where the loader found it)."""
    if isinstance(value, dict) and len(value) == 1:
        ((key, inner),) = value.items()
        if inner is None and isinstance(key, str):  # `[serve, {port}]`: a flow mapping
            braced = "{" + key + "}"
            return f': YAML reads {clip(braced)} unquoted as a mapping: quote it ("{braced}")'
        if isinstance(key, str) and isinstance(inner, str | int | float):  # `[-c, a: b]`
            said = clip(f"{key}: {inner}", 60)
            return f": YAML reads `{said}` as a mapping (': ' in an unquoted item): quote it"
    if isinstance(value, bool):
        said = str(value).lower()
        return f": YAML reads an unquoted {said} (yes/no/on/off) as a boolean: quote it"
    if isinstance(value, int | float):  # `0755` came back 493, `1.10` 1.1, `000…0` 0
        return f": YAML reads {_as_number(value, written)}: {_quote(written)}"
    if value is None:
        return ': the value is empty (or null): give one, quoted ("") for an empty string'
    if isinstance(value, datetime.date):  # `version: 2026-12-06`
        return f': YAML reads {value} as a date: quote it ("{value}")'
    return ""


# Kubernetes' env is a list of {name, value} (or valueFrom) items; reconcile's a mapping.
# The line to write hides a secret's value (redact_env): a token inline would be echoed.
KUBERNETES_ENV = ": a mapping NAME: value, not Kubernetes' list of name/value items: write env: {}"
VALUE_FROM = (
    ": Kubernetes' valueFrom (a Secret, a ConfigMap) is not read here: put the value in a"
    " file spec.envFrom reads ({file: /etc/reconcile/NAME.env} or {sopsFile: ...})"
)


def for_env(name: str | int, value: object) -> str:
    """spec.env, or one of its values, in another shape: what to write, naming the
    variables and never quoting a value (a token there would reach the terminal)."""
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        if any("valueFrom" in v for v in value):
            return VALUE_FROM
        pairs = {str(v.get("name", "NAME")): str(v.get("value", "")) for v in value}
        return KUBERNETES_ENV.format(_mapping_line(pairs))
    if isinstance(value, dict) and "valueFrom" in value:
        return VALUE_FROM
    if isinstance(value, dict) and list(value) == ["value"]:
        said = clip(str(name), 60)
        return f": Kubernetes' {{value: ...}} shape: write {said}: VALUE, the value alone"
    if isinstance(value, dict):
        return ": YAML reads the value as a mapping (': ' or braces unquoted): quote it"
    return "" if isinstance(value, list) else for_text(value)


def _as_number(value: int | float, written: str | None) -> str:
    """What was written and the number YAML made of it, where they differ."""
    number = short(value)  # short(): an int past Python's digit limit has no str
    if written is None or written == number:
        return f"{number} as a number"
    return f"{clip(written, QUOTABLE)} as the number {number}"


QUOTABLE = 80  # a sha256 (64) is quoted whole: a cut one is no line to write


def _quote(written: str | None) -> str:
    """The line to write: the writer's own text quoted, never the number YAML made of it
    (`quote it ("0")` for a sha256 of zeros, ("493") for 0755, was another value)."""
    if written is None or len(written) > QUOTABLE or not written.isprintable():
        return "quote it as written"
    if set(written) & {'"', "\\"}:  # a double-quoted string escapes these: say so instead
        return "quote it as written"
    return f'quote it ("{written}")'


def for_mapping(field: str | int, value: object) -> str:
    """A mapping was wanted; ``value`` is a bare value or a list of ``KEY=VALUE``."""
    if isinstance(value, list) and value and all(_pair(v) for v in value):
        pairs = dict(str(v).split("=", 1) for v in value)
        return f": a mapping, not KEY=VALUE items: write {field}: {_mapping_line(pairs)}"
    if str(field) in EMPTY:
        return f": write {field}: {{}} (it takes no fields)"
    inner, kind = SHORTHAND.get(str(field), ("", type(None)))
    if inner and isinstance(value, kind) and not isinstance(value, bool):
        shown = json.dumps(value) if isinstance(value, str) else str(value)
        return f": write {field}: {clip('{' + inner + ': ' + shown + '}', 80)}"
    return ""


def for_list(field: str | int, value: object) -> str:
    """A list was wanted; ``value`` is one mapping (its item, without the ``- ``)."""
    if isinstance(value, dict):
        return f": start each item with '- ' (write {field}: [{{...}}], a list of mappings)"
    if isinstance(value, str):
        return f": write {field}: [{clip(json.dumps(value), 80)}]"
    return ""


def _mapping_line(pairs: dict[str, str]) -> str:
    """``{A: "b", HF_TOKEN: "<redacted>"}``: the flow mapping to write, a secret's value
    hidden (an env's, a label's: either may be a token written where it should not be)."""
    example = ", ".join(f"{k}: {json.dumps(v)}" for k, v in redact_env(pairs).items())
    return clip("{" + example + "}", 80)


def _pair(item: object) -> bool:
    return isinstance(item, str) and "=" in item and not item.startswith("=")


# The slips in an image reference, each with what it is in words and the reference without
# it: spaces pasted around it, a URL's scheme, upper case in the name (a tag may have it).
IMAGE_SLIPS: tuple[tuple[str, Callable[[str], str]], ...] = (
    ("spaces around it", str.strip),
    ("a URL's scheme (an image reference has none)", lambda i: re.sub(r"^[a-z]+://", "", i)),
    ("upper case in its name", lambda i: re.sub(r"^[^:@]*", lambda m: m.group().lower(), i)),
)


def for_image(image: str, valid: Callable[[str], bool]) -> str:
    """What is wrong with ``image`` and the reference meant, when fixing the slips above
    makes a ``valid`` one; else what a sha256 digest must be, if that is the trouble."""
    fixed, said = image, list[str]()
    for what, fix in IMAGE_SLIPS:
        if fix(fixed) != fixed:
            fixed, said = fix(fixed), [*said, what]
    if said and valid(fixed):
        return f": {' and '.join(said)}: write image: {clip(fixed, 100)}"
    digest = image.partition("@")[2]
    if digest and not re.fullmatch(r"sha256:[a-f0-9]{64}", digest):
        return ": its digest must be sha256: and 64 lower-case hex digits (`podman image inspect`)"
    return ""


# `"--ctx-size 4096"`, `"-ngl 99"`: a flag and its value in one argv item. No shell splits
# it, so the engine got it whole and refused it (llama-server: invalid argument), after a
# start; `--port 9000` so written also passed the check of the flags a recipe sets itself.
GLUED = re.compile(r"(--?[A-Za-z][A-Za-z0-9_.-]*)\s+(\S.*)", re.DOTALL)


def glued_flag(items: Sequence[str]) -> tuple[int, str] | None:
    """The first item of an argv that is a flag and its value with a space between, and
    the two items to write (a secret's value hidden). An item after a flag without a
    value is left be: it may be that flag's value (`--extra-args "-x 1"`)."""
    for index, item in enumerate(items):
        match = GLUED.fullmatch(item.strip())
        before = items[index - 1] if index else ""
        if match is None or (before.startswith("-") and "=" not in before):
            continue
        flag, value = redact_args([match.group(1), match.group(2)])
        return index, (
            f"a flag and its value in one item (a space between them): no shell splits it, "
            f"so the engine would get it whole and refuse it; write two items: "
            f"[{flag}, {clip(json.dumps(value), 60)}]"
        )
    return None
