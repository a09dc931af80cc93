"""Who gets in: API keys, the safe default bind, limits, and random input."""

from __future__ import annotations

import http.client
import json
import os
import signal
from pathlib import Path
from typing import Any

from harness.rawhttp import leaked
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

# No hex and no common word: a 6-character run of these cannot appear anywhere by chance.
KEY = "sk-Qz7WvKpLmRtYuXnJhGd3"
OTHER = "sk-Vb8NcXeRwTqPoIuYtLk2"


def _keyfile(reconcile: Any, *keys: str, mode: int = 0o600) -> Path:
    path = reconcile.tmp / "keys.txt"
    path.write_text("# gateway keys\n\n" + "\n".join(keys) + "\n")
    os.chmod(path, mode)
    return path


def test_keys_required_both_forms_healthz_open_and_sighup(reconcile: Any, gateway: Any) -> None:
    reconcile.write("alpha")
    keys = _keyfile(reconcile, KEY)
    g = gateway("--api-keys", str(keys), "--metrics-port", str(reconcile.port + 14))
    g.wait_phase("alpha", "Ready")
    assert g.request("GET", "/healthz").status == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": OTHER}):
        answer = g.post("alpha", headers)
        assert answer.status == 401, answer
        assert answer.json()["error"]["code"] == "invalid_api_key"
        # RFC 9110 15.5.2: a 401 says how to authenticate (it came without a challenge)
        assert answer.headers.get("WWW-Authenticate") == "Bearer", answer.headers
        assert KEY not in answer.body.decode() and OTHER not in answer.body.decode()
    assert g.request("GET", "/v1/models").status == 401
    assert g.post("alpha", {"Authorization": f"Bearer {KEY}"}).status == 200
    assert g.post("alpha", {"x-api-key": KEY}).status == 200
    # SIGHUP: a new key in, the old one out
    _keyfile(reconcile, OTHER)
    g.proc.send_signal(signal.SIGHUP)
    reconcile.wait_for(
        lambda: g.post("alpha", {"x-api-key": OTHER}).status == 200, what="the new key"
    )
    assert g.post("alpha", {"x-api-key": KEY}).status == 401
    import urllib.request

    from controller.store.config import accesstoken

    token = accesstoken.read(reconcile.state)  # /metrics wants the state dir's token
    url = f"http://127.0.0.1:{reconcile.port + 14}/metrics?token={token}"
    metrics = urllib.request.urlopen(url).read()
    text = metrics.decode()
    assert "reconcile_gateway_requests_total" in text
    assert 'reconcile_gateway_request_seconds_bucket{deployment="alpha"' in text
    status = reconcile("status", "-o", "json", check=0).out
    g.finish()
    # No 6-character run of a key anywhere (a label made of its head would show): state
    # dir (records, events, activations), daemon output, status, metrics.
    outputs = {"daemon log": g.text(), "metrics": text, "status": status}
    for path in reconcile.state.rglob("*"):
        if path.is_file():
            outputs[str(path)] = path.read_bytes().decode("latin-1")
    for where, said in outputs.items():
        assert not leaked(said, [KEY, OTHER]), (where, leaked(said, [KEY, OTHER]))


def test_a_restarted_daemon_applies_the_key_file_to_the_gateway_it_adopts(
    reconcile: Any, gateway: Any
) -> None:
    """A key revoked in the file, then the daemon restarted (systemctl restart): the
    gateway it adopts (same flags) takes the file as it is now. It went on accepting the
    revoked key, and refusing the new one, until a SIGHUP."""
    reconcile.write("alpha")
    keys = _keyfile(reconcile, KEY)
    g = gateway("--api-keys", str(keys))
    g.wait_phase("alpha", "Ready")
    assert g.post("alpha", {"x-api-key": KEY}).status == 200
    serving = g.serving().ref.pid
    assert g.stop() == 0  # the daemon ends; its gateway serves on
    _keyfile(reconcile, OTHER)  # KEY revoked
    g = gateway("--api-keys", str(keys))
    try:
        reconcile.wait_for(lambda: "gateway adopted" in g.text(), what="the gateway adopted")
        reconcile.wait_for(
            lambda: g.post("alpha", {"x-api-key": OTHER}).status == 200, what="the new key"
        )
        assert g.post("alpha", {"x-api-key": KEY}).status == 401
        assert g.serving().ref.pid == serving  # adopted, not replaced
    finally:
        g.finish()


def test_refusals_at_start(reconcile: Any) -> None:
    loose = _keyfile(reconcile, KEY, mode=0o644)
    port = str(reconcile.port + 15)
    result = reconcile("--listen", port, "--api-keys", str(loose), check=64)
    assert str(loose) in result.err and "0644" in result.err
    result = reconcile("--listen", port, "--api-keys", str(reconcile.tmp / "none"), check=64)
    assert "no such file" in result.err
    empty = reconcile.tmp / "empty"
    empty.write_text("# nothing\n")
    empty.chmod(0o600)
    assert "no key" in reconcile("--listen", port, "--api-keys", str(empty), check=64).err
    # A folder, or a file that is not text (a key saved as DER...): what it is, not errno's
    # "[Errno 21] Is a directory: '...'" nor the decoder's message.
    result = reconcile("--listen", port, "--api-keys", str(reconcile.tmp), check=64)
    assert f"--api-keys {reconcile.tmp} is a folder" in result.err
    assert "Errno" not in result.err
    binary = reconcile.tmp / "keys.der"
    binary.write_bytes(b"sk-\xff\xfe\x00\n")
    binary.chmod(0o600)
    result = reconcile("--listen", port, "--api-keys", str(binary), check=64)
    assert f"--api-keys {binary}: byte 3 is not UTF-8 text" in result.err
    assert "codec" not in result.err
    result = reconcile("--listen", f"0.0.0.0:{port}", check=64)
    assert "--api-keys" in result.err and "--insecure-listen" in result.err


