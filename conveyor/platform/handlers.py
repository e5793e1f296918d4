"""Handler declarations: validated when declared, compiled to a fast decode path."""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import msgspec.inspect

from conveyor.platform.errors import DecodeError, HandlerDeclarationError
from conveyor.platform.ids import CONTROL, namespace_refusal, shown_any
from conveyor.platform.message import CONTENT_JSON, CONTENT_MSGPACK, Message, not_utf8
from conveyor.platform.options import BatchOptions, HandlerOptions, RetryPolicy

OptionT = TypeVar("OptionT", bound=HandlerOptions)

HandlerFn = Callable[..., Any]
"""An ``async def`` handler, or a plain ``def`` one (run on a thread: ``HandlerSpec.sync``)."""
Decode = Callable[[Message], Any]


class MessageContext(msgspec.Struct, frozen=True):
    """Handed to handlers that take a second parameter: the message's metadata."""

    message: Message
    handler: str

    @property
    def headers(self) -> Mapping[str, str]:
        """The message's headers, read-only: the message is shared by every handler of
        its namespace, and its dead letter keeps it as it came."""
        return types.MappingProxyType(self.message.headers)

    @property
    def attempt(self) -> int:
        return self.message.attempt

    @property
    def deliveries(self) -> int:
        """Times the broker has handed this message to a worker, this one included:
        above 1, a worker crashed or lost the queue while holding it (see
        ``max_deliveries``)."""
        return self.message.deliveries


def body_bytes(m: Message) -> bytes:
    """The decode of a handler taking ``bytes``: the body as it came (steps that see
    ``decode is body_bytes`` may read ``m.body`` themselves and save the call)."""
    return m.body


_UNIONS = (typing.Union, types.UnionType)


def raw_or_text(tp: Any) -> Any:
    """``bytes`` or ``str`` for ``bytes | None`` / ``Optional[str]`` (a body is never
    None: the ``None`` could only make a raw body decode as JSON, a base64 string for
    ``bytes``; ``bytearray`` and ``memoryview`` likewise); ``tp`` otherwise."""
    args = typing.get_args(tp)
    if len(args) == 2 and type(None) in args and typing.get_origin(tp) in _UNIONS:
        other = args[0] if args[1] is type(None) else args[1]
        if other in _RAW or other is str:
            return other
    return tp


_RAW: dict[Any, Decode] = {
    bytes: body_bytes,
    bytearray: lambda m: bytearray(m.body),
    memoryview: lambda m: memoryview(m.body),
}
"""The raw body's types, and their decodes: the bytes as they came."""


def _body_decoder(tp: Any, where: str) -> Decode:
    """A function from message to handler argument, chosen once per handler."""
    tp = raw_or_text(tp)
    raw = _RAW.get(tp)
    if raw is not None:
        return raw
    if tp is str:
        def decode_text(m: Message) -> str:
            try:
                return m.body.decode()
            except UnicodeDecodeError as exc:
                raise DecodeError(f"body is not UTF-8: {exc}") from None
        return decode_text

    def undecodable(why: object) -> HandlerDeclarationError:
        return HandlerDeclarationError(
            f"{where}: cannot decode message bodies into {tp!r} ({why}); "
            "use a msgspec Struct, dict, list, bytes (bytearray, memoryview) or str"
        )

    try:
        custom = _custom_part(tp)
        if custom is not None:
            raise undecodable(f"msgspec has no built-in decoding for {custom!r}")
        json_dec: msgspec.json.Decoder[Any] = msgspec.json.Decoder(tp)
        pack_dec: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(tp)
    except TypeError as exc:
        raise undecodable(exc) from None
    except NameError as exc:  # a field's annotation, resolved by msgspec in its module
        raise undecodable(f"{exc}; the types its fields name must exist at the top level "
                          "of their module") from None
    type_name = getattr(tp, "__name__", str(tp))
    json_decode = json_dec.decode
    pack_decode = pack_dec.decode

    def decode(m: Message) -> Any:
        try:
            if m.content_type == CONTENT_MSGPACK:
                return pack_decode(m.body)
            return json_decode(m.body)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError,
                UnicodeDecodeError) as exc:
            # RecursionError: msgspec's own, for a body nested past its depth;
            # UnicodeDecodeError: a string of it (its bytes, the position in them).
            why = ("the body is empty" if not m.body  # not "truncated"
                   else "it is nested too deeply" if isinstance(exc, RecursionError)
                   else not_utf8("a string in it", exc.object)
                   if isinstance(exc, UnicodeDecodeError)
                   else _string_not_utf8(m) if str(exc) == MSGSPEC_NOT_UTF8 else str(exc))
            raise DecodeError(f"cannot decode body as {type_name}"
                              f"{_read_as(m.content_type)}: {why}") from None

    return decode


