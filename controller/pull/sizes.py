"""How many bytes a source will download, asked of its server before any pull (``plan``).

A URL: one ``HEAD`` (its ``Content-Length``); the hub: ``huggingface_hub``'s own dry run
(the sizes of the files its globs select). Bounded by a short timeout and never an
error: a server that does not answer, or answers without a length, is an unknown size.
"""

from __future__ import annotations

import os

from controller.core.manifest.sources import HuggingFace, Source

TIMEOUT = 5.0  # seconds: `plan` must answer even when the server does not


def remote_size(source: Source, timeout: float = TIMEOUT) -> int | None:
    """The whole size of ``source`` in bytes, or None when the server does not say."""
    if source.url is not None:
        return _head(source.url, timeout)
    assert source.hugging_face is not None
    return _hub(source.hugging_face, timeout)


def _head(url: str, timeout: float) -> int | None:
    # Here, not at the top: urllib.request brings http.client and ssl (~20 ms), which a
    # `plan` with no URL source (most) would pay for nothing.
    import urllib.error
    import urllib.request
    from http.client import HTTPException

    from controller.pull.httpget import request_for  # the pull's own: credentials too

    try:
        with urllib.request.urlopen(request_for(url, "HEAD"), timeout=timeout) as response:
            length = response.headers.get("Content-Length")
    except (urllib.error.URLError, OSError, ValueError, HTTPException):  # InvalidURL...
        return None
    return int(length) if length and length.isdigit() else None


def _hub(hub: HuggingFace, timeout: float) -> int | None:
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    try:
        from huggingface_hub import snapshot_download

        listing = snapshot_download(
            hub.repo,
            revision=hub.revision,
            allow_patterns=list(hub.files) or None,
            etag_timeout=timeout,
            dry_run=True,
            endpoint=os.environ.get("HF_ENDPOINT") or None,
        )
    except Exception:  # the library's error tree: for `plan`, the size is just not known
        return None
    sizes = [getattr(f, "file_size", None) for f in listing]
    return sum(sizes) if sizes and None not in sizes else None  # type: ignore[arg-type]
