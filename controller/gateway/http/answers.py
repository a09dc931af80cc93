"""OpenAI-style error bodies: what a client library shows its user."""

from __future__ import annotations

import json

from controller.gateway.http.messages import Response

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    502: "api_error",
    503: "api_error",
}


def body(status: int, message: str, code: str) -> dict[str, dict[str, str | None]]:
    """``{"error": {"message", "type", "param", "code"}}``: also a stream's last event."""
    return {
        "error": {
            "message": message,
            "type": TYPES.get(status, "api_error"),
            "param": None,
            "code": code,
        }
    }


def error(
    status: int,
    message: str,
    code: str,
    *,
    retry_after: float | None = None,
    allow: tuple[str, ...] = (),
    final: bool = False,
) -> Response:
    """The error body, with ``Retry-After`` (a 503 or 429) or ``Allow`` (a 405) when given;
    ``final``: no retry can succeed until a person acts, which ``x-should-retry: false``
    tells the OpenAI and Anthropic clients (they retry every 5xx twice by default)."""
    headers: dict[str, str] = {}
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, round(retry_after)))
    if final:
        headers["x-should-retry"] = "false"
    if allow:
        headers["Allow"] = ", ".join(allow)
    if status == 401:  # RFC 9110 15.5.2: a 401 MUST say how to authenticate (nginx's does)
        headers["WWW-Authenticate"] = "Bearer"
    return Response(
        status=status,
        body=json.dumps(body(status, message, code)).encode(),
        content_type="application/json",
        headers=headers or None,
    )
