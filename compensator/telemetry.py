"""OpenTelemetry for every process: one tracer provider, its sampler and its exporter, from the
configuration.

Traces follow a request from the API through the store to the worker and the downstream: the API
puts the trace context in the message's headers, and the worker continues it. The exporter is
OTLP over HTTP to a collector, the console (debugging), or none; tests pass an in-memory one.

Must never: block a request on export (spans leave through a batch processor).
"""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased

from compensator.config import TelemetryConfig


def tracer_provider(
    config: TelemetryConfig, *, exporter: SpanExporter | None = None, process: str = ""
) -> TracerProvider:
    """`exporter` (tests) is exported synchronously; the configured one in batches."""
    attributes = {"service.name": config.service_name}
    if process:
        attributes["service.instance.role"] = process
    # With nothing to export, a trace begun here is not recorded (its context still travels into
    # the message, so the worker continues the same trace id); a caller's sampled trace is always
    # followed, whatever the exporter.
    root = TraceIdRatioBased(config.sample_ratio) if exporter is not None or config.exporter != "none" else ALWAYS_OFF
    provider = TracerProvider(resource=Resource.create(attributes), sampler=ParentBased(root))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif config.exporter == "otlp":
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=config.otlp_endpoint)))
    elif config.exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    return provider
