"""The gateway's Prometheus metrics, per deployment and per key label (never a key).

Updated on the gateway's event loop with no lock (a request pays a few dict updates);
read from other threads (the control socket's scrape, the web page) through snapshots:
``list(d.items())`` copies a dict in one step under the GIL, so a reader never sees one
change size under it. A histogram read mid-update is off by one request at most.

``GatewayMetrics`` is a prometheus-client collector of its own (no global registry):
the families are built from these counters when scraped, and ``generate_latest``
writes the text. The request path pays no lock of the library's metric objects.

A hand-over keeps the counters running: the old gateway, once it has drained, writes
its final text (``registry.handed_path``) and a successor adds those counters and
histograms to its own from then on (``inherit``), so ``rate()`` sees no reset. In
hand-overs in a row the newest gateway waits for every gateway still draining when it
started; each file is added once (``registry.claim_handed``).
"""

from __future__ import annotations

import bisect
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, cast

from controller.gateway.accounting.enginemetrics import EngineLoad
from controller.gateway.accounting.usage import Meter

# prometheus_client is imported by a scrape, a hand-over's inherit, not at the start: any
# of its modules runs its package's import (http.server, http.client, email, wsgiref),
# ~35-50 ms of CPU, a sixth of a gateway process's import, and the suite starts hundreds.
if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector

PREFIX = "reconcile_gateway_"
# Up to half an hour: a long generation streams for minutes, and a cold start's first
# token waits out a model's load (minutes for a large one); past the last bound a
# quantile reads as that bound, so one at 120 s said "120" of every longer answer.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
           300.0, 600.0, 1800.0)  # fmt: skip
Labels = tuple[str, str]  # (deployment, key label)
Instance = tuple[str, str]  # (deployment, instance: its record's name)
SampleKey = tuple[str, tuple[tuple[str, str], ...]]  # sample name, sorted labels
Carried = dict[str, dict[SampleKey, float]]  # family name -> a predecessor's samples
LE = (*map(str, BUCKETS), "+Inf")  # the bucket bounds as the `le` label shows them
# The node too: the series carry their own `instance` (scraped with honor_labels), so
# without it two nodes serving one deployment name would be one series in one job
INSTANCE = ("node", "deployment", "instance")
KEYED = ("deployment", "key")

# fmt: off
# Every family, in the order /metrics shows them: name -> type, label names, HELP
FAMILIES: dict[str, tuple[str, tuple[str, ...], str]] = {
    f"{PREFIX}requests_total": ("counter", KEYED, "Requests through the gateway."),
    f"{PREFIX}errors_total": ("counter", (*KEYED, "class"),
        "Answers with status 4xx or 5xx, by class."),
    f"{PREFIX}ejections_total": ("counter", INSTANCE,
        "Times passive health ejected an instance (failures in a row)."),
    f"{PREFIX}inflight": ("gauge", INSTANCE, "Requests being forwarded now, per instance."),
    f"{PREFIX}request_seconds": ("histogram", KEYED, "Time to the end of the answer."),
    f"{PREFIX}tokens_total": ("counter", (*KEYED, "kind"),
        "Tokens the engines' usage counted, by kind (prompt, completion)."),
    f"{PREFIX}time_to_first_token_seconds": ("histogram", ("deployment",),
        "Time to the first byte of the answer (a stream's first token)."),
    f"{PREFIX}swaps_avoided_total": ("counter", ("deployment",),
        "Times OnDemand requests waited for a rival's queue instead of a swap."),
    f"{PREFIX}request_log_dropped_total": ("counter", (),
        "Request log lines dropped: the writer fell behind or the disk failed."),
    f"{PREFIX}fallbacks_total": ("counter", ("model", "to", "reason"),
        "Requests sent to a fallback model, by why (not_ready, ended, ejected,"
        " unreachable, limit)."),
    "reconcile_engine_requests_waiting": ("gauge", INSTANCE,
        "Requests waiting in the engine's own queue, as its /metrics says."),
    "reconcile_engine_kv_cache_usage_ratio": ("gauge", INSTANCE,
        "The engine's KV cache in use, 0 to 1, as its /metrics says."),
}
# fmt: on


