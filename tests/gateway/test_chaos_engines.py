"""Engines that misbehave (chaos_engine.py) behind the real daemon and its gateway
process: whatever an engine sends, the gateway's memory stays bounded, its client gets
an answer (or the engine's bytes as they come), and nothing is logged as a traceback."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai

from controller.gateway.accounting.requestlog import path_in

CHAOS = Path(__file__).with_name("chaos_engine.py")
GROWTH_MAX = 200 * 1024  # KiB a gateway may grow by here (each fault below took GBs)


def chaos(*extra: str) -> list[str]:
    return [sys.executable, str(CHAOS), "--port", "{port}", *extra]


def kib(pid: int, field: str) -> int:
    """``VmRSS`` or ``VmHWM`` (the peak) of a process, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def engine_log(reconcile: Any, instance: str) -> str:
    path: Path = reconcile.state / "instances" / "logs" / f"{instance}.log"
    return path.read_text() if path.is_file() else ""


def no_traceback(g: Any) -> None:
    text = g.text()
    assert "Traceback" not in text and '"level": "error"' not in text, text[-3000:]


def test_a_chunk_whose_size_never_ends_is_passed_on_in_pieces_in_bounded_memory(
    reconcile: Any, gateway: Any
) -> None:
    """A chunk was read whole before a byte of it went on: one whose size line said a
    terabyte grew the gateway by 4 GB in 20 s, while its client got nothing."""
    reconcile.write("c", command=chaos("--mode", "bigchunk"))
    g = gateway()
    g.wait_phase("c", "Ready")
    pid = g.serving().ref.pid
    before = kib(pid, "VmRSS")
    body = json.dumps({"model": "c", "prompt": "hi"}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
        "Content-Type: application/json\r\n\r\n"
    ).encode()
    want, got = 32 * 1024 * 1024, 0
    with socket.create_connection(("127.0.0.1", g.port), timeout=30) as sock:
        sock.sendall(head + body)
        deadline = time.monotonic() + 60
        while got < want and time.monotonic() < deadline:
            data = sock.recv(1 << 20)
            assert data, f"the gateway closed after {got} bytes"
            got += len(data)
    assert got >= want, f"{got} bytes of the endless chunk came in 60 s"
    grown = kib(pid, "VmHWM") - before
    assert grown < GROWTH_MAX, f"the gateway grew by {grown} KiB passing {got} bytes on"
    # The client's close ended the engine's answer (the gateway closed its connection).
    reconcile.wait_for(lambda: "closed after" in engine_log(reconcile, "c"), what="its end")
    assert g.request("GET", "/healthz").status == 200
    g.finish()
    no_traceback(g)


def test_an_engine_metrics_page_with_no_end_is_read_in_bounded_memory(
    reconcile: Any, gateway: Any
) -> None:
    """The engines' /metrics were read whole, for up to the read's 2 s: an endless page
    (chunked, or a Content-Length of a terabyte) grew the gateway by 500 MB every 5 s. A
    page is read up to 4 MiB, then its connection closed."""
    reconcile.write("huge", command=chaos("--metrics", "huge"))
    reconcile.write("vast", command=chaos("--metrics", "vast"))
    g = gateway()
    g.wait_phase("huge", "Ready")
    g.wait_phase("vast", "Ready")
    pid = g.serving().ref.pid
    before = kib(pid, "VmRSS")

    def ended(instance: str) -> int:
        return engine_log(reconcile, instance).count("closed after")

    # Two reads of each page begun and ended (every 5 s).
    reconcile.wait_for(lambda: min(ended("huge"), ended("vast")) >= 2, timeout=60, what="reads")
    grown = kib(pid, "VmHWM") - before
    assert grown < GROWTH_MAX, f"the gateway grew by {grown} KiB reading endless /metrics"
    assert g.post("huge").status == 200 and g.post("vast").status == 200
    g.finish()
    no_traceback(g)


def test_an_answer_that_is_no_http_is_a_502_that_says_so_and_its_replica_takes_the_rest(
    reconcile: Any, gateway: Any
) -> None:
    """An engine that answers bytes of another protocol, or a head of 100 KB, gave its
    client a 502 saying it "closed the connection before answering": its operator looked
    for a crash. The 502 says what it answered and where to look; three in a row eject it,
    and the healthy replica takes every request after."""
    said = {"garbage": "not an HTTP/1.x status line", "bighead": "an answer head over 65536"}
    for mode in said:
        reconcile.write(mode, replicas=2, command=chaos("--mode", mode, "--sick", mode))
    g = gateway()
    for mode in said:
        g.wait_phase(mode, "Ready")
        g.wait_phase(f"{mode}@1", "Ready")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{g.port}/v1", api_key="-", max_retries=0)
    with client:
        for mode, words in said.items():
            failed: list[openai.APIStatusError] = []
            for _ in range(60):
                try:
                    answer = client.completions.create(model=mode, prompt="hi", timeout=30)
                except openai.APIStatusError as exc:
                    failed.append(exc)
                    continue
                assert answer.system_fingerprint == f"{mode}@1", answer
                if len(failed) == 3:
                    break
            assert len(failed) == 3, failed  # then ejected: the replica takes the rest
            for exc in failed:
                assert exc.status_code == 502, exc
                assert f"the engine of '{mode}' gave no answer to pass on ({words}" in str(exc)
                assert f"`reconcile logs {mode}`" in str(exc), exc
            for _ in range(5):
                answer = client.completions.create(model=mode, prompt="hi", timeout=30)
                assert answer.system_fingerprint == f"{mode}@1", answer
    g.finish()
    no_traceback(g)


