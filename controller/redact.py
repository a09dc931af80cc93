"""Secrets out of what reconcile itself prints: env values, flag values, URL passwords;
and control characters out of what reaches a terminal.

Used by `describe` (the spec) and by the log marker line (the argv). What an engine
prints about itself is its own business and is not rewritten, but a terminal shows it
escaped (``printable``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

SECRET = re.compile(r"TOKEN|SECRET|KEY|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)
URL_PASSWORD = re.compile(r"(://[^:/@\s]+:)[^@/\s]+@")
# A query parameter that carries a secret: ?token=, ?api_key=, a pre-signed URL's signature.
URL_SECRET = re.compile(
    r"([?&][^=&#\s]*(?:TOKEN|SECRET|KEY|PASSW|CREDENTIAL|AUTH|SIGNATURE|SIG)[^=&#\s]*=)"
    r"(?!<redacted>)[^&#\s\"'<>]*",  # once: a message is redacted again as a whole
    re.IGNORECASE,
)
REDACTED = "<redacted>"
# vLLM's and SGLang's argparse read a flag's beginning as the flag (and vLLM `_` as `-`):
# `--api-k KEY` is `--api-key KEY`, whose name SECRET does not match. From `--api-k` on,
# no other flag of theirs begins so.
KEY_FLAG, KEY_FLAG_SHORTEST = "--api-key", "--api-k"


def redact_env(env: dict[str, Any]) -> dict[str, Any]:
    """A secret's name hides its value; any other value loses a URL's password and secret
    query values (``DB_URL=postgres://u:pw@h/db``), as an argument does."""
    return {
        k: REDACTED if SECRET.search(k) else redact_url(v) if isinstance(v, str) else v
        for k, v in env.items()
    }


def redact_args(args: Sequence[Any]) -> list[str]:
    """``--api-key X`` / ``--hf-token=X`` / ``https://user:pw@host`` lose their secret."""
    out: list[str] = []
    hide_next = False
    for arg in args:
        text = str(arg)
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = text.partition("=")
        if text.startswith("-") and (SECRET.search(flag) or _key_beginning(flag)):
            out.append(f"{flag}={REDACTED}" if eq else text)
            hide_next = not eq
            continue
        out.append(URL_PASSWORD.sub(rf"\1{REDACTED}@", text))
    return out


def _key_beginning(flag: str) -> bool:
    dashed = flag.replace("_", "-")
    return dashed.startswith(KEY_FLAG_SHORTEST) and KEY_FLAG.startswith(dashed)


def redact_url(url: str) -> str:
    """A URL fit to print: no password, no secret query value (``?token=<redacted>``)."""
    return URL_SECRET.sub(rf"\1{REDACTED}", URL_PASSWORD.sub(rf"\1{REDACTED}@", url))


def redact_spec(spec: dict[str, Any]) -> dict[str, Any]:
    out = dict(spec)
    if isinstance(out.get("env"), dict):
        out["env"] = redact_env(out["env"])
    for key in ("args", "command"):
        if isinstance(out.get(key), list | tuple):
            out[key] = redact_args(out[key])
    return out


# What a terminal acts on instead of showing: C0 controls (ESC starts `\x1b[2J`, which
# clears the screen), DEL, C1 (0x9b is a one-byte CSI), and the bidi overrides that
# reorder what is shown ("Trojan Source"). A NUL also makes `grep` call the output binary.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str, keep: str = "") -> str:
    """``text`` with each control character shown as its escape (ESC as ``\\x1b``), but
    those in ``keep`` (a log's ``"\\n\\t"``): what an engine, an upstream or a drain's
    reason wrote is shown in a terminal, never acted on."""
    return CONTROL.sub(lambda m: m.group() if m.group() in keep else _escape(m.group()), text)


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


# The same characters as UTF-8 bytes, for logs copied as bytes: C0 but tab and newline,
# DEL, C1 (two bytes), the bidi overrides (three).
CONTROL_BYTES = re.compile(
    rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\x8e\x8f\xaa-\xae]|\xe2\x81[\xa6-\xa9]"
)
# A chunk that ends inside one of those sequences: held back until the rest comes.
PARTIAL = (b"\xc2", b"\xe2", b"\xe2\x80", b"\xe2\x81")


def printable_bytes(data: bytes) -> bytes:
    """``printable`` for a log's bytes (tab and newline kept): each control character
    as its escape, whatever else the bytes are (not UTF-8 is passed as it is)."""
    return CONTROL_BYTES.sub(lambda m: _escape(m.group().decode()).encode(), data)