class _Histogram:
    """Per-bucket counts (not cumulative: the page's quantiles take differences)."""

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, value)] += 1
        self.total += value

    def samples(self, metric: Metric, labels: dict[str, str]) -> None:
        """Its samples in ``metric``: the buckets cumulative, as Prometheus wants them."""
        running = 0
        for bound, count in zip(LE, self.counts, strict=True):
            running += count
            metric.add_sample(f"{metric.name}_bucket", {**labels, "le": bound}, float(running))
        metric.add_sample(f"{metric.name}_count", labels, float(running))
        metric.add_sample(f"{metric.name}_sum", labels, self.total)


Series = Iterable[tuple[tuple[str, ...], float | _Histogram | None]]  # label values, value


class GatewayMetrics:
    """A prometheus-client collector (``collect``, all ``generate_latest`` reads) that
    does not subclass ``Collector``, so that defining it imports no prometheus_client."""

    def __init__(self, node: str = "") -> None:
        self.node = node  # the daemon's node name, on each per-instance series
        self.requests: defaultdict[Labels, int] = defaultdict(int)
        self.errors: defaultdict[tuple[str, str, str], int] = defaultdict(int)
        self.inflight: defaultdict[Instance, int] = defaultdict(int)
        # The instances routed now, deployment -> its instances (the table's): each reads
        # 0 in flight when idle, not "no data" (a gauge's habit); a gone one leaves.
        self.known: Callable[[], Mapping[str, tuple[str, ...]]] = dict
        self.latency: dict[Labels, _Histogram] = {}
        self.tokens: defaultdict[tuple[str, str, str], int] = defaultdict(int)  # + kind
        self.first_token: dict[str, _Histogram] = {}  # per deployment
        self.swaps_avoided: defaultdict[str, int] = defaultdict(int)  # turns.py
        self.ejections: defaultdict[Instance, int] = defaultdict(int)  # passive health
        self.log_dropped = 0  # request log lines dropped (requestlog.py: queue full, disk)
        self.fallbacks: defaultdict[tuple[str, str, str], int] = defaultdict(int)  # forwarding.py
        self.engines: dict[Instance, EngineLoad] = {}  # the engines' own (enginemetrics.py)
        self.carried: Carried = {}  # predecessors' counters (inherit), replaced whole
        self.moves = 0  # requests done and counters inherited (the gateway's file follows)
        self.on_done: Callable[[], None] = _nothing  # the page's sampler wakes (traffic.py)

    def inherit(self, text: str) -> None:
        """Add a predecessor's final counters and histograms (its Prometheus text) to
        ours from now on; its gauges (in flight, the engines') were its own moment's."""
        from prometheus_client.parser import text_string_to_metric_families

        carried = {name: dict(samples) for name, samples in self.carried.items()}
        for family in text_string_to_metric_families(text):
            if family.type not in ("counter", "histogram"):
                continue
            theirs = {
                (s.name, tuple(sorted(self._placed(s.labels).items()))): s.value
                for s in family.samples
            }
            if family.type == "histogram":
                theirs = _on_our_bounds(theirs)
            into = carried.setdefault(family.name, {})
            for key, value in theirs.items():
                into[key] = into.get(key, 0.0) + value
        self.carried = carried  # one assignment: a scrape sees the old or the new
        self.moves += 1

    def _placed(self, labels: dict[str, str]) -> dict[str, str]:
        """A predecessor's series labels, with our node on a per-instance one that has
        none (a gateway of an older reconcile): one series across the upgrade."""
        if "instance" in labels and "node" not in labels:
            return {"node": self.node, **labels}
        return labels

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
        self.moves += 1
        self.on_done()

    def ended(self, deployment: str, key: str, status: int, meter: Meter) -> None:
        """A request that ended now, with what its ``meter`` saw: counted, timed, and for
        an answer, its first byte and its tokens."""
        self.done(deployment, key, status, time.monotonic() - meter.started)
        used = meter.usage
        first = meter.first - meter.started if meter.first is not None else None
        if first is None and used is None:
            return
        prompt, completion = (used.prompt, used.completion) if used else (0, 0)
        self.answered(deployment, key, first, prompt, completion)

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
        """A request for ``model`` went to its fallback ``to`` (forwarding.py)."""
        self.fallbacks[(model, to, reason)] += 1

    def swap_avoided(self, deployment: str) -> None:
        """Requests for ``deployment`` waited behind a rival's queue (turns.py)."""
        self.swaps_avoided[deployment] += 1

    def _inflight(self) -> Series:
        """In flight per instance: those it counts, and 0 for each other one routed now."""
        counted = dict(self.inflight)
        idle = {(d, i): 0 for d, found in self.known().items() for i in found}
        return self._on_node({**idle, **counted}.items())

    def _on_node(self, series: Iterable[tuple[Instance, float | None]]) -> Series:
        """Per-instance series with this node's name before their labels."""
        return [((self.node, *who), value) for who, value in series]

    def render(self) -> str:
        from prometheus_client.exposition import generate_latest

        return generate_latest(cast("Collector", self)).decode()

    def collect(self) -> Iterator[Metric]:
        """Each family of ``FAMILIES`` from a copy of its dict (see the docstring), plus
        what predecessors counted."""
        carried, engines = self.carried, list(self.engines.items())
        series: dict[str, Series] = {
            f"{PREFIX}requests_total": list(self.requests.items()),
            f"{PREFIX}errors_total": list(self.errors.items()),
            f"{PREFIX}ejections_total": self._on_node(list(self.ejections.items())),
            f"{PREFIX}inflight": self._inflight(),
            f"{PREFIX}request_seconds": list(self.latency.items()),
            f"{PREFIX}tokens_total": list(self.tokens.items()),
            f"{PREFIX}time_to_first_token_seconds": _per(self.first_token),
            f"{PREFIX}swaps_avoided_total": _per(self.swaps_avoided),
            f"{PREFIX}request_log_dropped_total": [((), self.log_dropped)],
            f"{PREFIX}fallbacks_total": list(self.fallbacks.items()),
            "reconcile_engine_requests_waiting": self._on_node(
                [(who, e.waiting) for who, e in engines]
            ),
            "reconcile_engine_kv_cache_usage_ratio": self._on_node(
                [(who, e.kv_cache) for who, e in engines]
            ),
        }
        for name in FAMILIES:  # in the table's order
            family = _family(name, series[name])
            extra = carried.get(family.name)
            yield _plus(family, extra) if extra else family


