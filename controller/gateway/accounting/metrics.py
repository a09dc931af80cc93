"""The gateway's Prometheus metrics, per deployment and per key label (never a key).

Updated on the gateway's event loop with no lock (a request pays a few dict updates);
read from other threads (the control socket's scrape, the web page) through snapshots:
``list(d.items())`` copies a dict in one step under the GIL, so a reader never sees one
change size under it. A histogram read mid-update is off by one request at most.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from controller.core.promtext import PromText
from controller.gateway.accounting.enginemetrics import EngineLoad

PREFIX = "reconcile_gateway_"
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
Labels = tuple[str, str]  # (deployment, key label)
Instance = tuple[str, str]  # (deployment, instance: its record's name)


class _Histogram:
    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, value)] += 1
        self.total += value
        self.n += 1


class GatewayMetrics:
    def __init__(self) -> None:
        self.requests: defaultdict[Labels, int] = defaultdict(int)
        self.errors: defaultdict[tuple[str, str, str], int] = defaultdict(int)
        self.inflight: defaultdict[Instance, int] = defaultdict(int)
        self.latency: dict[Labels, _Histogram] = {}
        self.tokens: defaultdict[tuple[str, str, str], int] = defaultdict(int)  # + kind
        self.first_token: dict[str, _Histogram] = {}  # per deployment
        self.swaps_avoided: defaultdict[str, int] = defaultdict(int)  # turns.py
        self.ejections: defaultdict[Instance, int] = defaultdict(int)  # passive health
        self.log_dropped = 0  # request log lines dropped (requestlog.py: queue full, disk)
        self.fallbacks: defaultdict[tuple[str, str, str], int] = defaultdict(int)  # routes.py
        self.engines: dict[Instance, EngineLoad] = {}  # the engines' own (enginemetrics.py)

    def begin(self, deployment: str, instance: str) -> None:
        """A request forwarded to ``instance`` (``web@1``) of ``deployment``."""
        self.inflight[(deployment, instance)] += 1

    def end(self, deployment: str, instance: str) -> None:
        self.inflight[(deployment, instance)] -= 1
        if self.inflight[(deployment, instance)] <= 0:  # a gone replica leaves no series
            del self.inflight[(deployment, instance)]

    def done(self, deployment: str, key: str, status: int, seconds: float) -> None:
        """One finished request (``deployment`` is ``-`` when no deployment was found)."""
        self.requests[(deployment, key)] += 1
        if status >= 400:
            self.errors[(deployment, key, f"{status // 100}xx")] += 1
        hist = self.latency.get((deployment, key))
        if hist is None:
            hist = self.latency[(deployment, key)] = _Histogram()
        hist.observe(seconds)

    def ejected(self, deployment: str, instance: str) -> None:
        """Passive health took ``instance`` out of the rotation (gateway/routing/health.py)."""
        self.ejections[(deployment, instance)] += 1

    def answered(
        self, deployment: str, key: str, first: float | None, prompt: int, completion: int
    ) -> None:
        """A forwarded answer's figures: seconds to its first byte, the tokens its
        ``usage`` counted (usage.py)."""
        if first is not None:
            hist = self.first_token.get(deployment)
            if hist is None:
                hist = self.first_token[deployment] = _Histogram()
            hist.observe(first)
        if prompt:
            self.tokens[(deployment, key, "prompt")] += prompt
        if completion:
            self.tokens[(deployment, key, "completion")] += completion

    def dropped(self, lines: int) -> None:
        """Request log lines not written (any thread: an int's += is one step here)."""
        self.log_dropped += lines

    def fell_back(self, model: str, to: str, reason: str) -> None:
        """A request for ``model`` went to its fallback ``to`` (routes.py)."""
        self.fallbacks[(model, to, reason)] += 1

    def swap_avoided(self, deployment: str) -> None:
        """Requests for ``deployment`` waited behind a rival's queue (turns.py)."""
        self.swaps_avoided[deployment] += 1

    def render(self) -> str:
        out = PromText()
        out.family(f"{PREFIX}requests_total", "Requests through the gateway.", "counter")
        for (dep, key), n in sorted(list(self.requests.items())):
            out.sample(f"{PREFIX}requests_total", n, deployment=dep, key=key)
        errors = "Answers with status 4xx or 5xx, by class."
        out.family(f"{PREFIX}errors_total", errors, "counter")
        for (dep, key, cls), n in sorted(list(self.errors.items())):
            out.sample(f"{PREFIX}errors_total", n, deployment=dep, key=key, **{"class": cls})
        ejections = "Times passive health ejected an instance (failures in a row)."
        out.family(f"{PREFIX}ejections_total", ejections, "counter")
        for (dep, instance), n in sorted(list(self.ejections.items())):
            out.sample(f"{PREFIX}ejections_total", n, deployment=dep, instance=instance)
        out.family(f"{PREFIX}inflight", "Requests being forwarded now, per instance.", "gauge")
        for (dep, instance), n in sorted(list(self.inflight.items())):
            out.sample(f"{PREFIX}inflight", n, deployment=dep, instance=instance)
        out.family(f"{PREFIX}request_seconds", "Time to the end of the answer.", "histogram")
        for (dep, key), hist in sorted(list(self.latency.items())):
            _histogram(out, f"{PREFIX}request_seconds", hist, deployment=dep, key=key)
        tokens = "Tokens the engines' usage counted, by kind (prompt, completion)."
        out.family(f"{PREFIX}tokens_total", tokens, "counter")
        for (dep, key, kind), n in sorted(list(self.tokens.items())):
            out.sample(f"{PREFIX}tokens_total", n, deployment=dep, key=key, kind=kind)
        first = "Time to the first byte of the answer (a stream's first token)."
        name = f"{PREFIX}time_to_first_token_seconds"
        out.family(name, first, "histogram")
        for dep, hist in sorted(list(self.first_token.items())):
            _histogram(out, name, hist, deployment=dep)
        avoided = "Times OnDemand requests waited for a rival's queue instead of a swap."
        out.family(f"{PREFIX}swaps_avoided_total", avoided, "counter")
        for dep, n in sorted(list(self.swaps_avoided.items())):
            out.sample(f"{PREFIX}swaps_avoided_total", n, deployment=dep)
        dropped = "Request log lines dropped: the writer fell behind or the disk failed."
        out.family(f"{PREFIX}request_log_dropped_total", dropped, "counter")
        out.sample(f"{PREFIX}request_log_dropped_total", self.log_dropped)
        fallbacks = "Requests sent to a fallback model, by why (not_ready, ejected, limit)."
        out.family(f"{PREFIX}fallbacks_total", fallbacks, "counter")
        for (model, to, reason), n in sorted(list(self.fallbacks.items())):
            out.sample(f"{PREFIX}fallbacks_total", n, model=model, to=to, reason=reason)
        self._render_engines(out)
        return "\n".join(out.lines) + "\n"

    def _render_engines(self, out: PromText) -> None:
        engines = sorted(list(self.engines.items()))
        waiting = "Requests waiting in the engine's own queue, as its /metrics says."
        name = "reconcile_engine_requests_waiting"
        out.family(name, waiting, "gauge")
        for (dep, instance), load in engines:
            if load.waiting is not None:
                out.sample(name, load.waiting, deployment=dep, instance=instance)
        kv = "The engine's KV cache in use, 0 to 1, as its /metrics says."
        name = "reconcile_engine_kv_cache_usage_ratio"
        out.family(name, kv, "gauge")
        for (dep, instance), load in engines:
            if load.kv_cache is not None:
                out.sample(name, load.kv_cache, deployment=dep, instance=instance)


def _histogram(out: PromText, name: str, hist: _Histogram, **labels: str) -> None:
    running = 0
    for bound, count in zip((*map(str, BUCKETS), "+Inf"), hist.counts, strict=True):
        running += count
        out.sample(f"{name}_bucket", running, **labels, le=bound)
    out.sample(f"{name}_sum", hist.total, **labels)
    out.sample(f"{name}_count", hist.n, **labels)