MSGSPEC_NOT_UTF8 = "Invalid UTF-8 encoded string"
"""msgspec's DecodeError for a string that is not UTF-8, from 0.21 on; 0.20 and before
raised the UnicodeDecodeError itself, which holds the string's bytes."""


def _string_not_utf8(m: Message) -> str:
    """Why ``m``'s body did not decode, when msgspec said only that a string of it is
    not UTF-8: in a JSON body the string is found (the text between the quotes around
    the first byte that is not UTF-8; a display aid, escaped quotes are not followed);
    a msgpack string's bytes are not looked for."""
    body = bytes(m.body)
    if m.content_type != CONTENT_MSGPACK:
        try:
            body.decode()
        except UnicodeDecodeError as exc:
            start = body.rfind(b'"', 0, exc.start) + 1
            end = body.find(b'"', exc.start)
            return not_utf8("a string in it", body[start:end if end >= 0 else len(body)])
    return "a string in it is not UTF-8 text"


def _custom_part(tp: Any) -> Any:
    """The first type in ``tp`` — itself, an item of a list, a field of a Struct or a
    dataclass, a member of a union — that msgspec decodes only with a hook, which
    Conveyor does not give it (every body would be dead-lettered); None if none is.
    Raises TypeError for a type msgspec does not take at all."""
    Type, Field = msgspec.inspect.Type, msgspec.inspect.Field
    seen: set[int] = set()
    stack: list[Any] = [msgspec.inspect.type_info(tp)]
    while stack:
        node = stack.pop()
        if id(node) in seen:  # a type that holds itself is one node, reached again
            continue
        seen.add(id(node))
        if isinstance(node, msgspec.inspect.CustomType) and node.cls is not object:
            return node.cls  # (``object`` decodes any value, as ``Any`` does)
        for name in node.__struct_fields__:
            value = getattr(node, name)
            for item in value if isinstance(value, tuple) else (value,):
                item = item.type if isinstance(item, Field) else item
                if isinstance(item, Type):
                    stack.append(item)
    return None


def _read_as(content_type: str) -> str:
    """How a body that did not decode was read, when its content type is not JSON's: a
    handler of a typed body reads msgpack as msgpack and any other type as JSON."""
    if content_type == CONTENT_JSON:
        return ""
    if content_type == CONTENT_MSGPACK:
        return " (read as msgpack, its content type)"
    return f" (read as JSON: its content type {content_type[:60]!r} is neither JSON nor msgpack)"


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """One declared handler: its function, how its bodies decode, its options."""

    name: str
    namespace: str
    fn: HandlerFn
    decode: Decode
    takes_context: bool
    options: Mapping[type[HandlerOptions], HandlerOptions]
    sync: bool = False
    """A plain ``def``: each call runs on a thread of the daemon's handler threads
    (``conveyor.workers.threads``), holding its slot while the thread runs. Decided here,
    once, so the chain is built for one kind or the other."""

    def option(self, option_type: type[OptionT]) -> OptionT | None:
        """This handler's value of ``option_type``, or None if it does not use it."""
        value = self.options.get(option_type)
        return value if value is None or isinstance(value, option_type) else None

    @property
    def retry(self) -> RetryPolicy:
        return self.option(RetryPolicy) or RetryPolicy()

    @property
    def batch(self) -> BatchOptions | None:
        """The batch settings of a ``batch_size=N`` handler, else None."""
        return self.option(BatchOptions)