def _on_our_bounds(samples: Mapping[SampleKey, float]) -> dict[SampleKey, float]:
    """A predecessor's histogram with a bucket on each of our bounds: one of an older
    reconcile had fewer (none past 120 s). A bound it lacks holds its count at its
    largest bound below (cumulative: none of its answers is known to lie between), so
    the buckets it adds to ours still rise with the bound."""
    out = dict(samples)
    per_series: defaultdict[SampleKey, dict[float, float]] = defaultdict(dict)
    for (name, labels), value in samples.items():
        bound = dict(labels).get("le")
        if bound is not None:
            plain = tuple(pair for pair in labels if pair[0] != "le")
            per_series[(name, plain)][float(bound)] = value
    for (name, plain), counts in per_series.items():
        for le in LE:
            if float(le) not in counts:
                below = [b for b in counts if b < float(le)]
                value = counts[max(below)] if below else 0.0
                out[(name, tuple(sorted((*plain, ("le", le)))))] = value
    return out


def _per(by_deployment: Mapping[str, float | _Histogram]) -> Series:
    return [((dep,), value) for dep, value in list(by_deployment.items())]


def _family(name: str, series: Series) -> Metric:
    """``name``'s family as ``FAMILIES`` declares it, one series per label set in order."""
    from prometheus_client.metrics_core import Metric

    kind, labels, help_text = FAMILIES[name]
    family = Metric(name.removesuffix("_total"), help_text, kind)
    for values, value in sorted(series, key=lambda item: item[0]):
        where = dict(zip(labels, values, strict=True))
        if isinstance(value, _Histogram):
            value.samples(family, where)
        elif value is not None:  # None: an engine that does not state this figure
            family.add_sample(name, where, value)
    return family


def _plus(family: Metric, extra: Mapping[SampleKey, float]) -> Metric:
    """``family`` with a predecessor's samples added, series by series."""
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
    for key, value in extra.items():
        values[key] = values.get(key, 0.0) + value
    from prometheus_client.samples import Sample

    ordered = sorted(values.items(), key=_series_order)
    family.samples = [Sample(name, dict(labels), value) for (name, labels), value in ordered]
    return family


def _series_order(item: tuple[SampleKey, float]) -> tuple[object, ...]:
    """A series' samples together, a histogram's buckets by bound, then _count, _sum."""
    (name, labels), _ = item
    bound = dict(labels).get("le")
    plain = tuple(pair for pair in labels if pair[0] != "le")
    return (plain, bound is None, float(bound) if bound else 0.0, name)


def _nothing() -> None:
    pass
