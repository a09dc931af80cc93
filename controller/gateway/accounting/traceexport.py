"""The OTLP exporter with its collector's reach said once (imported by tracing.py only when
traces are configured: it imports the SDK).

The exporter's own lines, a warning per retry and an error per batch given up, said a
collector that is down every second or so for as long as it stayed down. They are kept
back here (``_KeptBack``), the first of each batch remembered (it has the reason; the
last, the giving up, has none): the first batch that fails says it
once, with those words, and the first one sent after says the collector is back, as the
project says other unreachable things (the in-flight file, the request log's disk).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from controller.logsetup import get_logger
from controller.redact import redact_url

log = get_logger("reconcile")

# The logger of the OTLP/HTTP trace exporter and of the HTTP client it hands its own to.
EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.http.trace_exporter"


class _KeptBack(logging.Filter):
    """Drops the exporter's records; remembers the first one's words since ``first`` was
    emptied (at each batch) for the warning."""

    def __init__(self) -> None:
        super().__init__()
        self.first = ""

    def filter(self, record: logging.LogRecord) -> bool:
        self.first = self.first or record.getMessage()
        return False


class SaidOnce(SpanExporter):
    """``exporter``, whose failures are said once until a batch goes through again."""

    def __init__(self, exporter: SpanExporter, endpoint: str) -> None:
        self._exporter = exporter
        self._endpoint = redact_url(endpoint)
        self._down = False
        self._kept = _KeptBack()
        logging.getLogger(EXPORTER_LOGGER).addFilter(self._kept)

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

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)