def test_an_engine_that_sends_interim_answers_for_ever_is_a_502_at_once(
    reconcile: Any, gateway: Any
) -> None:
    """Interim answers (1xx) were skipped for as long as they came: an engine that sent
    ``100 Continue`` for ever held its client for good and took a core of the gateway's.
    Past five (Go's client's bound) it is a 502 that says so."""
    reconcile.write("c", command=chaos("--mode", "interim"))
    g = gateway()
    g.wait_phase("c", "Ready")
    proc = subprocess.run(
        [
            "curl",
            "-sS",
            "--max-time",
            "60",
            "-d",
            json.dumps({"model": "c", "prompt": "hi"}),
            f"http://127.0.0.1:{g.port}/v1/completions",
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc  # 28: curl's own timeout, the gateway still silent
    error = json.loads(proc.stdout)["error"]
    assert error["code"] == "upstream_error", error
    assert "gave no answer to pass on (more than 5 interim (1xx) answers)" in error["message"]
    g.finish()
    no_traceback(g)


def test_a_stream_of_crlf_events_reaches_its_client_as_it_comes_and_is_counted(
    reconcile: Any, gateway: Any
) -> None:
    """Events whose lines end CRLF (the SSE spec allows it; sse-starlette, llama-cpp-python's
    server's, writes them) have no LF LF: a stream for which the gateway had asked the usage
    chunk was held whole until its end (its client got nothing meanwhile), and its tokens
    were never counted. Each event goes on as it comes, the usage chunk is taken out, and
    its tokens are in the request log."""
    go: Path = reconcile.tmp / "go"
    reconcile.write("c", command=chaos("--mode", "crlf", "--go", str(go)))
    g = gateway()
    g.wait_phase("c", "Ready")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{g.port}/v1", api_key="-", max_retries=0)
    with client:
        hi = [{"role": "user", "content": "hi"}]
        stream = client.chat.completions.create(model="c", messages=hi, stream=True, timeout=30)
        chunks = iter(stream)
        first = next(chunks)  # the engine sends no more until `go` exists
        assert first.choices[0].delta.content == "one", first
        go.touch()
        rest = list(chunks)
    assert [c.choices[0].delta.content for c in rest] == ["two"], rest  # no usage chunk
    log = path_in(reconcile.state)
    line = reconcile.wait_for(lambda: log.is_file() and log.read_text(), what="the log line")
    said = json.loads(line.splitlines()[0])
    assert (said["prompt_tokens"], said["completion_tokens"]) == (3, 2), said
    g.finish()
    no_traceback(g)


def test_an_engine_that_sends_trailers_for_ever_has_its_answer_cut(
    reconcile: Any, gateway: Any
) -> None:
    """A chunked answer's trailer fields were read and dropped for as long as they came: an
    engine that sent them for ever held its client for good (its body had come, but not
    its end). Past 64 KiB of them the answer is cut, as any engine's failure mid-answer."""
    reconcile.write("c", command=chaos("--mode", "trailers"))
    g = gateway()
    g.wait_phase("c", "Ready")
    proc = subprocess.run(
        [
            "curl", "-sS", "--max-time", "60", "-d", json.dumps({"model": "c", "prompt": "hi"}),
            f"http://127.0.0.1:{g.port}/v1/completions",
        ],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    # 18: "transfer closed with outstanding read data remaining" (28: its own timeout)
    assert proc.returncode == 18 and proc.stdout == "{}", proc
    g.finish()
    text = g.text()
    assert "trailers over 65536 bytes" in text, text[-3000:]
    no_traceback(g)


def test_uploads_past_the_body_limit_are_the_clients_413_and_eject_no_engine(
    reconcile: Any, gateway: Any
) -> None:
    """A chunked upload (no Content-Length) that outgrew --max-body while streaming was
    the engine's failure: a 502 saying it closed the connection, and three in a row
    ejected the healthy engine, so every client got 503s for 30 s (a client's doing,
    again at will). It is the client's 413, naming the limit, and the engine serves on."""
    echo = Path(__file__).with_name("echo_engine.py")
    reconcile.write("e", command=[sys.executable, str(echo), "--port", "{port}", "--model", "e"])
    g = gateway("--max-body", "200000")
    g.wait_phase("e", "Ready")
    mark = b"b0undary7Qz"
    form = (
        b'--%s\r\nContent-Disposition: form-data; name="model"\r\n\r\ne\r\n--%s\r\n'
        b'Content-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
    ) % (mark, mark)
    head = (
        b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: multipart/form-data; boundary=%s\r\nTransfer-Encoding: chunked\r\n\r\n"
    ) % mark
    # A little past the limit: what the 413 leaves unread, its linger reads in time.
    pieces = [form] + [b"x" * 65536] * 4 + [b"\r\n--%s--\r\n" % mark]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", g.port), timeout=30) as sock:
            sock.sendall(head)
            with contextlib.suppress(ConnectionError):  # answered before the body's end
                sock.sendall(chunked)
            answer = b""
            while data := sock.recv(65536):
                answer += data
        status, _, body = answer.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 413 "), answer[:500]
        error = json.loads(body)["error"]
        assert error["code"] == "request_too_large", error
        assert "limit of 200000 bytes" in error["message"] and "--max-body" in error["message"]
    assert g.post("e").status == 200  # not ejected
    g.finish()
    assert "instance ejected" not in g.text()
    no_traceback(g)
