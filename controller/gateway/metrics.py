"""The gateway's Prometheus metrics, per deployment and per key label (never a key).

Updated on the gateway's event loop, rendered by the ``/metrics`` thread and the
after-pass textfile writer: one lock around plain dicts.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
Labels = tuple[str, str]  # (deployment, key label)


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
        self._lock = threading.Lock()
        self.requests: defaultdict[Labels, int] = defaultdict(int)
        self.errors: defaultdict[tuple[str, str, str], int] = defaultdict(int)
        self.inflight: defaultdict[str, int] = defaultdict(int)
        self.latency: dict[Labels, _Histogram] = {}

    def begin(self, deployment: str) -> None:
        with self._lock:
            self.inflight[deployment] += 1

    def end(self, deployment: str) -> None:
        with self._lock:
            self.inflight[deployment] -= 1

    def done(self, deployment: str, key: str, status: int, seconds: float) -> None:
        """One finished request (``deployment`` is ``-`` when no deployment was found)."""
        with self._lock:
            self.requests[(deployment, key)] += 1
            if status >= 400:
                self.errors[(deployment, key, f"{status // 100}xx")] += 1
            hist = self.latency.get((deployment, key))
            if hist is None:
                hist = self.latency[(deployment, key)] = _Histogram()
            hist.observe(seconds)

    def render(self) -> str:
        out: list[str] = []
        with self._lock:
            _family(out, "requests_total", "Requests through the gateway.", "counter")
            for (dep, key), n in sorted(self.requests.items()):
                out.append(f"reconcile_gateway_requests_total{_labels(dep, key)} {n}")
            _family(out, "errors_total", "Answers with status 4xx or 5xx, by class.", "counter")
            for (dep, key, cls), n in sorted(self.errors.items()):
                out.append(f"reconcile_gateway_errors_total{_labels(dep, key, cls)} {n}")
            _family(out, "inflight", "Requests being forwarded now.", "gauge")
            for dep, n in sorted(self.inflight.items()):
                out.append(f'reconcile_gateway_inflight{{deployment="{_esc(dep)}"}} {n}')
            _family(out, "request_seconds", "Time to the end of the answer.", "histogram")
            for (dep, key), hist in sorted(self.latency.items()):
                out.extend(_histogram(dep, key, hist))
        return "\n".join(out) + "\n"


def _family(out: list[str], name: str, help_text: str, kind: str) -> None:
    out.append(f"# HELP reconcile_gateway_{name} {help_text}")
    out.append(f"# TYPE reconcile_gateway_{name} {kind}")


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(dep: str, key: str, cls: str | None = None) -> str:
    extra = f',class="{cls}"' if cls else ""
    return f'{{deployment="{_esc(dep)}",key="{_esc(key)}"{extra}}}'


def _histogram(dep: str, key: str, hist: _Histogram) -> list[str]:
    name = "reconcile_gateway_request_seconds"
    base = f'deployment="{_esc(dep)}",key="{_esc(key)}"'
    out = []
    running = 0
    for bound, count in zip((*map(str, BUCKETS), "+Inf"), hist.counts, strict=True):
        running += count
        out.append(f'{name}_bucket{{{base},le="{bound}"}} {running}')
    out.append(f"{name}_sum{{{base}}} {hist.total}")
    out.append(f"{name}_count{{{base}}} {hist.n}")
    return out
