"""Traces of the gateway's requests (the ``otel`` extra); nothing at all without it.

Configured the standard OpenTelemetry way, from the environment the daemon gives its
gateway: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``)
names an OTLP/HTTP receiver; ``OTEL_TRACES_EXPORTER=none`` or ``OTEL_SDK_DISABLED=true``
turns traces off; ``OTEL_SERVICE_NAME``, ``OTEL_EXPORTER_OTLP_HEADERS`` and ``OTEL_BSP_*``
are read by the SDK itself. Unconfigured (or the extra not installed) no module of
opentelemetry is imported: a request pays a no-op context manager per span.

One trace per request: the request's span (continuing an incoming ``traceparent``),
in it ``routing`` for each deployment tried, ``fallback`` when one takes over,
``wait for Ready``, ``engine`` for each call to an engine and ``retry`` around a
second one; the engine call's context goes to the engine as ``traceparent``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any
from urllib.parse import urlsplit

from controller.logsetup import get_logger
from controller.redact import redact_url

log = get_logger("reconcile")

SERVICE = "reconcile-gateway"  # the resource's service.name unless OTEL_SERVICE_NAME says
ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
PROTOCOLS = ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
# What the exporter speaks: OTLP/HTTP, protobuf (a collector's HTTP port takes JSON or
# protobuf alike, so http/json is served too); not gRPC
SPOKEN = ("http/protobuf", "http/json")
CLOSE_WAIT = 5.0  # seconds the gateway's exit waits for the last spans (a receiver down)
Attributes = Mapping[str, str | int | float | bool]
NOTHING: AbstractContextManager[None] = nullcontext()  # reusable: the no-op span, shared


def configured(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces (an OTLP endpoint, not switched off)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    return exporters != "none" and any(environ.get(name, "").strip() for name in ENDPOINTS)


class Tracing:
    """No traces: every call does nothing (the extra absent or not configured)."""

    enabled = False
    endpoint = ""  # where its spans go ("": nowhere); a gateway's registry entry says it

    def request(
        self, headers: Mapping[str, str], method: str, path: str, route: str | None
    ) -> AbstractContextManager[None]:
        """The request's span, continuing the client's ``traceparent``: named ``METHOD
        route`` for a path the gateway routes (``POST /v1/chat/completions``), ``METHOD``
        alone for any other (an engine's own): a span's name is the collector's index and
        its span metrics' label, so it must not be the client's to choose (OpenTelemetry's
        HTTP conventions); the path is its ``url.path`` either way."""
        return NOTHING

    def span(
        self, name: str, attrs: Attributes, client: bool = False
    ) -> AbstractContextManager[None]:
        return NOTHING

    def note(self, attrs: Attributes, failed: bool = False) -> None:
        """Attributes for the current span; ``failed`` marks it an error."""

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Put the current span's ``traceparent`` in the headers sent on."""

    def close(self) -> None:
        """Send what is still buffered (at the gateway's end)."""


class _Otel(Tracing):
    enabled = True

    def __init__(self, provider: Any, endpoint: str) -> None:
        from opentelemetry import propagate, trace

        self.endpoint = endpoint
        self._provider = provider
        self._tracer = provider.get_tracer("reconcile.gateway")
        self._trace = trace
        self._propagate = propagate

    @contextmanager
    def request(
        self, headers: Mapping[str, str], method: str, path: str, route: str | None
    ) -> Iterator[None]:
        parent = self._propagate.extract(headers)  # a client's traceparent is continued
        kind = self._trace.SpanKind.SERVER
        attrs = {"http.request.method": method, "url.path": path}
        name = method
        if route is not None:
            attrs["http.route"] = route
            name = f"{method} {route}"
        with self._tracer.start_as_current_span(name, parent, kind, attrs):
            yield

    @contextmanager
    def span(self, name: str, attrs: Attributes, client: bool = False) -> Iterator[None]:
        kind = self._trace.SpanKind.CLIENT if client else self._trace.SpanKind.INTERNAL
        with self._tracer.start_as_current_span(name, kind=kind, attributes=attrs):
            yield

    def note(self, attrs: Attributes, failed: bool = False) -> None:
        span = self._trace.get_current_span()
        span.set_attributes(attrs)
        if failed:
            span.set_status(self._trace.StatusCode.ERROR)

    def inject(self, headers: MutableMapping[str, str]) -> None:
        self._propagate.inject(headers)

    def close(self) -> None:
        # Shutting down flushes the batch (the last requests' spans go too); a receiver
        # that is down would hold the exit through the exporter's retries, so not past
        # CLOSE_WAIT: the SDK's thread is a daemon and ends with the process.
        flush = threading.Thread(target=self._provider.shutdown, daemon=True)
        flush.start()
        flush.join(CLOSE_WAIT)


def from_env(environ: Mapping[str, str] = os.environ) -> Tracing:
    """The gateway's tracing: OTLP/HTTP when the environment asks and the extra is here."""
    if not configured(environ):
        return Tracing()
    unusable = _unusable_endpoint(environ)
    if unusable is not None:
        log.warning("no traces: the OTLP endpoint is not an http:// or https:// URL", **unusable)
        return Tracing()
    unspoken = _unspoken_protocol(environ)
    if unspoken is not None:
        log.warning("no traces: only OTLP/HTTP is spoken, not the protocol asked", **unspoken)
        return Tracing()
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from controller.gateway.accounting.traceexport import SaidOnce
    except ImportError as exc:
        log.warning(
            "no traces: OTEL_EXPORTER_OTLP_ENDPOINT is set but the otel extra is not installed",
            missing=exc.name or "opentelemetry",
            fix="pip install 'reconcile-engines[otel]' where reconcile is installed",
        )
        return Tracing()
    resource = Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME") or SERVICE})
    provider = TracerProvider(resource=resource)
    # The batch is sent from the SDK's own thread: the request path never waits on it.
    endpoint = _endpoint(environ)
    exporter = SaidOnce(OTLPSpanExporter(endpoint=endpoint), endpoint)  # a collector down: once
    provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("traces sent by OTLP/HTTP", service=resource.attributes["service.name"])
    return _Otel(provider, endpoint)


def _unusable_endpoint(environ: Mapping[str, str]) -> dict[str, str] | None:
    """What to say of an endpoint without an http(s) scheme (``localhost:4318`` reads as
    the scheme "localhost"): each export failed with "No connection adapters were found",
    a line per batch, while the start said traces were sent. None when it is usable."""
    if urlsplit(_endpoint(environ)).scheme.lower() in ("http", "https"):
        return None
    name = next(n for n in reversed(ENDPOINTS) if environ.get(n, "").strip())
    return {
        "variable": name,
        "value": redact_url(environ[name].strip()),
        "fix": f"give {name} the collector's OTLP/HTTP URL, e.g. http://HOST:4318",
    }


def _unspoken_protocol(environ: Mapping[str, str]) -> dict[str, str] | None:
    """What to say of an OTLP protocol asked that the exporter does not speak (``grpc``):
    it was not read, so spans went by HTTP to what is, as asked, a gRPC port, each batch
    failing with a reason about the connection while the start said traces were sent.
    None when it is spoken (or unset: http/protobuf, the spec's default)."""
    name = next((n for n in reversed(PROTOCOLS) if environ.get(n, "").strip()), None)
    if name is None or environ[name].strip().lower() in SPOKEN:
        return None
    return {
        "variable": name,
        "value": environ[name].strip()[:64],
        "fix": f"unset {name} (or set http/protobuf) and name the collector's OTLP/HTTP "
        "port in OTEL_EXPORTER_OTLP_ENDPOINT, e.g. http://HOST:4318",
    }


def _endpoint(environ: Mapping[str, str]) -> str:
    """Where spans go, as the OTLP exporter spec says: the traces endpoint as it is, else
    the base endpoint with ``/v1/traces``."""
    traces = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    return environ["OTEL_EXPORTER_OTLP_ENDPOINT"].strip().rstrip("/") + "/v1/traces"
