"""Token and latency metrics, and the key file's per-key limits, through the real daemon,
gateway process and an echo engine whose every answer's ``usage`` says 7 prompt and 5
completion tokens (``echo_engine.py``).

- the counters equal the engine's ``usage``, streamed and not; a stream whose client
  said nothing of ``stream_options`` is asked for usage and its usage chunk is taken
  out; a client that asked for it gets its body sent byte for byte and the chunk;
- a key over its ``rpm=`` (or ``tpm=``) gets 429, an OpenAI body and ``Retry-After``,
  while another key is served.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import urllib.request
from pathlib import Path
from typing import Any

from echo_engine import COMPLETION_TOKENS, PROMPT_TOKENS
from prometheus_client.parser import text_string_to_metric_families

from controller.store.config import accesstoken

ECHO = Path(__file__).with_name("echo_engine.py")
KEY = "sk-Qz7WvKpLmRtYuXnJhGd3"  # no hex, no word (see test_keys.py)
OTHER = "sk-Vb8NcXeRwTqPoIuYtLk2"
THIRD = "sk-Hj4MnBvCxZaSdFgQwEr9"


def label(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def start(reconcile: Any, gateway: Any, *lines: str) -> Any:
    command = [sys.executable, str(ECHO), "--port", "{port}", "--model", "{name}"]
    reconcile.write("alpha", command=command)
    keys = reconcile.tmp / "keys.txt"
    keys.write_text("\n".join(lines) + "\n")
    os.chmod(keys, 0o600)
    g = gateway("--api-keys", str(keys), "--metrics-port", str(reconcile.port + 14))
    g.wait_phase("alpha", "Ready")
    return g


def chat(g: Any, key: str, **extra: Any) -> tuple[Any, bytes]:
    body = json.dumps({"model": "alpha", "messages": [{"role": "user", "content": "hi"}], **extra})
    raw = body.encode()
    return g.request("POST", "/v1/chat/completions", raw, {"x-api-key": key}), raw


def events(data: bytes) -> list[Any]:
    out = []
    for event in data.split(b"\n\n"):
        if event.startswith(b"data: ") and event != b"data: [DONE]":
            out.append(json.loads(event[6:]))
    return out


def samples(port: int, state: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    token = accesstoken.read(state)  # /metrics wants the state dir's token
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics?token={token}").read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def test_token_counters_equal_the_engines_usage(reconcile: Any, gateway: Any) -> None:
    g = start(reconcile, gateway, KEY)
    for _ in range(2):
        answer, _ = chat(g, KEY)
        assert answer.status == 200 and answer.json()["usage"]["prompt_tokens"] == PROMPT_TOKENS
    # Said nothing: asked for usage by the gateway, its chunk not shown.
    for _ in range(2):
        answer, _ = chat(g, KEY, stream=True)
        chunks = events(answer.body)
        assert answer.status == 200 and answer.body.endswith(b"data: [DONE]\n\n"), answer
        assert all(c["choices"] for c in chunks) and len(chunks) == 3, chunks
        sent = chunks[0]["echo"]["body"]
        assert sent["stream_options"] == {"include_usage": True}
    # Asked for it: the body reaches the engine as sent, the usage chunk comes back.
    answer, raw = chat(g, KEY, stream=True, stream_options={"include_usage": True})
    chunks = events(answer.body)
    assert chunks[0]["echo"]["sha256"] == hashlib.sha256(raw).hexdigest()
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    # Said no: no usage, nothing counted.
    answer, raw = chat(g, KEY, stream=True, stream_options={"include_usage": False})
    assert all(c["choices"] for c in events(answer.body))
    embedded = g.request(
        "POST", "/v1/embeddings", {"model": "alpha", "input": "hi"}, {"x-api-key": KEY}
    )
    assert embedded.status == 200, embedded
    counted = 2 + 2 + 1 + 1  # answers whose usage the engine sent
    found = samples(reconcile.port + 14, reconcile.state)
    who = (("deployment", "alpha"), ("key", label(KEY)))
    prompt = found[("reconcile_gateway_tokens_total", (*who, ("kind", "prompt")))]
    completion = found[("reconcile_gateway_tokens_total", (*who, ("kind", "completion")))]
    assert (prompt, completion) == (counted * PROMPT_TOKENS, counted * COMPLETION_TOKENS)
    first = found[
        ("reconcile_gateway_time_to_first_token_seconds_count", (("deployment", "alpha"),))
    ]
    assert first == 7  # every forwarded answer
    g.finish()


def test_a_key_over_its_limits_gets_429_with_retry_after(reconcile: Any, gateway: Any) -> None:
    g = start(reconcile, gateway, f"{KEY}  rpm=3", OTHER, f"{THIRD} tpm=10  # batch jobs")
    for _ in range(3):
        assert chat(g, KEY)[0].status == 200
    over, _ = chat(g, KEY)
    assert over.status == 429, over
    error = over.json()["error"]
    assert (error["code"], error["type"]) == ("rate_limit_exceeded", "rate_limit_error")
    assert "3 requests per minute" in error["message"] and KEY not in error["message"]
    assert int(over.headers["Retry-After"]) >= 1
    assert chat(g, OTHER)[0].status == 200  # another key is not held back
    # tpm: the first answer's 12 tokens are past 10; the next request waits for the refill.
    assert chat(g, THIRD)[0].status == 200
    held, _ = chat(g, THIRD)
    assert held.status == 429 and "10 tokens per minute" in held.json()["error"]["message"]
    assert int(held.headers["Retry-After"]) >= 1
    g.finish()


def test_a_reload_of_the_key_file_gives_no_key_a_fresh_minute(reconcile: Any, gateway: Any) -> None:
    """A key at its limit is still at it after a SIGHUP re-read the key file (another key
    added). (Every reload built the buckets afresh: any `kill -HUP`, `systemctl reload` or
    daemon restart, which has the gateway it adopts re-read the file, gave every key a
    full minute again.) A limit lowered in the same edit holds at once. ``rpm=1`` refills
    in 60 s, longer than the reload's wait may take."""
    g = start(reconcile, gateway, f"{KEY}  rpm=1", f"{THIRD} rpm=50")
    keys = reconcile.tmp / "keys.txt"
    try:
        assert chat(g, KEY)[0].status == 200
        for _ in range(3):
            assert chat(g, THIRD)[0].status == 200
        assert chat(g, KEY)[0].status == 429
        keys.write_text(f"{KEY}  rpm=1\n{THIRD} rpm=1\n{OTHER}\n")
        g.proc.send_signal(signal.SIGHUP)  # the daemon forwards it to its gateway
        reconcile.wait_for(lambda: chat(g, OTHER)[0].status == 200, what="the reload")
        assert chat(g, KEY)[0].status == 429, "a reload refilled the key's minute"
        # THIRD used 3 of its 50; lowered to 1 it holds 1, not 47: one goes, the next waits
        assert chat(g, THIRD)[0].status == 200
        assert chat(g, THIRD)[0].status == 429
    finally:
        g.finish()


def test_a_bad_limit_in_the_key_file_is_refused_at_start(reconcile: Any) -> None:
    keys = reconcile.tmp / "keys.txt"
    keys.write_text(f"# team keys\n{KEY} rpm=60\n{OTHER} rpm=lots\n")
    os.chmod(keys, 0o600)
    result = reconcile("--listen", str(reconcile.port + 15), "--api-keys", str(keys), check=64)
    assert f"{keys} line 3: rpm= after the key is not a limit" in result.err, result.err
    assert OTHER not in result.err and KEY not in result.err
