"""The recorder of lean spans: what ``BatchSpanProcessor`` + ``OTLPSpanExporter`` do, for
:class:`~conveyor.platform.spans.LeanSpan` — a bounded queue of spans encoded at end,
a daemon thread posting them in batches through a ``send`` callable — and
:func:`otlp_sender`, a ``send`` over the shipped exporter's HTTP client.

Import both from :mod:`conveyor.platform.spans`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, detach, set_value
from opentelemetry.sdk.environment_variables import (
    OTEL_BSP_EXPORT_TIMEOUT,
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
    OTEL_BSP_MAX_QUEUE_SIZE,
    OTEL_BSP_SCHEDULE_DELAY,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from conveyor.platform import otlp_wire as wire
from conveyor.platform.errors import ConfigError, InvalidArgumentError

if TYPE_CHECKING:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from conveyor.platform.spans import LeanSpan

logger = logging.getLogger("conveyor.platform.spans")

QUEUE_SIZE = 8192
"""Conveyor's default for ``OTEL_BSP_MAX_QUEUE_SIZE`` (the SDK's is 2,048): spans
waiting to be posted, at most (a lean span waits as its ~450 encoded bytes)."""
EXPORT_BATCH_SIZE = 2048
"""Conveyor's default for ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` (the SDK's is 512): spans a
post, at most. Why larger: the export thread needs the GIL back after each blocking call
of a post (half a dozen through the exporter's HTTP client), and while the event loop
runs flat out it gets it only when the interpreter's switch interval (5 ms) forces a
hand-over. A post then takes some 30 ms whatever its size: 512 spans a post kept up with
about 17,000 spans a second, fewer than a Redis worker at full speed makes at a 10 %
sampler, and a third of them were dropped. 2,048 a post (some 900 KB) keeps up with
about four times that."""
SCHEDULE_DELAY_MS = 5000
"""``OTEL_BSP_SCHEDULE_DELAY``'s default (the SDK's)."""
EXPORT_TIMEOUT_MS = 30000
"""``OTEL_BSP_EXPORT_TIMEOUT``'s default (the SDK's)."""


class BatchSettings(NamedTuple):
    """A batch span processor's settings (``BatchSpanProcessor``'s argument names)."""

    max_queue_size: int
    schedule_delay_millis: int
    max_export_batch_size: int
    export_timeout_millis: int


def batch_settings() -> BatchSettings:
    """The four ``OTEL_BSP_*`` settings, with Conveyor's defaults, for the recorder and a
    ``BatchSpanProcessor`` beside it. With only the queue set, a batch defaults to a
    quarter of it (as 2,048 is of 8,192): a batch as large as the queue would be posted
    only once the queue is full, and what arrives before the export thread runs would
    be dropped.

    A value that is empty is unset; one that is not an integer is warned about and
    defaulted, as the SDK does; one no processor takes (a size or delay not positive, a
    negative timeout, a batch larger than the queue) is a
    :class:`~conveyor.platform.errors.ConfigError` naming the variables."""
    queue = _env_int(OTEL_BSP_MAX_QUEUE_SIZE, QUEUE_SIZE)
    settings = BatchSettings(
        queue, _env_int(OTEL_BSP_SCHEDULE_DELAY, SCHEDULE_DELAY_MS),
        _env_int(OTEL_BSP_MAX_EXPORT_BATCH_SIZE, _batch_for(queue)),
        _env_int(OTEL_BSP_EXPORT_TIMEOUT, EXPORT_TIMEOUT_MS))
    for name, value, least in ((OTEL_BSP_MAX_QUEUE_SIZE, queue, 1),
                               (OTEL_BSP_SCHEDULE_DELAY, settings.schedule_delay_millis, 1),
                               (OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
                                settings.max_export_batch_size, 1),
                               (OTEL_BSP_EXPORT_TIMEOUT, settings.export_timeout_millis, 0)):
        if value < least:
            raise ConfigError(f"{name}={value}: must be "
                              f"{'a positive' if least else 'a non-negative'} integer")
    if settings.max_export_batch_size > queue:
        raise ConfigError(f"{OTEL_BSP_MAX_EXPORT_BATCH_SIZE}="
                          f"{settings.max_export_batch_size} is larger than "
                          f"{OTEL_BSP_MAX_QUEUE_SIZE} ({queue}): a post takes at most "
                          "what the queue holds")
    return settings


def _batch_for(queue: int) -> int:
    """The default batch for a queue of ``queue`` spans: a quarter of it, at most
    :data:`EXPORT_BATCH_SIZE` (a batch as large as the queue is posted only once the
    queue is full)."""
    return max(1, min(EXPORT_BATCH_SIZE, queue // 4))


def _env_int(name: str, default: int) -> int:
    """An ``OTEL_BSP_*`` setting, read as ``BatchSpanProcessor`` reads it (empty: unset;
    not an integer: a one-line warning, and the default)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        logger.warning("%s=%r is not an integer: using %d.", name, raw, default)
        return default


