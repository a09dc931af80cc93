"""Secrets out of what reconcile itself prints: env values, flag values, URL passwords.

Used by `describe` (the spec) and by the log marker line (the argv). What an engine
prints about itself is its own business and is not rewritten.
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


def redact_env(env: dict[str, Any]) -> dict[str, Any]:
    return {k: REDACTED if SECRET.search(k) else v for k, v in env.items()}


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
        if text.startswith("-") and SECRET.search(flag):
            out.append(f"{flag}={REDACTED}" if eq else text)
            hide_next = not eq
            continue
        out.append(URL_PASSWORD.sub(rf"\1{REDACTED}@", text))
    return out


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
