"""The OTLP exporter with its collector's reach said once (imported by tracing.py only when
traces are configured: it imports the SDK).

The exporter's own lines, a warning per retry and an error per batch given up, said a
collector that is down every second or so for as long as it stayed down. They are kept
back here (``_KeptBack``), the first of each batch remembered (it has the reason; the
last, the giving up, has none): the first batch that fails says it
once, with those words, and the first one sent after says the collector is back, as the
project says other unreachable things (the in-flight file, the request log's disk).

The SDK's batch processor says "Queue full, dropping Span." once per 20 s for as long as
its queue stays full (a collector down, or one that never answers, or slower than the
requests): 180 lines an hour. Those are kept back too (``_QueueFull``): said once, and
again only after a minute with no span dropped; not at all while the collector is said
to be down (that line says spans are dropped).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from controller.logsetup import get_logger
from controller.redact import redact_url

log = get_logger("reconcile")

# The logger of the OTLP/HTTP trace exporter and of the HTTP client it hands its own to.
EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
# The batch processor's loggers (in the SDK now, and in its older releases), its drop's words
PROCESSOR_LOGGERS = ("opentelemetry.sdk._shared_internal", "opentelemetry.sdk.trace.export")
QUEUE_FULL = ("Queue full", "Queue is full")
QUIET = 60.0  # seconds without a drop after which a new drop is said again


class _KeptBack(logging.Filter):
    """Drops the exporter's records; remembers the first one's words since ``first`` was
    emptied (at each batch) for the warning."""

    def __init__(self) -> None:
        super().__init__()
        self.first = ""

    def filter(self, record: logging.LogRecord) -> bool:
        self.first = self.first or record.getMessage()
        return False


class _QueueFull(logging.Filter):
    """Drops the batch processor's "Queue full" records (its others pass), saying the
    first of each run of them as ours, unless ``down()`` says the collector's line has."""

    def __init__(self, down: Callable[[], bool]) -> None:
        super().__init__()
        self.down = down
        self.last = -QUIET  # monotonic time of the last drop heard of

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(QUEUE_FULL):  # a tuple: either words
            return True
        now = time.monotonic()
        if now - self.last >= QUIET and not self.down():
            log.warning(
                "trace spans dropped: the export queue is full (said again only after a "
                "minute without a drop)",
                next="the collector does not answer, or is slower than the requests: see "
                "to it, or raise OTEL_BSP_MAX_QUEUE_SIZE (then: reconcile gateway restart); "
                "requests are served meanwhile",
            )
        self.last = now
        return False


class SaidOnce(SpanExporter):
    """``exporter``, whose failures are said once until a batch goes through again."""

    def __init__(self, exporter: SpanExporter, endpoint: str) -> None:
        self._exporter = exporter
        self._endpoint = redact_url(endpoint)
        self._down = False
        self._kept = _KeptBack()
        logging.getLogger(EXPORTER_LOGGER).addFilter(self._kept)
        self._full = _QueueFull(lambda: self._down)
        for name in PROCESSOR_LOGGERS:
            logging.getLogger(name).addFilter(self._full)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._kept.first = ""
        result = self._exporter.export(spans)
        failed = result is not SpanExportResult.SUCCESS
        if failed and not self._down:
            log.warning(
                "trace collector not reached: spans are dropped until it is (said once)",
                endpoint=self._endpoint,
                error=self._kept.first or "the exporter gave no reason",
                next="start the collector, or fix OTEL_EXPORTER_OTLP_ENDPOINT (then: "
                "reconcile gateway restart); requests are served meanwhile",
            )
        elif not failed and self._down:
            log.info("trace collector reached again: spans are sent", endpoint=self._endpoint)
        self._down = failed
        return result

    def shutdown(self) -> None:
        self._exporter.shutdown()
        logging.getLogger(EXPORTER_LOGGER).removeFilter(self._kept)
        for name in PROCESSOR_LOGGERS:
            logging.getLogger(name).removeFilter(self._full)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)
