"""Large request bodies at once (issue 34: 6): the gateway holds at most
``--max-body-total`` bytes of them (each reserved before a byte is read), so a burst of
big bodies costs a bounded amount of memory; the rest wait, or get a 503 that says why.

The real gateway process, real sockets; its peak RSS is the kernel's (``VmHWM``).
"""

from __future__ import annotations

import http.client
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

MiB = 1024 * 1024
TOTAL = 32 * MiB  # --max-body-total here: one of these bodies at a time
BODY = 30 * MiB
CLIENTS = 20
# A body is in memory several times over while it is read, parsed and sent on (the read
# buffer and its bytes, the decoded text and the parsed prompt, the socket's send buffer):
# about 6 here. Past that nothing grows with the number of clients; without the cap these
# 20 grew it by 0.8 to 1.9 GB.
COPIES = 8


@pytest.mark.parametrize("chunked", [False, True])
def test_a_burst_of_large_bodies_holds_bounded_memory(
    reconcile: Any, gateway: Any, chunked: bool
) -> None:
    """Sized bodies reserve their length before a byte is read; chunked ones what arrived
    of them, as it arrives (one that outgrows the room left is a 503)."""
    reconcile.write("m")
    g = gateway("--max-body-total", str(TOTAL))
    g.wait_phase("m", "Ready")
    assert g.post("m").status == 200
    pid = g.serving().ref.pid
    before = _peak(pid)
    prompt = "x" * BODY
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}]})
    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(lambda _: _post(g.port, body.encode(), chunked), range(CLIENTS)))
    grew = _peak(pid) - before
    print(f"{CLIENTS} x {BODY // MiB} MiB bodies: gateway peak RSS grew {grew / MiB:.0f} MiB")
    assert all(status == 200 or (status, code) == (503, "server_busy") for status, code in answers)
    assert answers.count((200, None)) >= 1, answers
    assert grew < COPIES * TOTAL, f"peak RSS grew {grew / MiB:.0f} MiB"
    g.finish()


def _post(port: int, body: bytes, chunked: bool) -> tuple[int, str | None]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        if chunked:  # in 1 MiB chunks, with no Content-Length
            parts = (body[i : i + MiB] for i in range(0, len(body), MiB))
            conn.request("POST", "/v1/chat/completions", body=parts, encode_chunked=True)
        else:
            conn.request("POST", "/v1/chat/completions", body=body)
        answer = conn.getresponse()
        data = answer.read()
    finally:
        conn.close()
    code = json.loads(data)["error"]["code"] if answer.status != 200 else None
    return answer.status, code


def _peak(pid: int) -> int:
    """The process's peak resident set so far, in bytes (``VmHWM``)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def test_a_total_below_the_largest_body_is_refused(reconcile: Any) -> None:
    port = str(reconcile.port + 15)
    args = ("--listen", port, "--max-body", "2000", "--max-body-total", "1000")
    result = reconcile(*args, check=64)
    assert "--max-body-total 1000 is below --max-body 2000" in result.err, result.err
