"""15. Routing that helps the engine (issue 41): time to first token on real llama.cpp
servers, ``affinity: prefix`` next to least in flight (``none``) and ``session``.

    python -m benchmarks --only routing     # ~1 minute on 2 cores (54 s, 2026-12-04)

Two replicas of one ``engine: llama-cpp`` deployment (the real ``llama-server`` from
``scripts/build-llama-server``, one thread each) behind ``reconcile --listen``, serving a
random-weight GGUF written here (tests/fixtures/tiny_gguf.py at larger sizes: ~2 s of
prompt processing for 2,000 tokens on these cores, so prefill dominates). Its vocabulary
has no merges from single letters up to words, so a prompt costs about one token per
character: the sizes below are in characters and tokens alike.

The workload, the same in every mode: ``families`` conversations, each with its own long
system prompt (random words) and ``turns`` user turns that grow the conversation (each
turn's answer joins the history), sent by ``clients`` concurrent clients, each taking the
family whose turn is next in line (``Line`` says why not its own families), with
``stream: true`` and a small ``max_tokens``; the OpenAI ``user`` field names the
family (what ``session`` keys on; ``none`` and ``prefix`` ignore it). Time to first
token is the client's time to the first SSE ``data:`` line.

One daemon runs a deployment per mode (named after its affinity, its own 2 engines), and
the modes run in turn: each mode's engines serve only its workload, so each starts cold,
and one start-up serves the three (~6 s for --quick, not ~18). Each engine's only prefix
cache is its slots: ``--cache-ram 0`` turns llama.cpp's RAM prompt cache off (here it
would hold every family on every replica: these KV caches are tiny, a real model's are
not), and ``--parallel`` is one replica's share of the families plus one, each slot with
context for a whole conversation, so one replica's share fits and all of them do not.

Rows, in one run: TTFT p50 and p95 of ``prefix`` over ``none`` (goal p50 ≤ 0.5x) and over
``session`` (goal: no worse); requests per replica, max over mean, per mode (goal ≤ 1.25,
from the gateway's request log); and the prompt tokens llama.cpp reports as cached
(``timings.cache_n`` in the last SSE chunk), summed per mode: the reason for the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import os
import random
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.common import (
    REPO,
    Row,
    Workspace,
    free_port_block,
    median,
    p95,
    reconcile_argv,
    run,
    stop,
    wait_for,
    workspace,
)

SECTION = "15. routing"
MODES = ("none", "prefix", "session")
WAIT = 120.0  # seconds for a replica's Ready, a request, the request log
TEMPLATE_TOKENS = 128  # the chat template's tokens around the system prompt (~90 seen)
TURN_TOKENS = 64  # the template's tokens per turn (the user's and the assistant's, ~60 seen)


@dataclass(frozen=True)
class Sizes:
    families: int
    turns: int
    clients: int
    system_chars: int  # ~ tokens (see the module docstring)
    user_chars: int
    max_tokens: int
    model: dict[str, int] = field(default_factory=dict)  # write_tiny_llama_gguf's sizes

    @property
    def slots(self) -> int:
        """One replica's share of the families (of 2 replicas), plus one."""
        return math.ceil(self.families / 2) + 1

    @property
    def slot_ctx(self) -> int:
        """Tokens one conversation reaches (an answer re-read as ~8 characters a token),
        rounded up to 256."""
        turn = self.user_chars + 8 * self.max_tokens + TURN_TOKENS
        need = self.system_chars + TEMPLATE_TOKENS + self.turns * turn
        return -(-need // 256) * 256


FULL = Sizes(8, 6, 4, 1500, 60, 4, {"n_embd": 256, "n_layer": 6, "n_head": 8, "n_ff": 704})
QUICK = Sizes(2, 2, 2, 200, 20, 2)  # the tiny model: checks that it all runs


@dataclass
class Answer:
    family: int
    turn: int
    ttft: float  # seconds to the first SSE data line
    cache_n: int  # prompt tokens llama.cpp took from its cache
    prompt_n: int  # prompt tokens it processed


@dataclass
class Mode:
    affinity: str
    answers: list[Answer]
    per_instance: Counter[str]
    lost: int  # the gateway's "engine connection lost" lines (a retry, maybe elsewhere)
    moves: int  # turns served by another replica than the family's turn before

    @property
    def ttfts(self) -> list[float]:
        return [a.ttft * 1000 for a in self.answers]

    @property
    def imbalance(self) -> float:
        counts = list(self.per_instance.values())
        return max(counts) / (sum(counts) / len(counts)) if counts else float("nan")


# -- the workload -----------------------------------------------------------------------------


def _text(rng: random.Random, chars: int) -> str:
    # numpy and gguf (the model's writer) load only when this section runs
    from tests.fixtures.tiny_gguf import WORDS

    words: list[str] = []
    while sum(len(w) + 1 for w in words) < chars:
        words.append(rng.choice(WORDS))
    return " ".join(words)


@dataclass
class Family:
    index: int
    messages: list[dict[str, str]]
    turns: list[str]  # the user's turns, in order


def families(sizes: Sizes, seed: int = 41) -> list[Family]:
    rng = random.Random(seed)  # the same prompts in every mode
    out = []
    for i in range(sizes.families):
        system = f"family {i}: " + _text(rng, sizes.system_chars)
        turns = [_text(rng, sizes.user_chars) for _ in range(sizes.turns)]
        out.append(Family(i, [{"role": "system", "content": system}], turns))
    return out


async def _ask(http: aiohttp.ClientSession, url: str, line: Line, fam: Family) -> Answer:
    turn = (len(fam.messages) - 1) // 2  # the system prompt, then a user and an answer
    fam.messages.append({"role": "user", "content": fam.turns[turn]})
    body = {
        "model": line.model,
        "messages": fam.messages,
        "max_tokens": line.sizes.max_tokens,
        "stream": True,
        # Asked, so the gateway passes the usage chunk on: llama.cpp puts `timings` there
        # when usage is asked for (the gateway asks for it and strips it otherwise).
        "stream_options": {"include_usage": True},
        "user": f"family-{fam.index}",
    }
    start = time.perf_counter()
    ttft: float | None = None
    text: list[str] = []
    timings: dict[str, Any] = {}
    seen: list[bytes] = []
    async with http.post(url, json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"the gateway answered {resp.status}: {await resp.text()}")
        async for raw in resp.content:
            seen = [*seen[-2:], raw] if raw.strip() else seen
            if not raw.startswith(b"data:"):
                continue
            if ttft is None:
                ttft = time.perf_counter() - start
            data = raw[5:].strip()
            if data == b"[DONE]":
                continue
            chunk = json.loads(data)
            for choice in chunk.get("choices") or ():
                text.append((choice.get("delta") or {}).get("content") or "")
            timings = chunk.get("timings") or timings
    if ttft is None or not timings:
        said = b"".join(seen).decode(errors="replace")[-1000:]
        raise RuntimeError(f"family {fam.index} turn {turn}: no timings in the stream: {said}")
    fam.messages.append({"role": "assistant", "content": "".join(text)})
    return Answer(fam.index, turn, ttft, int(timings["cache_n"]), int(timings["prompt_n"]))


@dataclass
class Line:
    """The families whose next turn may be sent, first come first served: after each
    answer its family goes back to the end while it has turns left. A client takes
    whichever family is next, never its own ones: a client that kept its conversations
    would be kept on one replica by least in flight itself (the replica that has just
    answered it has one request fewer), which no real crowd of users does (0 of 48
    turns moved replica under ``none`` when each client owned 2 families)."""

    ready: asyncio.Queue[Family | None]
    left: int  # turns not answered yet
    sizes: Sizes
    model: str  # the deployment asked for: the mode's

    def answered(self, fam: Family) -> None:
        self.left -= 1
        if len(fam.messages) < 1 + 2 * self.sizes.turns:
            self.ready.put_nowait(fam)
        if self.left == 0:
            for _ in range(self.sizes.clients):
                self.ready.put_nowait(None)


async def _client(http: aiohttp.ClientSession, url: str, line: Line) -> list[Answer]:
    out: list[Answer] = []
    while (fam := await line.ready.get()) is not None:
        out.append(await _ask(http, url, line, fam))
        line.answered(fam)
    return out


async def _workload(port: int, sizes: Sizes, model: str) -> list[Answer]:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    line = Line(asyncio.Queue(), sizes.families * sizes.turns, sizes, model)
    for fam in families(sizes):
        line.ready.put_nowait(fam)
    timeout = aiohttp.ClientTimeout(total=WAIT)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        done = await asyncio.gather(*(_client(http, url, line) for _ in range(sizes.clients)))
    return [a for answers in done for a in answers]


# -- the pool ---------------------------------------------------------------------------------


def llama_server() -> str:
    """The cached llama-server (``$LLAMA_SERVER``, as scripts/test exports, else
    scripts/build-llama-server's last line: minutes the first time, then at once)."""
    given = os.environ.get("LLAMA_SERVER")
    if given:
        return given
    proc = subprocess.run(
        [str(REPO / "scripts" / "build-llama-server")],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"scripts/build-llama-server failed (exit {proc.returncode}); the routing "
            f"benchmark needs llama-server. Its last words:\n{proc.stderr[-2000:]}"
        )
    return lines[-1]


def _manifest(sizes: Sizes, binary: str, model: Path, base_port: int, affinity: str) -> str:
    args = ["--threads", "1", "--parallel", str(sizes.slots)]
    args += ["--ctx-size", str(sizes.slots * sizes.slot_ctx), "--cache-ram", "0"]
    spec = {
        "engine": "llama-cpp",
        "model": str(model),
        "executable": binary,
        "args": args,
        "devices": {"count": 0},
        "replicas": 2,
        "affinity": affinity,
        "basePort": base_port,
        "stopGracePeriodSeconds": 2,
    }
    doc = {"apiVersion": "reconcile/v1", "kind": "Deployment", "metadata": {"name": affinity}}
    return json.dumps({**doc, "spec": spec}) + "\n"


def _ready(ws: Workspace, instance: str) -> bool:
    with contextlib.suppress(OSError, ValueError):
        rec = json.loads((ws.state / "instances" / f"{instance}.json").read_text())
        return bool(rec.get("phase") == "Ready")
    return False


@contextlib.contextmanager
def _pool(ws: Workspace, sizes: Sizes, binary: str, model: Path, base: int) -> Iterator[None]:
    """A daemon with its gateway on ``base`` and a deployment of 2 replicas per mode, named
    after its affinity, every replica Ready; down after. Each mode's engines serve only
    that mode's workload: each starts cold, and one start-up serves the three."""
    for i, mode in enumerate(MODES):
        port = base + 1 + 4 * i
        (ws.manifests / f"{mode}.yaml").write_text(_manifest(sizes, binary, model, port, mode))
    argv = [*reconcile_argv(), "--listen", str(base), "--resync", "1h", *ws.common()]
    with open(ws.root / "daemon.log", "wb") as log:
        daemon = subprocess.Popen(argv, env=ws.env(), stdin=subprocess.DEVNULL, stderr=log)
    try:
        for instance in (name for mode in MODES for name in (mode, f"{mode}@1")):
            wait_for(functools.partial(_ready, ws, instance), WAIT, f"{instance} Ready", 0.05)
        yield
    finally:
        stop(daemon, timeout=30)
        run([*reconcile_argv(), "down", "--gateway", *ws.common()], env=ws.env())


def _served(ws: Workspace, model: str, count: int) -> list[dict[str, Any]]:
    """The gateway's request log's lines for ``model``, once it holds ``count`` of them."""
    path = ws.state / "gateway" / "requests.jsonl"

    def lines() -> list[dict[str, Any]] | None:
        with contextlib.suppress(OSError):
            found = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            found = [x for x in found if x.get("deployment") == model]
            return found if len(found) >= count else None
        return None

    found: list[dict[str, Any]] = wait_for(lines, WAIT, "the request log", poll=0.05)
    return found


def _per_instance(model: str, log: list[dict[str, Any]]) -> Counter[str]:
    served = Counter({model: 0, f"{model}@1": 0})  # a replica that served none counts too
    served.update(str(line.get("instance")) for line in log)
    return served


def _moves(answers: list[Answer], log: list[dict[str, Any]]) -> int:
    """Turns served elsewhere than their family's turn before. The log names no family,
    but a prompt's token count (the log's from ``usage``, llama.cpp's cache_n + prompt_n)
    is nearly always unique here: a count seen twice is left out."""
    sizes = Counter(line.get("prompt_tokens") for line in log)
    where = {line.get("prompt_tokens"): line.get("instance") for line in log}
    last: dict[int, object] = {}
    moves = 0
    for a in sorted(answers, key=lambda a: a.turn):
        size = a.cache_n + a.prompt_n
        if sizes[size] != 1:
            last.pop(a.family, None)
            continue
        moves += a.family in last and last[a.family] != where[size]
        last[a.family] = where[size]
    return moves


def _lost(ws: Workspace, model: str) -> int:
    """The gateway's retries after a pooled engine connection was found closed."""
    count = 0
    for text in (ws.root / "daemon.log").read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            line = json.loads(text)
            count += (
                line.get("event") == "engine connection lost before its answer"
                and line.get("deployment") == model
            )
    return count


def _mode(ws: Workspace, sizes: Sizes, base: int, affinity: str) -> Mode:
    answers = asyncio.run(_workload(base, sizes, affinity))
    served = _served(ws, affinity, len(answers))
    per = _per_instance(affinity, served)
    return Mode(affinity, answers, per, _lost(ws, affinity), _moves(answers, served))


def bench(sizes: Sizes = FULL) -> list[Row]:
    from tests.fixtures.tiny_gguf import write_tiny_llama_gguf

    binary = llama_server()
    with workspace("routing") as ws:
        ws.devices = "none"
        model = write_tiny_llama_gguf(ws.root / "model.gguf", n_ctx=16384, **sizes.model)
        base = free_port_block(16, start=24700)
        with _pool(ws, sizes, binary, model, base):
            modes = {m: _mode(ws, sizes, base, m) for m in MODES}
    return _rows(sizes, modes)


# -- the table --------------------------------------------------------------------------------


def _rows(sizes: Sizes, modes: dict[str, Mode]) -> list[Row]:
    shape = (
        f"2 llama.cpp replicas, {sizes.families} families x {sizes.turns} turns, "
        f"{sizes.system_chars}-token system prompts, {sizes.clients} clients"
    )
    none, prefix, session = (modes[m] for m in MODES)
    rows = [
        _ttft("p50", prefix, none, "≤ 0.5x", 0.5, shape),
        _ttft("p95", prefix, none, "", None, shape),
        _ttft("p50", prefix, session, "≤ 1.0x", 1.0, shape),
        _ttft("p95", prefix, session, "", None, shape),
    ]
    for mode in modes.values():
        counts = "/".join(str(n) for _, n in sorted(mode.per_instance.items()))
        rows.append(
            Row(
                SECTION,
                f"requests per replica, max over mean, affinity: {mode.affinity} ({counts}; "
                f"turns on another replica than their family's turn before: {mode.moves}; "
                f"gateway retries after a lost engine connection: {mode.lost})",
                "x",
                [mode.imbalance],
                goal="≤ 1.25",
                met=mode.imbalance <= 1.25,
            )
        )
    for mode in modes.values():
        cached = sum(a.cache_n for a in mode.answers)
        total = cached + sum(a.prompt_n for a in mode.answers)
        longest = max(a.cache_n + a.prompt_n for a in mode.answers)
        rows.append(
            Row(
                SECTION,
                f"prompt tokens llama.cpp took from its cache (timings.cache_n), summed, "
                f"affinity: {mode.affinity} ({100 * cached / total:.0f}% of {total}; longest "
                f"prompt {longest} tokens, {sizes.slots} slots of {sizes.slot_ctx} a replica)",
                "tokens",
                [float(cached)],
            )
        )
    first = [a for m in modes.values() for a in m.answers if a.turn == 0]
    tokens = median([a.cache_n + a.prompt_n for a in first])
    rows.append(
        Row(
            SECTION,
            f"for scale: time to first token of a family's first turn (cold: {tokens:.0f} "
            f"prompt tokens; {sizes.clients} clients at once), every mode",
            "ms",
            [a.ttft * 1000 for a in first],
        )
    )
    return rows


def _ttft(stat: str, ours: Mode, theirs: Mode, goal: str, bound: float | None, shape: str) -> Row:
    pick = median if stat == "p50" else p95
    ratio = pick(ours.ttfts) / pick(theirs.ttfts)
    return Row(
        SECTION,
        f"time to first token, affinity: {ours.affinity} vs {theirs.affinity} "
        f"(ratio of {stat}s; {shape})",
        "ms",
        ours.ttfts,
        theirs.ttfts,
        f"affinity: {theirs.affinity}",
        goal,
        None if bound is None else ratio <= bound,
        ratio,
    )


if __name__ == "__main__":  # pragma: no cover
    for row in bench(QUICK):
        print(row)
