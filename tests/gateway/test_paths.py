"""Every OpenAI path and the neighbours clients send, each routed by its model, through
the real daemon and gateway process to two echo engines (``echo_engine.py``).

- JSON paths (chat, completions, embeddings, responses, rerank and /rerank, speech,
  images, Anthropic's messages with its headers) reach the engine of their model as
  sent; ``GET /v1/models/{id}`` is answered by the gateway; an unknown path is an
  OpenAI 404;
- multipart uploads (transcriptions, translations): the model from the form field, the
  file streamed; a 50 MB upload arrives whole while the gateway's memory stays flat;
- the official ``openai`` client: ``models.retrieve``, ``embeddings.create``,
  ``audio.transcriptions.create``, with a key.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psutil

ECHO = Path(__file__).with_name("echo_engine.py")
KEY = "sk-Qz7WvKpLmRtYuXnJhGd3"  # no hex, no word (see test_keys.py)
BIG = 50 * 1024 * 1024
PIECE = 1024 * 1024

JSON_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/rerank",
    "/rerank",
    "/v1/audio/speech",
    "/v1/images/generations",
    "/v1/messages",
)


def echoes(reconcile: Any, *names: str) -> None:
    for name in names:
        command = [sys.executable, str(ECHO), "--port", "{port}", "--model", "{name}"]
        reconcile.write(name, command=command)


def form(model: str, file: bytes, mark: str = "b0undary7Qz") -> tuple[bytes, dict[str, str]]:
    """A multipart body as the OpenAI clients send it: fields first, then the file."""
    head = (
        f'--{mark}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{model}\r\n'
        f'--{mark}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()
    tail = f"\r\n--{mark}--\r\n".encode()
    return head + file + tail, {"Content-Type": f"multipart/form-data; boundary={mark}"}


def test_every_path_is_routed_by_its_model(reconcile: Any, gateway: Any) -> None:
    echoes(reconcile, "alpha", "beta")
    g = gateway()
    g.wait_phase("alpha", "Ready")
    g.wait_phase("beta", "Ready")
    for i, path in enumerate(JSON_PATHS):
        model = ("alpha", "beta")[i % 2]
        body = {"model": model, "input": "hi", "n": i}
        extra = {"anthropic-version": "2023-06-01", "x-api-key": "theirs"}
        extra["Authorization"] = "Bearer the-engine's"  # e.g. vLLM's own --api-key
        answer = g.request("POST", f"{path}?q={i}", body, extra)
        assert answer.status == 200, (path, answer)
        said = answer.json()
        assert (said["engine"], said["path"], said["query"]) == (model, path, f"q={i}"), said
        assert said["body"] == body
        # Keys are off: the client's own Anthropic headers reach the engine untouched.
        assert said["headers"]["anthropic-version"] == "2023-06-01"
        assert said["headers"]["x-api-key"] == "theirs"
        assert said["headers"]["authorization"] == "Bearer the-engine's"
    for path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
        for model in ("alpha", "beta"):
            data, headers = form(model, os.urandom(300_000))
            answer = g.request("POST", path, data, headers)
            assert answer.status == 200, (path, answer)
            said = answer.json()
            assert (said["engine"], said["path"], said["text"]) == (
                model,
                path,
                f"heard by {model}",
            )
            assert said["sha256"] == hashlib.sha256(data).hexdigest()
    listed = g.request("GET", "/v1/models/beta")
    assert listed.status == 200 and listed.json()["id"] == "beta", listed
    for method, path, status, code in (
        ("GET", "/v1/models/nope", 404, "model_not_found"),
        ("GET", "/nope", 404, "not_found"),
        ("DELETE", "/v1/models/beta", 405, "method_not_allowed"),
    ):
        answer = g.request(method, path)
        assert answer.status == status and answer.json()["error"]["code"] == code, answer
    metrics = g.request("GET", "/metrics")  # where an engine serves them: say where ours are
    assert metrics.status == 404 and "--metrics-port" in metrics.json()["error"]["message"]
    root = g.request("GET", "/")  # an API client: where things are, the page among them
    assert root.status == 404 and "its web page is /ui" in root.json()["error"]["message"]
    browser = g.request("GET", "/?token=t0k", headers={"Accept": "text/html,*/*;q=0.8"})
    assert browser.status == 302 and browser.headers["Location"] == "/ui?token=t0k", browser
    conn = http.client.HTTPConnection("127.0.0.1", g.port, timeout=30)
    try:
        conn.request("GET", "/", headers={"Accept": "text/html"})
        assert conn.getresponse().reason == "Found"  # its status line said `302 Unknown`
    finally:
        conn.close()
    no_model, headers = form("", b"x")
    answer = g.request(
        "POST", "/v1/audio/transcriptions", no_model.replace(b"model", b"other"), headers
    )
    assert answer.status == 400 and "field `model`" in answer.json()["error"]["message"], answer
    g.finish()


def test_a_method_an_openai_path_does_not_serve_is_a_405(reconcile: Any, gateway: Any) -> None:
    """README: "any other path or method gets an OpenAI error body (404, 405)". A PUT to
    /v1/chat/completions was forwarded (the engine's HTML 501, a 5xx) and a GET got 400
    for its missing body: each is a 405 naming what the path serves, with ``Allow``,
    before any body is read. An engine's own /v1/... path still takes a GET."""
    echoes(reconcile, "alpha")
    g = gateway()
    g.wait_phase("alpha", "Ready")
    uploads = ("/v1/audio/transcriptions", "/v1/audio/translations")
    for path in (*JSON_PATHS, *uploads):
        for method in ("GET", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"):
            answer = g.request(method, path, {"model": "alpha", "input": "hi"})
            assert (answer.status, answer.headers.get("Allow")) == (405, "POST"), (method, path)
            if method != "HEAD":
                error = answer.json()["error"]
                assert error["code"] == "method_not_allowed", answer
                assert f"method {method} is not allowed on {path}" in error["message"]
    own = g.request("GET", "/v1/engine/own?q=1", {"model": "alpha"})  # routed by its body
    assert own.status == 200 and own.json()["method"] == "GET", own
    assert own.json()["path"] == "/v1/engine/own" and own.json()["query"] == "q=1", own
    logged = reconcile.state / "gateway" / "requests.jsonl"  # written off the request path
    reconcile.wait_for(lambda: logged.exists() and logged.read_text(), what="a line logged")
    statuses = [json.loads(line)["status"] for line in logged.read_text().splitlines()]
    assert statuses == [200], statuses  # the 405s reached no engine
    g.finish()


def test_a_50_mb_upload_is_streamed_with_flat_memory(reconcile: Any, gateway: Any) -> None:
    echoes(reconcile, "alpha")
    g = gateway("--max-body", str(64 * 1024 * 1024))
    g.wait_phase("alpha", "Ready")
    pid = g.serving().ref.pid
    upload(g.port, "alpha", 4 * PIECE)  # the first upload's buffers are not growth
    before = psutil.Process(pid).memory_info().rss
    said, sent = upload(g.port, "alpha", BIG)
    after = psutil.Process(pid).memory_info().rss
    assert said["bytes"] == len(sent) and said["sha256"] == hashlib.sha256(sent).hexdigest()
    grew = after - before
    assert grew < 16 * 1024 * 1024, f"the gateway grew {grew / 2**20:.1f} MiB for 50 MiB"
    g.finish()


def upload(port: int, model: str, size: int) -> tuple[dict[str, Any], bytes]:
    """POST a multipart upload of ``size`` random bytes, sent piece by piece with its
    Content-Length; the engine's echo and the whole body sent."""
    data, headers = form(model, os.urandom(size))

    def pieces() -> Iterator[bytes]:
        for at in range(0, len(data), PIECE):
            yield data[at : at + PIECE]

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(
            "POST",
            "/v1/audio/transcriptions",
            pieces(),
            {**headers, "Content-Length": str(len(data))},
        )
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    assert resp.status == 200, body[:300]
    said: dict[str, Any] = json.loads(body)
    return said, data


def test_the_openai_client_with_a_key(reconcile: Any, gateway: Any) -> None:
    echoes(reconcile, "alpha", "beta")
    # A Hugging Face name, as vLLM serves one: the client's models.retrieve sends its `/`
    # encoded (`org%2Fgamma-7b`), which got 400 `invalid_path` (a gateway trial's finding).
    command = [sys.executable, str(ECHO), "--port", "{port}", "--model", "{name}"]
    reconcile.write("gamma", command=command, model="org/gamma-7b")
    keys = reconcile.tmp / "keys.txt"
    keys.write_text(KEY + "\n")
    keys.chmod(0o600)
    g = gateway("--api-keys", str(keys))
    g.wait_phase("alpha", "Ready")
    g.wait_phase("beta", "Ready")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{g.port}/v1", api_key=KEY, max_retries=0)
    try:
        assert client.models.retrieve("alpha").id == "alpha"
        g.wait_phase("gamma", "Ready")
        assert client.models.retrieve("org/gamma-7b").id == "org/gamma-7b"
        with_missing = None
        try:
            client.models.retrieve("nope")
        except openai.NotFoundError as exc:
            with_missing = exc
        assert with_missing is not None and "does not exist" in str(with_missing)
        embedded = client.embeddings.create(model="beta", input="hi", encoding_format="float")
        assert embedded.model == "beta" and embedded.data[0].embedding == [0.0, 1.0]
        heard = client.audio.transcriptions.create(model="beta", file=("a.wav", b"RIFF" * 1000))
        assert heard.text == "heard by beta"
        # Anthropic's shape: x-api-key is the gateway's key here, kept from the engine.
        answer = g.request(
            "POST",
            "/v1/messages",
            {"model": "alpha", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
            {"x-api-key": KEY, "anthropic-version": "2023-06-01"},
        )
        assert answer.status == 200, answer
        said = answer.json()
        assert said["engine"] == "alpha" and "x-api-key" not in said["headers"]
        assert said["headers"]["anthropic-version"] == "2023-06-01"
        # ... and so is the bearer form: neither key header reaches an engine.
        answer = g.request(
            "POST",
            "/v1/messages",
            {"model": "alpha", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
            {"Authorization": f"Bearer {KEY}", "x-api-key": KEY},
        )
        assert answer.status == 200, answer
        shown = answer.json()["headers"]
        assert "authorization" not in shown and "x-api-key" not in shown, shown
    finally:
        client.close()
    g.finish()
