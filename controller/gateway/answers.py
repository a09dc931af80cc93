"""OpenAI-style error bodies: what a client library shows its user."""

from __future__ import annotations

import json

from aiohttp import web

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "api_error",
    503: "api_error",
}


def error(
    status: int, message: str, code: str, *, retry_after: float | None = None
) -> web.Response:
    """``{"error": {"message", "type", "param", "code"}}`` with ``Retry-After`` when given."""
    body = {
        "error": {
            "message": message,
            "type": TYPES.get(status, "api_error"),
            "param": None,
            "code": code,
        }
    }
    headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after is not None else None
    return web.Response(
        status=status,
        body=json.dumps(body).encode(),
        content_type="application/json",
        headers=headers,
    )