def build_spec(
    fn: HandlerFn,
    namespace: str,
    *,
    name: str | None,
    options: Mapping[type[HandlerOptions], HandlerOptions],
    local_names: Mapping[str, Any] | None = None,
) -> HandlerSpec:
    """The spec of ``fn``, checked. ``local_names``: the names of the scope declaring it
    (the decorator's caller), where an annotation its module's names do not resolve is
    looked up (a type local to a test function, under ``from __future__ import
    annotations``)."""
    if isinstance(fn, staticmethod):  # declared in a class body: the function it holds
        fn = fn.__func__
    where = handler_where(fn)
    problem = namespace_refusal(namespace)
    if problem is not None:  # what no client publishes to
        raise HandlerDeclarationError(
            f"{where}: namespace {shown_any(namespace)} {problem}: no message could be "
            "published to it")
    if name is not None and not (isinstance(name, str) and name and _is_utf8(name)
                                 and not CONTROL.search(name)):
        # The name goes into dead letters (cv-dl-handler), metrics labels, log lines,
        # Redis keys and `conveyor dlq --handler`: text, one line of it.
        raise HandlerDeclarationError(
            f"{where}: name={name!r}: a handler's name is non-empty text without "
            "control characters (a str)")
    if name == "*":
        raise HandlerDeclarationError(
            f"{where}: name='*' is taken: a handler's name labels its metrics, where "
            'handler="*" is the daemon\'s total')
    sync = _is_sync(fn, where)
    params = _passed_params(fn, where)
    hints = _type_hints(handler_function(fn), where, local_names)
    body_type = hints.get(params[0].name)
    if body_type is None:
        _unannotated(fn, params, where)
        raise HandlerDeclarationError(
            f"{where}: annotate the first parameter with the body's type "
            "(a msgspec Struct, dict, bytes or str) so Conveyor knows how to decode it"
        )
    if body_type is MessageContext:
        raise HandlerDeclarationError(
            f"{where}: the first parameter {params[0].name!r} is the message's body, not "
            "its MessageContext: take (body, ctx), the body first, annotated with its type")
    if BatchOptions in options:
        body_type = _batch_element(body_type, len(params), where)
        if body_type is MessageContext:
            raise HandlerDeclarationError(
                f"{where}: a batch handler's list[T] holds the bodies (T decodes each), "
                "not their MessageContext")
    if len(params) == 2:
        ctx_type = hints.get(params[1].name)
        if ctx_type is not None and ctx_type is not MessageContext:
            # Unannotated is fine; another type is a mistake the first call would hide.
            raise HandlerDeclarationError(
                f"{where}: the second parameter {params[1].name!r} is the message's "
                f"context: annotate it MessageContext (or not at all), not {ctx_type!r}")
    return HandlerSpec(
        name=name or _default_name(handler_function(fn)),
        namespace=namespace,
        fn=fn,
        decode=_body_decoder(body_type, where),
        takes_context=len(params) == 2,
        options=dict(options),
        sync=sync,
    )


def _unannotated(fn: Any, params: list[inspect.Parameter], where: str) -> None:
    """Say why the first parameter has no annotation when the reason is known: a lambda
    cannot have one; ``self`` is a method taken from its class, not from an instance."""
    if getattr(handler_function(fn), "__name__", "") == "<lambda>":
        raise HandlerDeclarationError(
            f"{where}: a lambda cannot annotate its parameter: declare the handler with "
            "`async def` (or `def`), its first parameter annotated with the body's type")
    if params[0].name == "self" and len(params) > 1:
        method = getattr(handler_function(fn), "__name__", "on_message")
        raise HandlerDeclarationError(
            f"{where}: the first parameter is 'self': declare the method of an instance, "
            f"app.handler(...)(service.{method})")