class LeanRecorder(SpanProcessor):
    """``BatchSpanProcessor`` + ``OTLPSpanExporter`` for :class:`LeanSpan`: a bounded
    queue of encoded spans and a daemon thread that posts them with ``send``.

    ``send`` gets one serialized ``ExportTraceServiceRequest`` (all spans under
    ``resource`` and ``scope``) and says whether it was delivered; it runs in the
    export thread, or in the caller's for :meth:`force_flush` — never two at once.

    The settings and their ``OTEL_BSP_*`` variables are ``BatchSpanProcessor``'s, and
    so are the defaults but two (:data:`QUEUE_SIZE`, :data:`EXPORT_BATCH_SIZE`, larger:
    why there): a batch is posted when ``max_export_batch_size`` spans wait, and every
    ``schedule_delay_millis`` whatever waits is posted (in batches of at most that
    size). A span that finds ``max_queue_size`` spans waiting is dropped
    (counted in :attr:`dropped_spans`); one "Queue full" warning per overflow, until an
    export makes room. ``export_timeout_millis`` bounds how long :meth:`shutdown`
    waits for the last export.

    Also an SDK ``SpanProcessor`` that ignores SDK spans, so that
    ``tracer_provider.add_span_processor(recorder)`` makes the provider's
    ``force_flush``/``shutdown`` cover it. The provider shuts processors down in the
    order they were added: a recorder sharing an exporter with a ``BatchSpanProcessor``
    must be added first, or the exporter is shut down under it.
    """

    def __init__(self, send: Callable[[bytes], bool], resource: Resource,
                 scope: InstrumentationScope, *, max_queue_size: int | None = None,
                 schedule_delay_millis: float | None = None,
                 max_export_batch_size: int | None = None,
                 export_timeout_millis: float | None = None,
                 span_limits: SpanLimits | None = None,
                 close: Callable[[], object] | None = None) -> None:
        self.max_queue_size = max_queue_size if max_queue_size is not None else _env_int(
            OTEL_BSP_MAX_QUEUE_SIZE, QUEUE_SIZE)
        self.schedule_delay_millis = (
            schedule_delay_millis if schedule_delay_millis is not None
            else _env_int(OTEL_BSP_SCHEDULE_DELAY, SCHEDULE_DELAY_MS))
        self.max_export_batch_size = (
            max_export_batch_size if max_export_batch_size is not None
            else _env_int(OTEL_BSP_MAX_EXPORT_BATCH_SIZE, _batch_for(self.max_queue_size)))
        self.export_timeout_millis = (
            export_timeout_millis if export_timeout_millis is not None
            else _env_int(OTEL_BSP_EXPORT_TIMEOUT, EXPORT_TIMEOUT_MS))
        if self.max_queue_size <= 0:
            raise InvalidArgumentError("max_queue_size must be a positive integer.")
        if self.schedule_delay_millis <= 0:
            raise InvalidArgumentError("schedule_delay_millis must be positive.")
        if self.max_export_batch_size <= 0:
            raise InvalidArgumentError("max_export_batch_size must be a positive integer.")
        if self.max_export_batch_size > self.max_queue_size:
            raise InvalidArgumentError("max_export_batch_size must be less than or equal to "
                             "max_queue_size.")
        self.limits = span_limits if span_limits is not None else SpanLimits()
        self.dropped_spans = 0
        self._send = send
        self._close = close
        self._resource_head, self._scope_head, self._scope_tail, self._resource_tail = (
            _envelope(resource, scope))
        # The bytes around the spans in the scope's field, and around the scope's
        # field in the resource's (their lengths are a post's, not a span's, to find).
        self._scope_extra = len(self._scope_head) + len(self._scope_tail)
        self._resource_extra = len(self._resource_head) + len(self._resource_tail)
        self._queue: list[bytes] = []
        self._overflowing = False
        self._stopping = False
        self._quiet = self.max_export_batch_size - 1
        """Spans queued below which one more is only queued: neither a batch to post
        (it makes ``max_export_batch_size``) nor one to drop (0 once shut down)."""
        self._makers: list[weakref.WeakMethod[Callable[[], None]]] = []
        self._handed = False
        self._start_thread()
        if hasattr(os, "register_at_fork"):  # a forked child gets its own thread
            reinit = weakref.WeakMethod(self._start_thread)

            def after_in_child() -> None:
                method = reinit()
                if method is not None:
                    method()

            os.register_at_fork(after_in_child=after_in_child)

    def on_hand_to_sdk(self, stop_lean: Callable[[], None]) -> None:
        """Register ``stop_lean``, a bound method (held weakly) of something that makes
        lean spans of this recorder, to be called by :meth:`hand_to_sdk`. Called when
        a maker is built (a handler's consumer span, a telemetry's producer spans),
        never a message."""
        self._makers = [m for m in self._makers if m() is not None]
        self._makers.append(weakref.WeakMethod(stop_lean))

    def hand_to_sdk(self) -> None:
        """Make no more lean spans: every registered maker starts SDK spans from now on.

        Called when a span processor is added to the provider after Conveyor built it:
        lean spans bypass the provider's processors, so the one added would miss the
        consumer and producer spans. Spans already started end here as before. Costs
        nothing per message while nobody calls it: each maker already looks up its lean
        maker (or its ``recorder``) per span, and this sets it to None."""
        if not self._handed:
            self._handed = True
            logger.info("a span processor was added to the tracer provider: consumer "
                        "and producer spans are SDK spans from now on, so that it sees "
                        "them (docs/telemetry.md)")
        for maker in self._makers:
            stop_lean = maker()
            if stop_lean is not None:
                stop_lean()

    def _start_thread(self) -> None:
        self._queue.clear()
        self._wake = threading.Event()
        self._export_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="LeanSpanRecorder",
                                        daemon=True)
        self._thread.start()

    def _record(self, span: LeanSpan) -> None:
        """Queue an ended span, encoded here (why: :mod:`conveyor.platform.spans`)."""
        queue = self._queue
        if len(queue) < self._quiet:  # the common case: no batch to post, nothing to drop
            try:
                queue.append(span._encode())
            except Exception:  # never the caller's failure: it ends a span on the hot path
                self._failed()
            return
        if len(queue) >= self.max_queue_size or self._stopping:
            self._drop()
            return
        try:
            queue.append(span._encode())
        except Exception:
            self._failed()
            return
        if len(queue) >= self.max_export_batch_size and not self._wake.is_set():
            self._wake.set()

    def _failed(self) -> None:
        self.dropped_spans += 1
        logger.exception("Failed to encode a span: dropped.")

    def _drop(self) -> None:
        self.dropped_spans += 1
        if self._stopping:
            return
        if not self._overflowing:
            self._overflowing = True
            logger.warning("Queue full, dropping spans (max_queue_size=%d).",
                           self.max_queue_size)

    def _run(self) -> None:
        attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))  # the export's HTTP calls
        delay_s = self.schedule_delay_millis / 1e3
        while not self._stopping:
            woken = self._wake.wait(delay_s)
            self._wake.clear()
            if self._stopping:
                break
            self._export(everything=not woken)
        self._export(everything=True)

    def _export(self, everything: bool, deadline: float | None = None) -> bool:
        """Post full batches, or everything queued; False if ``deadline`` (a
        ``time.monotonic()``) passed first."""
        wait_s = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._export_lock.acquire(timeout=wait_s):
            return False
        try:
            queue = self._queue
            batch = self.max_export_batch_size
            while queue and (everything or len(queue) >= batch):
                if deadline is not None and time.monotonic() > deadline:
                    return False
                # Spans are appended at the end, from any thread, and taken from the
                # front only here (under the lock): what was copied is what is cut.
                spans = queue[:batch]
                del queue[:len(spans)]
                self._overflowing = False
                self._post(spans)
            return True
        finally:
            self._export_lock.release()

    def _post(self, spans: list[bytes]) -> None:
        """Post ``spans`` (taken over: the request's other parts are put around them) as
        one request, joined in one copy: its lengths are summed, not measured."""
        count = len(spans)
        scope = self._scope_extra + sum(map(len, spans))
        scope_length = wire.length(scope)
        resource = self._resource_extra + 1 + len(scope_length) + scope
        spans[:0] = (b"\x0a", wire.length(resource), self._resource_head, b"\x12",
                     scope_length, self._scope_head)
        spans += (self._scope_tail, self._resource_tail)
        try:
            if not self._send(b"".join(spans)):
                logger.debug("Export of %d spans failed.", count)
        except Exception:  # a failing send must not end the export thread
            logger.exception("Exception while exporting Span.")

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Post every span ended so far, in the caller's thread; False if shut down or
        if ``timeout_millis`` passed first."""
        if self._stopping:
            return False
        token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            return self._export(everything=True,
                                deadline=time.monotonic() + timeout_millis / 1e3)
        finally:
            detach(token)

    def shutdown(self) -> None:
        """Post what is queued and stop the thread (waiting at most
        ``export_timeout_millis``), then call ``close`` (what ``send`` posts through,
        when the recorder owns it); spans ended later are dropped."""
        if self._stopping:
            return
        self._quiet = 0
        self._stopping = True
        self._wake.set()
        self._thread.join(self.export_timeout_millis / 1e3)
        if self._close is not None:
            self._close()


def _envelope(resource: Resource, scope: InstrumentationScope
              ) -> tuple[bytes, bytes, bytes, bytes]:
    """The parts of an ``ExportTraceServiceRequest`` around a batch's spans: the
    resource (1) and its scope (1) before them, the schema URLs (3) after."""
    resource_head = wire.field(0x0A, wire.attributes(0x0A, resource.attributes))
    scope_head = wire.field(0x0A, wire.text(0x0A, scope.name) + wire.text(0x12, scope.version)
                            + wire.attributes(0x1A, scope.attributes))
    return (resource_head, scope_head, wire.text(0x1A, scope.schema_url),
            wire.text(0x1A, resource.schema_url))


def otlp_sender(exporter: OTLPSpanExporter) -> Callable[[bytes], bool] | None:
    """A ``send`` for :class:`LeanRecorder` posting through ``exporter``'s own HTTP
    client — its endpoint, headers, TLS, compression, timeout and retries — or None
    if this exporter has no such client (then use SDK spans).

    Depends on private attributes of ``opentelemetry-exporter-otlp-proto-http``:
    ``exporter._client.export(data)`` (a result with ``.success``) and
    ``exporter._max_request_size`` (honoured as the exporter does: a larger request is
    dropped); checked on 1.45.2 (``tests/unit/test_lean_spans.py`` fails if they go).

    Give the recorder an exporter of its own rather than the one a
    ``BatchSpanProcessor`` uses: its HTTP session is then used by one thread, and
    shutting either down does not cut the other off.
    """
    client = getattr(exporter, "_client", None)
    export = getattr(client, "export", None)
    if not callable(export):
        return None
    limit = getattr(exporter, "_max_request_size", None)
    max_bytes = limit if isinstance(limit, int) and limit > 0 else None

    def send(data: bytes) -> bool:
        if getattr(exporter, "_shutdown", False):
            logger.warning("Exporter already shutdown, ignoring batch")
            return False
        if max_bytes is not None and len(data) > max_bytes:
            logger.warning("Dropping span batch: serialized size %d bytes exceeds "
                           "max_request_size %d bytes.", len(data), max_bytes)
            return False
        return bool(export(data).success)

    return send