def test_a_key_no_header_can_carry_is_refused_by_its_line(reconcile: Any, gateway: Any) -> None:
    """A key with a non-ASCII letter could never match (headers come as latin-1, keys were
    hashed as UTF-8): refused at start (64) with its file and line, never the key, and at
    SIGHUP the keys in force are kept."""
    port = str(reconcile.port + 15)
    accented = "sk-Qz7WvKpLmRtYuXnJhGdé"
    path = _keyfile(reconcile, KEY, accented)  # lines 1-2 are the comment and a blank
    result = reconcile("--listen", port, "--api-keys", str(path), check=64)
    assert f"--api-keys {path} line 4: the key holds a character no HTTP header" in result.err
    assert not leaked(result.err, [accented]), result.err
    reconcile.write("alpha")
    _keyfile(reconcile, KEY)
    g = gateway("--api-keys", str(path))
    try:
        g.wait_phase("alpha", "Ready")
        _keyfile(reconcile, OTHER, accented)
        g.proc.send_signal(signal.SIGHUP)
        said = "API keys not reloaded; keeping the old ones"
        reconcile.wait_for(lambda: said in g.text(), what="the reload refused")
        assert "line 4" in g.text() and not leaked(g.text(), [accented])
        assert g.post("alpha", {"x-api-key": KEY}).status == 200
        assert g.post("alpha", {"x-api-key": OTHER}).status == 401
    finally:
        g.finish()


def test_insecure_listen_warns_and_serves(reconcile: Any, gateway: Any) -> None:
    port = reconcile.port + 15
    g = gateway("--listen", f"0.0.0.0:{port}", "--insecure-listen", port=port)
    assert "insecure gateway" in g.text()
    g.finish()


def test_429_when_inflight_and_queue_are_full(reconcile: Any, gateway: Any) -> None:
    # A 12 s stream holds the only slot: room for a loaded box to see the 429 meanwhile.
    # The client hangs up once it has: the slot is freed then, not when the stream ends.
    reconcile.write("busy", command=reconcile.demo_command(chunks="40", chunk_delay="0.3"))
    g = gateway("--max-inflight", "1", "--max-queue", "0")
    g.wait_phase("busy", "Ready")
    body = {"model": "busy", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    holder = http.client.HTTPConnection("127.0.0.1", g.port, timeout=30)
    try:
        holder.request("POST", "/v1/chat/completions", json.dumps(body).encode())
        assert holder.getresponse().status == 200  # its head came: it holds the slot
        reconcile.wait_for(
            lambda: (a := g.post("busy")).status == 429 and "Retry-After" in a.headers,
            timeout=12,
            what="a 429",
        )
    finally:
        holder.close()  # the gateway sees the client gone at its next chunk
    reconcile.wait_for(lambda: g.post("busy").status == 200, timeout=30, what="the slot freed")
    g.finish()


def test_random_input_never_a_gateway_5xx(reconcile: Any, gateway: Any) -> None:
    g = gateway("--max-body", "2048")
    names = st.text(
        alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=":"),
        min_size=1,
        max_size=20,
    )
    values = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
    bodies = st.one_of(
        st.binary(max_size=3000),
        st.builds(lambda m: f'{{"model": {m!r}}}'.encode(), st.text(max_size=20)),
        st.just(b'{"model": 1}'),
        st.just(b"[]"),
    )

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        headers=st.dictionaries(names, values, max_size=5),
        body=bodies,
        path=st.sampled_from(["/v1/chat/completions", "/v1/x?y=1", "/v1/models", "/healthz"]),
        method=st.sampled_from(["POST", "GET", "PUT"]),
    )
    # Found in a flakes round: a lower-case `transfer-encoding` keeps http.client from
    # sizing the body, which the gateway then reads as chunks and finds broken mid-way;
    # its handler waited 120 s for the rest and `finish` (down --gateway) ran out of time.
    @example(
        headers={"transfer-encoding": "chunked"},
        body=b"not chunked",
        path="/v1/chat/completions",
        method="POST",
    )
    def check(headers: dict[str, str], body: bytes, path: str, method: str) -> None:
        headers.pop("Content-Length", None)
        headers.pop("Transfer-Encoding", None)
        try:
            answer = g.request(method, path, body, headers, timeout=10)
        except (OSError, ValueError):
            return  # http.client refused to send it
        assert answer.status < 500, answer

    check()
    assert g.proc.poll() is None
    g.finish()