def _type_hints(fn: Any, where: str, local_names: Mapping[str, Any] | None) -> dict[str, Any]:
    """``fn``'s annotations, resolved in its module, then (a name the module lacks) also
    in ``local_names``."""
    try:
        try:
            return typing.get_type_hints(fn)
        except NameError:
            if local_names is None:
                raise
            return typing.get_type_hints(fn, localns=dict(local_names))
    except NameError as exc:
        raise HandlerDeclarationError(
            f"{where}: cannot resolve type annotations: {exc} (a type named in an "
            "annotation must exist when the handler is declared: define it above the "
            "handler)") from None
    except Exception as exc:
        raise HandlerDeclarationError(f"{where}: cannot resolve type annotations: {exc}") from None


def _is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _is_sync(fn: Any, where: str) -> bool:
    """Whether ``fn`` is a plain ``def`` handler (False: ``async def``); refuses the
    shapes that are neither: generators, and callables that are not functions."""
    if inspect.iscoroutinefunction(fn):
        return False
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise HandlerDeclarationError(
            f"{where}: is a generator (it has `yield`); a handler returns when the message "
            "is handled: declare it `async def` or `def` without `yield`"
        )
    plain = inspect.unwrap(fn.func if isinstance(fn, functools.partial) else fn)
    if not (inspect.isfunction(plain) or inspect.ismethod(plain)):
        raise HandlerDeclarationError(
            f"{where}: is a {type(fn).__name__}, not a function; declare the handler with "
            "`async def` (or a plain `def`, which runs on a thread)"
        )
    if inspect.iscoroutinefunction(plain):
        raise HandlerDeclarationError(
            f"{where}: a plain function wrapping an `async def` (a decorator?): it would "
            "return a coroutine nobody awaits; make the wrapper `async def` too"
        )
    return True


def _batch_element(annotation: Any, params: int, where: str) -> Any:
    """The element type ``T`` of a batch handler's ``list[T]``: how each body decodes."""
    if params != 1:
        raise HandlerDeclarationError(
            f"{where}: a batch handler (batch_size) takes one parameter, list[T], "
            f"got {params}"
        )
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is not list or len(args) != 1:
        raise HandlerDeclarationError(
            f"{where}: a batch handler (batch_size) annotates its parameter list[T] "
            f"(T decodes each body), got {annotation!r}"
        )
    return args[0]


def _passed_params(fn: Any, where: str) -> list[inspect.Parameter]:
    """The parameters a call passes by position: (body) or (body, ctx). Keyword-only
    ones are left to their defaults — a function's own, or the keywords a
    ``functools.partial`` binds — and refused without one (nothing could fill them)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except ValueError:  # "partial object ... has incorrect arguments"
        raise HandlerDeclarationError(
            f"{where}: the functools.partial's arguments do not fit its function: one is "
            "given twice (by position and by keyword) or names no parameter") from None
    passed = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    free = [p for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    own = inspect.signature(handler_function(fn)).parameters
    if free and own[free[0].name].kind is not free[0].kind:
        # partial(f, region="eu") over f(region, body): every parameter after a bound
        # keyword can only be passed by keyword, so the body cannot reach it.
        bound = ", ".join(map(repr, getattr(fn, "keywords", {})))
        raise HandlerDeclarationError(
            f"{where}: parameter {free[0].name!r} can only be passed by keyword: it comes "
            f"after {bound}, which the functools.partial binds by keyword, and Conveyor "
            "passes (body) or (body, ctx) by position; bind them by position, or move "
            f"them after {free[0].name!r}")
    if free:
        raise HandlerDeclarationError(
            f"{where}: keyword-only parameter {free[0].name!r} has no default; Conveyor "
            "passes only (body) or (body, ctx): give it a default or bind it with "
            "functools.partial")
    if not 1 <= len(passed) <= 2 or any(
        p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params
    ):
        raise HandlerDeclarationError(
            f"{where}: takes (body) or (body, ctx: MessageContext), got {len(params)} parameters"
        )
    return passed


def handler_function(fn: Any) -> Any:
    """The function a ``functools.partial`` calls (its annotations, name and docstring are
    the handler's; the partial's signature says which parameters are left); ``fn`` else."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _default_name(fn: Any) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def handler_where(fn: Any) -> str:
    """How errors name a handler: ``handler 'on_order'``."""
    fn = handler_function(fn)
    return f"handler {getattr(fn, '__qualname__', fn)!r}"
