"""The producer side: publish messages to streams.

It sits above ``platform/`` (whose port, mapper and coalescer it drives) because
:meth:`Client.from_config` chooses the broker: the adapter comes from
:mod:`conveyor.backends`, the one place a broker's name meets its code.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import msgspec
from opentelemetry.trace import Span, StatusCode

from conveyor.backends import create_adapter
from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.coalescer import PublishCoalescer
from conveyor.platform.config import (
    DEFAULT_MAX_BODY_BYTES,
    Config,
    PublishConfig,
    require_config,
)
from conveyor.platform.errors import (
    BodyEncodeError,
    ConveyorError,
    InvalidArgumentError,
    MessageTooLargeError,
    ShutdownError,
)
from conveyor.platform.ids import (
    SequenceToken,
    StreamId,
    key_problem,
    namespace_problem,
    shown_any,
    shown_name,
)
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.message import (
    CONTENT_JSON,
    CONTENT_MSGPACK,
    MAX_HEADER_BYTES,
    RESERVED_HEADERS,
    Message,
    new_message_id,
    new_message_ids,
    now_ms,
)
from conveyor.platform.partial_publish import publish_failure
from conveyor.platform.telemetry import Telemetry
from conveyor.platform.trace_context import current_span

_STREAMS_REMEMBERED = 65_536
"""Streams whose queue a client remembers (then it forgets them all and starts over)."""
_NO_TOKEN = SequenceToken(-1, -1)
_json_encode = msgspec.json.Encoder().encode
_msgpack_encode = msgspec.msgpack.Encoder().encode
_json_encode_sorted = msgspec.json.Encoder(order="deterministic").encode
"""Encodes only bodies whose keys are all str (its sort needs them): what tells a body
whose JSON may hold one key twice (``{1: "a", "1": "b"}``), in C, from the rest."""
_ENCODE_ERRORS = (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError)
"""What encoding a body raises when it cannot be encoded (UnicodeEncodeError is a
ValueError): translated into :class:`BodyEncodeError`."""
_has_null = re.compile(b"ull").search
"""Whether JSON may hold ``null`` (where msgspec writes NaN and infinity). "ull", found in
every null: a search that looks for "u" first, rarer in text than "n", took half the time
of one for "null" (0.26 against 0.51 ns a byte), and ``b"null" in data`` costs more still
(it first tries the needle as an int). A "full" only costs a closer look."""
_packed_non_finite = re.compile(rb"\xcb[\x7f\xff][\xf0-\xff]").search
"""A msgpack float64 (0xcb, then 8 bytes big-endian) whose exponent is all ones: NaN or
infinity. The same bytes may also turn up elsewhere (an int, a binary): only a hint."""


@dataclass(frozen=True, slots=True)
class Publish:
    """One message to publish with :meth:`Client.publish_batch`.

    A value: equal to another of the same fields, and hashable whatever its body and
    headers (a dict each, often), which its hash leaves out (a set of them holds each
    message once)."""

    namespace: str
    key: str
    body: Any = field(hash=False)
    headers: Mapping[str, str] = field(default_factory=dict, hash=False)
    content_type: str | None = None


def _is_text(value: object) -> bool:
    """Whether ``value`` is a str (a ``StrEnum`` member too) that UTF-8 can encode (no
    lone surrogates): what a header or a content type must be for every broker's wire
    format."""
    if not isinstance(value, str):
        return False
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _utf8_len(text: str) -> int:
    """The length of ``text`` (UTF-8 text, :func:`_is_text`) in UTF-8 bytes."""
    return len(text) if text.isascii() else len(text.encode())


def _headers_too_large(stream: StreamId, headers: Mapping[str, str], size: int
                       ) -> MessageTooLargeError:
    """The error of a message whose own headers hold ``size`` bytes, past
    :data:`MAX_HEADER_BYTES`; it names the largest."""
    name, value = max(headers.items(), key=lambda h: _utf8_len(h[0]) + _utf8_len(h[1]))
    return MessageTooLargeError(
        f"message to stream {stream.shown()}: its headers hold {size:,} bytes (names and "
        f"values, the largest {shown_name(name, quoted=True)} "
        f"({_utf8_len(name) + _utf8_len(value):,} bytes)), more than the "
        f"{MAX_HEADER_BYTES:,} a message's headers may; nothing was sent: headers are "
        "metadata, put the data in the body")


def encode_body(body: Any, content_type: str | None, stream: StreamId) -> tuple[bytes, str]:
    """Bytes and str go as given (JSON unless told otherwise); objects are encoded (as
    msgpack when told so, else as JSON). A body that cannot be is a
    :class:`BodyEncodeError` naming ``stream``; so is None (a body left out: JSON's
    ``null`` is ``b"null"``)."""
    if content_type is not None and not _is_text(content_type):
        raise InvalidArgumentError(
            f"content type {content_type!r}: it is text that UTF-8 can encode (str); "
            "nothing was sent")
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body), content_type or CONTENT_JSON
    if body is None:  # left out, or a function's missing return: no handler wants it
        raise BodyEncodeError(
            f"message to stream {stream.shown()}: body is None, which is no message: pass "
            "the body (to send JSON's null, pass b'null'); nothing was sent")
    try:
        if isinstance(body, str):
            return body.encode(), content_type or CONTENT_JSON
        if content_type == CONTENT_MSGPACK:
            return _msgpack_encode(body), CONTENT_MSGPACK
        data = _json_encode(body)
    except _ENCODE_ERRORS as exc:
        raise _unencodable(stream, body, content_type, exc) from exc
    if _has_null(data):
        _refuse_non_finite(stream, body)
    try:
        _json_encode_sorted(body)
    except _ENCODE_ERRORS:  # a key that is no str, which JSON writes as text
        _refuse_key_clash(stream, data)
    return data, content_type or CONTENT_JSON


def _unencodable(stream: StreamId, body: Any, content_type: str | None,
                exc: BaseException) -> BodyEncodeError:
    """The error of a body the encoder refused with ``exc``."""
    encoding = ("UTF-8 text" if isinstance(body, str)
                else "msgpack" if content_type == CONTENT_MSGPACK else "JSON")
    if isinstance(exc, UnicodeEncodeError):
        why = f"it holds a lone surrogate ({exc.object[exc.start:exc.end]!r}), not text"
    elif isinstance(exc, RecursionError):
        why = "it is nested too deeply"
    else:
        why = str(exc)
    return BodyEncodeError(
        f"message to stream {stream.shown()}: its body cannot be encoded "
        f"as {encoding}: {why}; nothing was sent")


def _refuse_non_finite(stream: StreamId, body: Any) -> None:
    """Raise :class:`BodyEncodeError` if ``body`` holds a float JSON cannot carry (NaN,
    infinity), which msgspec's JSON encoder writes as ``null``. Asked only of a body whose
    JSON holds ``null``: a body without one costs a bytes search, not a walk. Nulls are
    mostly Nones: msgpack (which keeps a NaN a NaN) tells them apart in C, and only a
    body whose msgpack may hold one is walked."""
    try:
        if _packed_non_finite(_msgpack_encode(body)) is None:
            return
    except _ENCODE_ERRORS:
        pass  # what msgpack cannot hold (an int over 64 bits): the walk decides
    try:
        plain = msgspec.to_builtins(body)
    except _ENCODE_ERRORS:  # what it cannot convert (msgspec.Raw): no float to look at
        return
    found = _non_finite(plain)
    if found is not None:
        path, value = found
        raise BodyEncodeError(
            f"message to stream {stream.shown()}: its body holds {value!r} "
            f"at {path}, a float JSON cannot carry (it would arrive as null); nothing was "
            "sent: send None or a string instead, or publish it as application/msgpack")


def _refuse_key_clash(stream: StreamId, data: bytes) -> None:
    """Raise :class:`BodyEncodeError` if ``data``, the JSON of a body with a key that is
    no str, holds one key twice in an object: JSON's keys are text, so ``1`` and
    ``"1"`` (or ``1.5`` and ``"1.5"``, an enum member and its value) are written alike,
    and a decoder keeps only the last. Keys that are written apart go, as text. Read
    back and written again in C first: JSON that holds no key twice comes out as long
    (a msgspec.Raw's spaces aside), and only JSON that does not is read pair by pair."""
    try:
        if len(_json_encode(msgspec.json.decode(data))) == len(data):
            return
    except _ENCODE_ERRORS:  # a msgspec.Raw that is no JSON: no key of ours in it
        return
    twice: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        found = dict(items)
        if len(found) < len(items) and not twice:
            seen: set[str] = set()
            twice.extend(k for k, _ in items if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        return found

    try:
        json.loads(data, object_pairs_hook=pairs)
    except (ValueError, RecursionError):  # too deep for the json module
        return
    if twice:
        raise BodyEncodeError(
            f"message to stream {stream.shown()}: its body cannot be encoded as JSON: two "
            f"keys of one object are both {json.dumps(twice[0])} there (JSON's keys are "
            "text), one would be lost; nothing was sent: give an object's keys one type, "
            "or publish it as application/msgpack")


def _non_finite(value: Any) -> tuple[str, float] | None:
    """A NaN or infinity in ``value`` (dicts, lists, tuples and scalars, as
    :func:`msgspec.to_builtins` returns them), with its path (``$.items[2].price``); None
    if there is none. Walks with a stack: no depth is too deep."""
    if type(value) is float:
        return None if math.isfinite(value) else ("$", value)
    isfinite = math.isfinite
    stack: list[tuple[Any, str]] = [(value, "$")]
    while stack:
        node, path = stack.pop()
        for name, item in node.items() if type(node) is dict else enumerate(node):
            kind = type(item)
            if kind is float:
                if not isfinite(item):
                    return _step(path, node, name), item
            elif kind is dict or kind is list or kind is tuple:
                stack.append((item, _step(path, node, name)))
    return None


def _step(path: str, node: Any, name: Any) -> str:
    if type(node) is dict:
        return f"{path}.{name}" if type(name) is str else f"{path}[{name!r}]"
    return f"{path}[{name}]"


def coalesce_linger_for(publish: PublishConfig, adapter: QueueAdapter) -> float | None:
    """``[publish]`` as a :class:`Client`'s ``coalesce_linger_s`` on ``adapter``: None
    when calls are not gathered — ``coalesce`` off, or an adapter that gathers sends
    itself or has no round trip to share (``QueueAdapter.coalesce_publishes``)."""
    if not (publish.coalesce and adapter.coalesce_publishes):
        return None
    return publish.linger_ms / 1000


class Client:
    """Publishes to streams: ``await client.publish("orders", order_id, order)``.

    Messages of one stream land on one queue (chosen by the hash ring), so they are
    delivered in the order they were published. Holds the adapter's connections;
    close it (or use ``async with``) when done: closing sends what is still waiting.

    ``coalesce_linger_s``: None sends each ``publish`` on its own; a number gathers the
    calls made concurrently into rounds, one send for all queues
    (:mod:`conveyor.platform.coalescer`), the first waiting that long for others (0: one
    loop turn). :meth:`from_config` (and a
    worker daemon, for the client it hands to startup hooks) takes it from ``[publish]``
    (:func:`coalesce_linger_for`).

    ``max_body_bytes``: a message whose body is larger is refused before anything is
    sent (``[queues] max_body_bytes``).
    """

    def __init__(
        self,
        adapter: QueueAdapter,
        mapper: HashRingQueueMapper,
        *,
        telemetry: Telemetry | None = None,
        owns_adapter: bool = False,
        owns_telemetry: bool = False,
        coalesce_linger_s: float | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self.adapter = adapter
        self.mapper = mapper
        self.telemetry = telemetry or Telemetry.disabled()
        self._traced = self.telemetry.tracer is not None
        self._owns_adapter = owns_adapter
        self._owns_telemetry = owns_telemetry
        # namespace -> stream key -> (queue, StreamId): by namespace, so a look-up
        # builds no (namespace, key) tuple; ``_remembered`` counts the streams held.
        self._streams: dict[str, dict[str, tuple[int, StreamId]]] = {}
        self._remembered = 0
        self.coalesce_linger_s = coalesce_linger_s
        self.max_body_bytes = max_body_bytes
        self._coalescer = (None if coalesce_linger_s is None else PublishCoalescer(
            adapter.enqueue_queues, coalesce_linger_s,
            together=adapter.publishes_queues_together))
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        """The event loop of the first publish: its connections and rounds are bound to
        it, so a publish from another loop is refused (:meth:`_on_its_loop`)."""

    @classmethod
    def from_config(cls, config: Config) -> Client:
        require_config(config, "Client.from_config(config)")
        adapter = create_adapter(config.queues.adapter, config)
        return cls(
            adapter,
            HashRingQueueMapper(config.queues.total),
            telemetry=Telemetry.from_config(config.telemetry),
            owns_adapter=True,
            owns_telemetry=True,
            coalesce_linger_s=coalesce_linger_for(config.publish, adapter),
            max_body_bytes=config.queues.max_body_bytes,
        )

    def build(
        self,
        namespace: str,
        key: str,
        body: Any,
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> Message:
        """The message ``publish`` would send (a fresh id, stamped now)."""
        return self._build(namespace, key, body, headers, content_type, now_ms(),
                           new_message_id())

    def _build(self, namespace: str, key: str, body: Any, headers: Mapping[str, str] | None,
               content_type: str | None, stamp: int, ident: str) -> Message:
        stream = self._stream(namespace, key)[1]
        data, ctype = encode_body(body, content_type, stream)
        if len(data) > self.max_body_bytes:
            raise self._too_large(namespace, key, data)
        return Message(ident, stream, data,
                       self._own_headers(headers, stream) if headers else {}, ctype, 0, stamp)

    def _too_large(self, namespace: str, key: str, data: bytes) -> MessageTooLargeError:
        return MessageTooLargeError(
            f"message to stream {shown_name(namespace)}/{shown_name(key)}: its body of "
            f"{len(data)} bytes is larger than $.queues.max_body_bytes "
            f"({self.max_body_bytes}); nothing was sent: raise the limit, or store the data "
            "elsewhere and send a reference"
        )

    def _own_headers(self, headers: Mapping[str, str], stream: StreamId) -> dict[str, str]:
        """A copy of a message's own headers (tracing writes its context into it), none
        of them a name the wire format reserves, no more than the adapter writes. A
        message without headers gets a fresh empty dict."""
        try:
            hdrs = dict(headers)
        except (TypeError, ValueError):  # what dict() cannot read as pairs: a str, an int
            raise InvalidArgumentError(
                f"message to stream {stream.shown()}: headers {headers!r:.80} "
                f"({type(headers).__name__}): expected a mapping of header names to values "
                "(str to str); nothing was sent") from None
        most = self.adapter.max_headers
        if most is not None and len(hdrs) > most:
            raise MessageTooLargeError(
                f"message to stream {stream.shown()}: its {len(hdrs):,} headers are more "
                f"than the {self.adapter.name} adapter writes ({most:,} at most); nothing "
                "was sent")
        clash = RESERVED_HEADERS.intersection(hdrs)
        if clash:
            raise InvalidArgumentError(
                f"headers {sorted(clash)} are reserved by Conveyor's wire format")
        if "" in hdrs:  # as `conveyor publish -H =v` is refused: a name names something
            raise InvalidArgumentError(
                f"message to stream {stream.shown()}: a header has an empty name (its value "
                f"{hdrs['']!r:.80}): a header's name is non-empty text; nothing was sent")
        size = 0
        for name, value in hdrs.items():
            if not (_is_text(name) and _is_text(value)):
                raise InvalidArgumentError(
                    f"header {name!r}: {value!r} ({type(value).__name__}): header names and "
                    "values are text that UTF-8 can encode (str); nothing was sent")
            size += _utf8_len(name) + _utf8_len(value)
        if size > MAX_HEADER_BYTES:
            raise _headers_too_large(stream, hdrs, size)
        return hdrs

    def _stream(self, namespace: str, key: str) -> tuple[int, StreamId]:
        """A stream's queue and id, remembered: hashing it costs more than a look-up, and
        the messages of one stream share one :class:`StreamId`."""
        streams = self._streams.get(namespace)
        known = None if streams is None else streams.get(key)
        if known is None:
            if not namespace:
                raise InvalidArgumentError("namespace must be a non-empty string")
            if not (_is_text(namespace) and _is_text(key)):
                raise InvalidArgumentError(
                    f"stream {shown_any(namespace)}/{shown_any(key)}: a namespace and a "
                    "stream key are text that UTF-8 can encode (str); nothing was sent")
            problem = namespace_problem(namespace)
            if problem is not None:
                problem = f"its namespace {problem}"
            elif (problem := key_problem(key)) is not None:
                problem = f"its stream key {problem}"
            if problem is not None:
                raise InvalidArgumentError(
                    f"stream {shown_any(namespace)}/{shown_any(key)}: {problem}; nothing "
                    "was sent")
            if self._remembered >= _STREAMS_REMEMBERED:
                self._streams.clear()
                self._remembered, streams = 0, None
            if streams is None:
                streams = self._streams[namespace] = {}
            stream = StreamId(namespace, key)
            known = streams[key] = (self.mapper.queue_for_key(namespace, stream.key), stream)
            self._remembered += 1
        return known

    def queue_for(self, namespace: str, key: str) -> int:
        """The queue of a stream."""
        return self._stream(namespace, key)[0]

    async def publish(
        self,
        namespace: str,
        key: str,
        body: Any,
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> SequenceToken:
        """Publish one message; returns once it is stored (its position in the queue).

        ``content_type`` None or ``""`` is the default: JSON (what every adapter reads an
        empty content type as), or the encoding of a ``bytes`` or ``str`` body as given.

        ``headers``: a ``traceparent`` (with its ``tracestate``) given here is, traced,
        the publish span's parent in place of the current span, and the message carries
        the span's own pair; untraced, both go as given (docs/telemetry.md).

        Raises :class:`~conveyor.PublishUncertain` when the broker may or may not have
        stored it (see the README's delivery guarantee).
        """
        if self._closed:
            raise _closed_error()
        if asyncio.get_running_loop() is not self._loop:
            self._on_its_loop()
        msg = self.build(namespace, key, body, headers, content_type)
        queue = self.queue_for(namespace, msg.stream.key)
        if not self._traced:
            return await self._send(queue, msg)
        span = self.telemetry.publish_span(msg, self.adapter.name, queue)
        try:
            return await self._send(queue, msg)
        except BaseException as exc:
            _failed(span, exc)
            raise
        finally:
            span.end()

    def bind_to_running_loop(self) -> None:
        """Serve publishes from the running event loop only, as a client's first publish
        binds it to its loop. A :class:`~conveyor.WorkerDaemon` binds the client it
        hands its startup hooks as it starts, so that no handler's thread is first."""
        self._loop = asyncio.get_running_loop()

    def _on_its_loop(self) -> None:
        """Bind the client to the running loop at its first publish; refuse a publish
        from any other (a ``def`` handler's thread running ``asyncio.run``): the
        adapter's connections, and the rounds publishes join, belong to the first loop.
        Redis took such a publish into the other loop's round, stored it, then failed
        the call (a retry doubled it), and left a connection of the dead loop in the
        pool."""
        if self._loop is None:
            self.bind_to_running_loop()
            return
        raise ConveyorError(
            "this Client belongs to another event loop, which holds its connections (a "
            "plain `def` handler's thread, or a second asyncio.run()): await its publishes "
            "on that loop — declare the handler `async def`, or from a thread hand them to "
            "it with asyncio.run_coroutine_threadsafe(client.publish(...), loop); nothing "
            "was sent")

    async def _send(self, queue: int, msg: Message) -> SequenceToken:
        if self._coalescer is not None:
            return await self._coalescer.submit(queue, msg)
        return (await self.adapter.enqueue(queue, [msg]))[0]

    async def publish_batch(self, items: Iterable[Publish]) -> list[SequenceToken]:
        """Publish many messages with one enqueue per queue; returns tokens in input order.

        The queues' enqueues run concurrently; each writes its messages once however
        often the adapter retries it (see the README's delivery guarantee). Concurrently,
        not in one ``enqueue_queues`` (one pipeline on Redis): then the server works on
        one queue's messages while the client encodes the next queue's; one pipeline was
        measured no faster (docs/performance.md, "Single publishes"). A message
        that cannot be built (a body over ``max_body_bytes`` or that cannot be encoded, a
        reserved header) refuses the whole batch before anything is sent.

        When some queues' messages were stored and others not, raises
        :class:`~conveyor.PartialPublishError` naming each message's fate (publish
        ``exc.not_published(items)`` again: that doubles nothing). When nothing was
        stored, the error of the send that failed; when nothing is known to be stored
        and some may be, :class:`~conveyor.PublishUncertain`.
        """
        if self._closed:
            raise _closed_error()
        if asyncio.get_running_loop() is not self._loop:
            self._on_its_loop()
        if not isinstance(items, Sequence):
            try:
                items = list(items)
            except TypeError:
                raise InvalidArgumentError(
                    f"publish_batch: expected an iterable of conveyor.Publish, got "
                    f"{type(items).__name__} {items!r:.80}; nothing was sent") from None
        ids = new_message_ids(len(items))
        spans: list[Span] = []
        try:
            by_queue = self._by_queue(items, ids, spans if self._traced else None)
            results = await asyncio.gather(
                *(self.adapter.enqueue(q, msgs) for q, (_, msgs) in by_queue.items()),
                return_exceptions=True,
            )
            if spans:  # the spans of a queue whose enqueue failed end in its error
                for (positions, _), outcome in zip(by_queue.values(), results, strict=True):
                    if isinstance(outcome, BaseException):
                        for i in positions:
                            _failed(spans[i], outcome)
        except BaseException as exc:  # refused before sending, or cancelled: every span
            for span in spans:
                _failed(span, exc)
            raise
        finally:
            for span in spans:
                span.end()
        only = results[0] if len(results) == 1 else None
        if isinstance(only, list) and len(only) == len(items):
            return only  # one queue: its tokens are in the items' order already
        tokens: list[SequenceToken] = [_NO_TOKEN] * len(items)
        failures: list[tuple[list[str], BaseException]] = []
        for (positions, msgs), outcome in zip(by_queue.values(), results, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, ConveyorError):  # a bug, or a cancellation
                    raise outcome
                failures.append(([m.id for m in msgs], outcome))
                continue
            for i, token in zip(positions, outcome, strict=True):
                tokens[i] = token
        if failures:
            published = {ident: token for ident, token in zip(ids, tokens, strict=True)
                         if token is not _NO_TOKEN}
            raise publish_failure("publish_batch", ids, published, failures)
        return tokens

    def _by_queue(self, items: Sequence[Publish], ids: Sequence[str], spans: list[Span] | None
                  ) -> dict[int, tuple[list[int], list[Message]]]:
        """``items`` as messages (ids from ``ids``, stamped now) grouped by queue, with
        their positions in ``items``; traced (``spans`` given), a publish span started
        for each. :meth:`_build` and :meth:`queue_for` of each item, inlined: the common
        one (an object body sent as JSON, no headers, a stream seen before) costs no call.
        Its JSON is searched for ``null`` (NaN, infinity) once for the batch, joined: a
        search a message costs more than the search; and its bodies are encoded again in
        one call, sorted, which only keys that are all str allow (a key that is not may
        be written like another: :func:`_refuse_key_clash`).
        """
        stamp, limit, known = now_ms(), self.max_body_bytes, self._streams
        by_queue: dict[int, tuple[list[int], list[Message]]] = {}
        jsons: list[bytes] = []
        json_encoded = jsons.append
        bodies: list[dict[Any, Any]] = []  # the bodies of ``jsons``
        json_body = bodies.append
        namespace, streams = None, None  # the last item's, looked up once for a run of them
        # Traced: the current span, every message's parent, read once for the batch.
        parent = None if spans is None else current_span().get_span_context()
        try:  # free unless raised (3.11): an item that is not a Publish
            for i, item in enumerate(items):
                body, ctype, ns, key = item.body, item.content_type, item.namespace, item.key
                if ns is not namespace:
                    namespace, streams = ns, known.get(ns)
                queue_stream = None if streams is None else streams.get(key)
                if queue_stream is None:
                    queue_stream = self._stream(ns, key)
                    namespace, streams = ns, known[ns]  # _stream may have started over
                queue, stream = queue_stream
                if ctype is None and type(body) is dict:
                    try:
                        data, ctype = _json_encode(body), CONTENT_JSON
                    except _ENCODE_ERRORS as exc:
                        raise _unencodable(stream, body, None, exc) from exc
                    json_encoded(data)
                    json_body(body)
                else:
                    data, ctype = encode_body(body, ctype, stream)
                if len(data) > limit:
                    raise self._too_large(ns, key, data)
                hdrs = item.headers
                msg = Message(ids[i], stream, data,
                              self._own_headers(hdrs, stream) if hdrs else {}, ctype, 0, stamp)
                if spans is not None:
                    spans.append(self.telemetry.publish_span(msg, self.adapter.name, queue,
                                                             parent))
                placed = by_queue.get(queue)
                if placed is None:
                    placed = by_queue[queue] = ([], [])
                placed[0].append(i)
                placed[1].append(msg)
        except AttributeError:
            for i, item in enumerate(items):
                if not isinstance(item, Publish):
                    raise InvalidArgumentError(
                        f"publish_batch: item {i} is {type(item).__name__} {item!r:.80}, "
                        "not a conveyor.Publish; nothing was sent") from None
            raise
        if jsons and _has_null(b"".join(jsons)):
            for positions, msgs in by_queue.values():
                for i, msg in zip(positions, msgs, strict=True):
                    body = items[i].body
                    if items[i].content_type is None and type(body) is dict and _has_null(
                            msg.body):
                        _refuse_non_finite(msg.stream, body)
        try:
            _json_encode_sorted(bodies)
        except _ENCODE_ERRORS:  # a key that is no str in one of them at least
            for positions, msgs in by_queue.values():
                for i, msg in zip(positions, msgs, strict=True):
                    body = items[i].body
                    if items[i].content_type is None and type(body) is dict:
                        try:
                            _json_encode_sorted(body)
                        except _ENCODE_ERRORS:
                            _refuse_key_clash(msg.stream, msg.body)
        return by_queue

    async def close(self) -> None:
        """Send what ``publish`` calls left waiting, then close what the client owns.
        Once closing, a client refuses to publish (:class:`~conveyor.ShutdownError`),
        with ``publish_batch`` too, on every adapter."""
        self._closed = True
        if self._coalescer is not None:
            await self._coalescer.close()
        if self._owns_adapter:
            await self.adapter.close()
        if self._owns_telemetry:
            self.telemetry.shutdown()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _closed_error() -> ShutdownError:
    return ShutdownError("the client is closed: publish before closing it")


def _failed(span: Span, exc: BaseException) -> None:
    """Record on a producer span the error its publish ended in, as ``use_span`` does."""
    span.record_exception(exc)
    span.set_status(StatusCode.ERROR, str(exc))


_NOTHING_SENT = "; nothing was sent"


def _no_running_loop(then: str = "") -> None:
    """Refuse a :class:`SyncClient`'s construction or call where an event loop runs (an
    ``async def``): its own loop cannot run inside another, and ``asyncio.Runner``'s
    refusal left a coroutine never awaited (and a close half done); nothing is changed.
    ``then``: what the error ends with."""
    if asyncio._get_running_loop() is not None:
        raise InvalidArgumentError(
            "SyncClient blocks, and an event loop is running here: use "
            f"`Client.from_config(config)` and await its calls instead{then}")


class SyncClient:
    """A blocking wrapper for scripts: ``with SyncClient.from_config(cfg) as c: c.publish(...)``.

    Runs its own event loop; do not use it from inside a running loop. Threads may share
    one: their calls run one at a time, each returning once its messages are stored.
    Once closed (closing twice does no harm), it refuses to publish
    (:class:`~conveyor.ShutdownError`).
    """

    def __init__(self, config: Config) -> None:
        require_config(config, "SyncClient(config)")
        _no_running_loop()
        self._runner = asyncio.Runner()
        self._client = self._runner.run(self._make(config))
        # One call at a time on the loop: a second thread's Runner.run would schedule
        # its publish on the loop the first is running, then raise "already running",
        # and the message would be stored under an error (a retry doubles it).
        self._lock = threading.Lock()
        self._closed = False

    @staticmethod
    async def _make(config: Config) -> Client:
        return Client.from_config(config)

    @classmethod
    def from_config(cls, config: Config) -> SyncClient:
        return cls(config)

    def publish(
        self,
        namespace: str,
        key: str,
        body: Any,
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> SequenceToken:
        _no_running_loop(_NOTHING_SENT)
        with self._lock:
            if self._closed:
                raise _closed_error()
            return self._runner.run(
                self._client.publish(namespace, key, body, headers, content_type))

    def publish_batch(self, items: Iterable[Publish]) -> list[SequenceToken]:
        _no_running_loop(_NOTHING_SENT)
        with self._lock:
            if self._closed:
                raise _closed_error()
            return self._runner.run(self._client.publish_batch(items))

    def close(self) -> None:
        _no_running_loop()  # before it is marked closed: its loop is to close them
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._runner.run(self._client.close())
            finally:
                self._runner.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
