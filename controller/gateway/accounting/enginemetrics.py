"""The engines' own load signals, read from their Prometheus ``/metrics``.

In-flight counts and GPU use are poor signals for an LLM engine (llm-d's autoscaling
guide): what says an engine is saturated is its own queue (requests waiting for a batch
slot) and its KV cache's fill. Each engine names them its own way (checked against each
engine's source at the version its recipe pins, docs/design.md "Engine flags checked"):

=========  ==================================================  ===========================
engine     waiting                                             KV cache used (0..1)
=========  ==================================================  ===========================
vLLM       ``vllm:num_requests_waiting``                       ``vllm:kv_cache_usage_perc``
                                                               (``gpu_cache_usage_perc``
                                                               before 0.9.2; hidden from
                                                               0.11, removal due in 0.12)
SGLang     ``sglang:num_queue_reqs`` (``--enable-metrics``)    ``sglang:token_usage``
llama.cpp  ``llamacpp:requests_deferred`` (``--metrics``)      ``llamacpp:kv_cache_usage_ratio``
TGI        ``tgi_queue_size``                                  (none)
=========  ==================================================  ===========================

vLLM 0.11.0: ``vllm/v1/metrics/loggers.py``. SGLang 0.5.19:
``python/sglang/srt/observability/metrics_collector.py``. TGI v3.3.5:
``backends/v3/src/queue.rs`` (served on the API port's ``/metrics`` too, not only on
``--prometheus-port``).

llama.cpp's KV cache series is gone from recent builds (the one ``scripts/build-llama-server``
pins states none, ``tests/engines/test_llama_health.py``): such an engine states only
its queue, and ``autoscale.metric: kvCache`` falls back to in flight for it.

Two engines state how many tokens their KV cache holds, which sizes prefix routing's
index of that engine (routing/prefix.py): vLLM in ``vllm:cache_config_info``'s labels
(``num_gpu_blocks`` x ``block_size``, its ``CacheConfig.metrics_info``), SGLang as
``sglang:max_total_num_tokens`` (summed over data parallel ranks, each with its own
pool; a pool's tensor parallel ranks state it once each). llama.cpp and TGI state none.

``parse`` is pure: a sample of several label sets (one per model served, one per data
parallel rank) sums the waiting and takes the fullest cache. A sample with a non-empty
``priority`` label is skipped: SGLang with ``--enable-priority-scheduling`` states its
queue's total under ``priority=""`` and again split by priority (``_log_gauge_queue_count``
in SGLang 0.5.19's ``metrics_collector.py``), so summing every label set counted each
waiting request twice.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from controller.core.manifest.names import base_name, instance_of
from controller.core.state import Phase, Record
from controller.host.probes import connect_host
from controller.logsetup import get_logger

log = get_logger("reconcile")

EVERY = 5.0  # seconds between reads of an engine's /metrics
TIMEOUT = 2.0  # seconds one read may take (an engine busy with a prefill may be slow)

WAITING = (
    "vllm:num_requests_waiting",
    "sglang:num_queue_reqs",
    "llamacpp:requests_deferred",
    "tgi_queue_size",
)
KV_CACHE = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
    "llamacpp:kv_cache_usage_ratio",
)
CACHE_TOKENS = "sglang:max_total_num_tokens"
CACHE_INFO = "vllm:cache_config_info"
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
# GET (host, port, path) of an engine: its status and, of a 200, its text; None when no
# whole answer came (surface/routes.py gives the gateway's own client: http/upstream.py).
Fetch = Callable[[str, int, str], Awaitable[tuple[int, str] | None]]
# A label that splits a total stated beside it (SGLang's queue by priority).
BREAKDOWN = re.compile(r'(?:^|,)\s*priority="(?:[^"\\]|\\.)+"')


@dataclass(frozen=True, slots=True)
class EngineLoad:
    waiting: float | None  # requests the engine holds in its queue (None: it says not)
    kv_cache: float | None  # its KV cache's fill, 0..1 (None: it says not)
    cache_tokens: float | None = None  # tokens its KV cache holds (None: it says not)


def parse(text: str) -> EngineLoad:
    """The load an engine's Prometheus text states (see the module's docstring)."""
    waiting: float | None = None
    kv: float | None = None
    tokens: float | None = None
    pools: dict[str, float] = {}  # SGLang's data parallel rank -> its pool's tokens
    for line in text.splitlines():
        found = _sample(line)
        if found is None:
            continue
        name, labels, value = found
        if BREAKDOWN.search(labels):
            continue  # a part of a total this text states too
        if name in WAITING:
            waiting = (waiting or 0.0) + value
        elif name in KV_CACHE:
            kv = max(kv or 0.0, min(1.0, max(0.0, value)))
        elif name == CACHE_TOKENS and value > 0:
            rank = dict(_LABEL.findall(labels)).get("dp_rank", "")  # its tensor ranks: one pool
            pools[rank] = max(pools.get(rank, 0.0), value)
        elif name == CACHE_INFO and value > 0:
            tokens = _info_tokens(labels) or tokens
    return EngineLoad(waiting, kv, sum(pools.values()) if pools else tokens)


def _info_tokens(labels: str) -> float | None:
    """vLLM's cache size in tokens, from its cache_config_info's labels."""
    found = dict(_LABEL.findall(labels))
    try:
        tokens = float(found["num_gpu_blocks"]) * float(found["block_size"])
    except (KeyError, ValueError):  # "None" before the engine has profiled its memory
        return None
    return tokens if math.isfinite(tokens) and tokens > 0 else None


def _sample(line: str) -> tuple[str, str, float] | None:
    """``name{labels} value [timestamp]`` -> (name, labels, value); None for comments,
    others."""
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    brace = line.find("{")
    labels = ""
    if brace >= 0:
        end = line.rfind("}")
        name, labels, rest = line[:brace], line[brace + 1 : end], line[end + 1 :]
    else:
        name, _, rest = line.partition(" ")
    parts = rest.split()
    if not parts:
        return None
    try:
        value = float(parts[0])
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    return name.strip(), labels, value


class EngineMetricsReader:
    """Reads every Ready engine's ``/metrics`` every ``EVERY`` seconds, off the request
    path, each read bounded by ``TIMEOUT``; an engine that answers with none of the series
    above (no metrics, or an engine of another kind) is not asked again until it is
    another engine (a new nonce), and keeps ``inflight`` as its only signal (one that
    fails, 5xx or no answer in time, is asked again the next round). With no
    engine to ask, it sleeps until ``changed`` (the table's next update) says the records
    changed, then looks at once (an engine just Ready is read then, not a period later):
    an idle gateway wakes for none."""

    def __init__(
        self,
        fetch: Fetch,
        records: Callable[[], Iterable[Record]],
        loads: dict[tuple[str, str], EngineLoad],
        after: Callable[[dict[tuple[str, str], EngineLoad], float], Awaitable[None]] | None = None,
        changed: Callable[[], Awaitable[None]] | None = None,
        read: Callable[[str, EngineLoad], None] | None = None,
    ) -> None:
        self._fetch = fetch
        self._read_one = read  # given each engine's reading (nonce, load): routing
        self._records = records
        self.loads = loads  # (deployment, instance) -> its last reading (metrics.py shows it)
        self._after = after  # given each reading and its interval (the autoscaler's samples)
        self._changed = changed  # returns once the records changed (None: read every time)
        self._silent: set[str] = set()  # nonces whose engines state neither signal

    async def run(self, every: float = EVERY) -> None:
        while True:
            await self.once()
            if self._after is not None and self.loads:
                await self._after(dict(self.loads), every)
            # No await between the look and the wait: a change after it ends the wait.
            if self._changed is not None and not self._askable():
                await self._changed()
                continue  # what the change made Ready is read now, not a period later
            await asyncio.sleep(every)

    def _askable(self) -> list[Record]:
        return [r for r in self._records() if _readable(r) and r.nonce not in self._silent]

    async def once(self) -> None:
        ready = self._askable()
        found = await asyncio.gather(*(self._read(r) for r in ready))
        live = {r.nonce for r in self._records()}
        self._silent = {n for n in self._silent if n in live}
        fresh = {
            (base_name(r.name), instance_of(r.name)): load
            for r, load in zip(ready, found, strict=True)
            if load is not None
        }
        self.loads.clear()
        self.loads.update(fresh)
        if self._read_one is not None:
            for rec, load in zip(ready, found, strict=True):
                if load is not None and rec.nonce is not None:
                    self._read_one(rec.nonce, load)

    async def _read(self, rec: Record) -> EngineLoad | None:
        if rec.port is None:  # not _readable
            return None
        try:
            async with asyncio.timeout(TIMEOUT):
                answer = await self._fetch(connect_host(rec.host), rec.port, "/metrics")
        except TimeoutError:
            answer = None
        if answer is None or answer[0] >= 500:
            return None  # a slow, busy or failing engine: no reading this time, asked again
        status, text = answer
        if status in (401, 403):
            self._locked(rec, status)
            return None
        load = parse(text)
        if load.waiting is None and load.kv_cache is None and load.cache_tokens is None:
            if rec.nonce is not None:
                self._silent.add(rec.nonce)
            return None
        return load

    def _locked(self, rec: Record, status: int) -> None:
        """An engine whose /metrics is behind its own key (llama.cpp's ``--api-key`` covers
        it, seen on the built server): not asked again, and said once, as the deployment
        scales on requests in flight from now on, whatever ``autoscale.metric`` says."""
        if rec.nonce is not None:
            self._silent.add(rec.nonce)
        log.warning(
            "engine metrics refused: the engine's /metrics needs its own API key, so it"
            " is routed and scaled on requests in flight",
            deployment=rec.name,
            status=status,
            next="leave the engine's own --api-key off and keep the gateway's keys in"
            " front of it (the daemon's --api-keys FILE, or RECONCILE_API_KEYS)",
        )


def _readable(rec: Record) -> bool:
    return rec.phase is Phase.READY and rec.port is not None and rec.nonce is not None
