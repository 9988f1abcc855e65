"""The OTLP/HTTP span exporter with the request encoded by ``shared.otlp_encoding``.

Contract: ``HttpSpanExporter`` is the SDK's ``OTLPSpanExporter`` (http/protobuf) in every
respect -- endpoint, headers, timeout, compression, certificates and retries from the
standard ``OTEL_EXPORTER_OTLP_*`` variables, its size limit and its own metrics -- except
that a batch's request body is written by ``encode_request`` (the same request, about a
third of the CPU). Other instances of the SDK's exporter in the process are untouched.

How: the SDK's ``export`` encodes with its module's ``encode_spans(spans)`` and then calls
``SerializePartialToString()`` on the result. This exporter hands ``export`` its batch
wrapped in ``_Encodable``; the module's ``encode_spans`` is replaced, once, by a function
that returns such a batch as it is (it serializes itself) and passes any other batch on
to the SDK's encoder. Should a later SDK no longer encode that way, ``HttpSpanExporter``
falls back to the SDK's encoding (``fast`` says which is in use).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, overload

from opentelemetry.exporter.otlp.proto.http import trace_exporter as _sdk
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from trainyard_platform.shared.otlp_encoding import encode_request

_install_lock = threading.Lock()
_installed = False


class _Encodable(Sequence[ReadableSpan]):
    """A batch of spans that serializes itself as an OTLP request."""

    def __init__(self, spans: Sequence[ReadableSpan]) -> None:
        self._spans = spans

    @overload
    def __getitem__(self, index: int) -> ReadableSpan: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[ReadableSpan]: ...
    def __getitem__(self, index: int | slice) -> ReadableSpan | Sequence[ReadableSpan]:
        return self._spans[index]

    def __len__(self) -> int:
        return len(self._spans)

    def SerializePartialToString(self) -> bytes:  # named as protobuf names it
        return encode_request(self._spans)


def _install() -> bool:
    """Route ``_Encodable`` batches around the SDK's encoder; True when that is in place."""
    global _installed
    with _install_lock:
        if not _installed:
            sdk_encode = getattr(_sdk, "encode_spans", None)
            if sdk_encode is None:
                return False

            def encode_spans(spans: Sequence[ReadableSpan]) -> Any:
                return spans if isinstance(spans, _Encodable) else sdk_encode(spans)

            setattr(_sdk, "encode_spans", encode_spans)  # noqa: B010 - a module's global
            _installed = True
        return True


class HttpSpanExporter(_sdk.OTLPSpanExporter):
    """The SDK's OTLP/HTTP span exporter, encoding with ``encode_request`` (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fast = _install()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return super().export(_Encodable(spans) if self.fast else spans)
