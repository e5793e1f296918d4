import asyncio
import dataclasses
import functools
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec
import pytest

from conveyor import App, HandlerDeclarationError, HandlerOptions, Interceptor, MessageContext
from conveyor.platform.errors import DecodeError
from conveyor.platform.ids import StreamId
from conveyor.platform.message import CONTENT_MSGPACK, Message


class Order(msgspec.Struct):
    id: int


def msg(body: bytes, content_type: str = "application/json") -> Message:
    return Message("m", StreamId("orders", "k"), body, content_type=content_type)


def test_first_parameter_type_decides_decoding() -> None:
    app = App("t")

    @app.handler("orders", name="struct")
    async def a(order: Order) -> None: ...

    @app.handler("orders", name="dict")
    async def b(body: dict[str, Any], ctx: MessageContext) -> None: ...

    @app.handler("orders", name="bytes")
    async def c(body: bytes) -> None: ...

    @app.handler("orders", name="str")
    async def d(body: str) -> None: ...

    specs = {s.name: s for s in app.handlers}
    assert specs["struct"].decode(msg(b'{"id": 3}')) == Order(3)
    packed = msg(msgspec.msgpack.encode({"id": 4}), CONTENT_MSGPACK)
    assert specs["struct"].decode(packed) == Order(4)
    assert specs["dict"].decode(msg(b'{"a": 1}')) == {"a": 1} and specs["dict"].takes_context
    assert specs["bytes"].decode(msg(b"\xff\x00")) == b"\xff\x00"
    assert specs["str"].decode(msg("héllo".encode())) == "héllo"
    assert list(app.subscriptions()) == ["orders"] and len(app.subscriptions()["orders"]) == 4


def test_optional_bytes_and_str_take_the_body_as_it_came() -> None:
    """A body is never None: ``bytes | None`` decoded JSON (a base64 string) before, so
    a raw body was dead-lettered as undecodable."""
    app = App("t")

    @app.handler("orders", name="bytes")
    async def a(body: bytes | None) -> None: ...

    @app.handler("orders", name="str")
    async def b(body: typing.Optional[str]) -> None: ...  # noqa: UP045 (its spelling)

    @app.handler("orders", name="dict")
    async def c(body: dict[str, int] | None) -> None: ...

    specs = {s.name: s for s in app.handlers}
    assert specs["bytes"].decode(msg(b"\xff\x00")) == b"\xff\x00"
    assert specs["str"].decode(msg("héllo".encode())) == "héllo"
    assert specs["dict"].decode(msg(b"null")) is None  # JSON types keep JSON's null
    assert specs["dict"].decode(msg(b'{"a": 1}')) == {"a": 1}


def test_bytearray_and_memoryview_take_the_raw_body_as_bytes_does() -> None:
    """Decoded as JSON (a base64 string), every raw body was dead-lettered."""
    app = App("t")

    @app.handler("orders", name="bytearray")
    async def a(body: bytearray) -> None: ...

    @app.handler("orders", name="view")
    async def b(body: memoryview | None) -> None: ...

    specs = {s.name: s for s in app.handlers}
    copy = specs["bytearray"].decode(msg(b"\xff\x00"))
    assert type(copy) is bytearray and copy == b"\xff\x00"
    view = specs["view"].decode(msg(b"\xff\x00"))
    assert type(view) is memoryview and view.tobytes() == b"\xff\x00"


def test_undecodable_bodies_raise_decode_error_naming_the_type() -> None:
    app = App("t")

    @app.handler("orders")
    async def a(order: Order) -> None: ...

    @app.handler("orders", name="text")
    async def b(body: str) -> None: ...

    with pytest.raises(DecodeError, match="Order"):
        app.handlers[0].decode(msg(b'{"id": "not an int"}'))
    with pytest.raises(DecodeError, match="Order"):
        app.handlers[0].decode(msg(b"not json"))
    with pytest.raises(DecodeError, match=r"cannot decode body as .*Order.*: the body is empty"):
        app.handlers[0].decode(msg(b""))
    with pytest.raises(DecodeError, match="UTF-8"):
        app.handlers[1].decode(msg(b"\xff"))


@pytest.mark.parametrize(("content_type", "body", "reason"), [
    ("application/json", b"not json", "cannot decode body as dict: JSON is malformed"),
    ("application/msgpack", b'{"n": 1}',  # JSON sent as msgpack: '{' is msgpack's 123
     "cannot decode body as dict (read as msgpack, its content type): Expected `object`, "
     "got `int`"),
    ("application/x-protobuf", b"\x08\x96\x01",  # was: "JSON is malformed", no why
     "cannot decode body as dict (read as JSON: its content type 'application/x-protobuf' "
     "is neither JSON nor msgpack): JSON is malformed"),
])
def test_a_body_that_does_not_decode_is_refused_naming_how_its_content_type_was_read(
    content_type: str, body: bytes, reason: str,
) -> None:
    app = App("t")

    @app.handler("orders")
    async def on_order(order: dict[str, int]) -> None: ...

    with pytest.raises(DecodeError) as caught:
        app.handlers[0].decode(msg(body, content_type))
    assert str(caught.value).startswith(reason), str(caught.value)


@pytest.mark.parametrize(("body", "shown"), [
    (b'{"a": "\xff"}', "b'\\xff'"),
    (b'{"a": 1, "name": "caf\xc3"}', "b'caf\\xc3'"),
    (b'["ok", ["x\xfey", 2]]', "b'x\\xfey'"),
])
def test_a_json_string_that_is_not_utf8_is_shown_whatever_msgspec_raises(
    body: bytes, shown: str,
) -> None:
    # msgspec 0.20 raised UnicodeDecodeError (holding the string); 0.21 on raise
    # DecodeError("Invalid UTF-8 encoded string"), naming no bytes: the string is found
    # in the body, so the reason reads the same with either.
    app = App("t")

    @app.handler("orders")
    async def on_order(order: dict[str, Any] | list[Any]) -> None: ...

    with pytest.raises(DecodeError) as caught:
        app.handlers[0].decode(msg(body))
    assert str(caught.value) == (
        f"cannot decode body as {_union_name()}: a string in it is not UTF-8 text: {shown}")


def _union_name() -> str:
    return str(dict[str, Any] | list[Any])


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ("def h(body: dict):\n    yield", "is a generator"),
        ("async def h(body: dict):\n    yield", "is a generator"),
        ("h = print", "not a function"),
        ("h = lambda body: None", "a lambda cannot annotate its parameter: declare the "
         "handler with `async def` \\(or `def`\\)"),
        # Was "annotate the first parameter": it is annotated, but it is `self`.
        ("class Service:\n    async def on_order(self, body: dict) -> None: ...\n"
         "h = Service.on_order", "the first parameter is 'self': declare the method of an "
         "instance, app.handler\\(...\\)\\(service.on_order\\)"),
        ("async def h(body) -> None: ...", "annotate the first parameter"),
        ("async def h() -> None: ...", "takes \\(body\\)"),
        ("async def h(body: dict, ctx: object, extra: int) -> None: ...", "takes \\(body\\)"),
        ("async def h(body: complex) -> None: ...", "cannot decode"),
        ("async def h(body: dict, ctx: int) -> None: ...",
         "second parameter 'ctx' is the message's context: annotate it MessageContext"),
        # A type msgspec cannot decode inside another: declared, every body dead-lettered.
        ("class Money:\n    pass\nasync def h(body: list[Money]) -> None: ...",
         "cannot decode message bodies into list.*no built-in decoding for .*Money"),
        ("class Money:\n    pass\nclass Bill(msgspec.Struct):\n    total: Money\n"
         "async def h(body: Bill) -> None: ...", "no built-in decoding for .*Money"),
        ("class Money:\n    pass\n@dataclasses.dataclass\nclass Bill:\n    total: Money\n"
         "async def h(body: dict[str, Bill | None]) -> None: ...",
         "no built-in decoding for .*Money"),
        # A field's type that does not resolve: a bare NameError out of App.handler.
        ("class Bill(msgspec.Struct):\n    total: 'Money'\nasync def h(body: Bill) -> None: ...",
         "cannot decode message bodies into .*Bill.* \\(name 'Money' is not defined; the types "
         "its fields name must exist at the top level of their module\\)"),
        # The context where the body goes: declared, every message dead-lettered as not
        # a MessageContext; (ctx, body) was refused as if the body were a bad context.
        ("async def h(ctx: MessageContext) -> None: ...",
         "the first parameter 'ctx' is the message's body, not its MessageContext: "
         "take \\(body, ctx\\)"),
        ("async def h(ctx: MessageContext, body: dict) -> None: ...",
         "the first parameter 'ctx' is the message's body"),
    ],
)
def test_bad_handlers_are_rejected_at_declaration(source: str, match: str) -> None:
    namespace: dict[str, Any] = {"msgspec": msgspec, "dataclasses": dataclasses,
                                 "MessageContext": MessageContext}
    exec(source, namespace)
    with pytest.raises(HandlerDeclarationError, match=match):
        App("t").handler("orders")(namespace["h"])


def test_bad_options_are_rejected_at_declaration() -> None:
    app = App("t")

    async def h(body: bytes) -> None: ...

    with pytest.raises(HandlerDeclarationError, match="attempts"):
        app.handler("orders", retry_attempts=0)(h)
    with pytest.raises(HandlerDeclarationError, match="unknown option"):
        app.handler("orders", retyr_attempts=3)
    with pytest.raises(HandlerDeclarationError, match="namespace"):
        app.handler("")(h)
    app.handler("orders")(h)
    with pytest.raises(HandlerDeclarationError, match="declared twice"):
        app.handler("orders")(h)
    with pytest.raises(HandlerDeclarationError, match="app name"):
        App("bad name!")


@pytest.mark.parametrize("name", [5, "", "shop\nforged log line", "x\x00y", "caf\udce9"])
def test_a_handler_name_that_is_not_one_line_of_text_is_refused(name: object) -> None:
    # The name goes into dead letters (cv-dl-handler), metrics labels, log lines and
    # Redis keys; name=5 was accepted (a Kafka header value must be text), and name=""
    # silently fell back to the default name.
    async def h(body: bytes) -> None: ...

    with pytest.raises(HandlerDeclarationError, match="handler's name"):
        App("t").handler("orders", name=name)(h)  # type: ignore[arg-type]
    App("t").handler("orders", name="shop.on order (v2)")(h)


def test_a_handler_named_as_the_daemon_s_total_in_its_metrics_is_refused() -> None:
    # handler="*" labels the daemon's own slot gauges: a handler of that name would
    # have its slots counted into them (and theirs into its).
    async def h(body: bytes) -> None:
        raise AssertionError("never called: the declaration is refused")

    with pytest.raises(HandlerDeclarationError, match=r"name='\*' is taken"):
        App("t").handler("orders", name="*")(h)


def test_a_namespace_no_message_could_be_published_to_is_refused() -> None:
    async def h(body: bytes) -> None: ...

    with pytest.raises(HandlerDeclarationError, match="not text UTF-8 can encode"):
        App("t").handler("caf\udce9")(h)
    # what a client refuses to publish to (a NUL, a newline, 100 kB): accepted, it
    # subscribed to messages that could never come
    for namespace, fault in (("a\x00b", r"holds a control character \('\\x00'\)"),
                             ("orders\n", r"holds a control character \('\\n'\)"),
                             ("n" * 100_000, r"characters\) is longer than 255 characters")):
        with pytest.raises(HandlerDeclarationError, match=fault) as refused:
            App("t").handler(namespace)(h)
        assert "\n" not in str(refused.value) and len(str(refused.value)) < 400
    App("t").handler("n" * 255)(h)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("retry_attempts", 2.5),
        ("retry_attempts", True),
        ("retry_attempts", "3"),
        ("retry_attempts", 0),
        ("retry_delay_s", float("nan")),
        ("retry_delay_s", "0.1"),
        ("retry_delay_s", -1),
        ("retry_max_delay_s", float("inf")),
        ("retry_max_delay_s", 10**400),  # an int past any float: OverflowError, unnamed
        ("retry_jitter_s", None),
        ("retry_multiplier", 0.5),
        ("retry_multiplier", float("nan")),
        ("retry_multiplier", False),
        # no bound: 10**18 attempts held the stream for good, and an attempt past the
        # wire's cv-attempt (2**31-1) made its dead letter unreadable
        ("retry_attempts", 10**18),
        ("retry_attempts", 2**31),
        ("max_deliveries", 10**18),
        ("max_deliveries", 2**31),
    ],
)
def test_retry_options_are_type_checked_and_named(option: str, value: object) -> None:
    async def h(body: bytes) -> None: ...

    with pytest.raises(HandlerDeclarationError, match=rf"{option} must be .* got {value!r}"):
        App("t").handler("orders", **{option: value})(h)


def test_sensible_retry_options_are_accepted() -> None:
    async def h(body: bytes) -> None: ...

    App("t").handler("orders", retry_attempts=1, retry_delay_s=0, retry_max_delay_s=2,
                     retry_jitter_s=0.5, retry_multiplier=1)(h)
    App("t").handler("orders", retry_attempts=2**31 - 1, max_deliveries=2**31 - 1)(h)


def test_a_retry_count_past_its_bound_names_the_bound() -> None:
    async def h(body: bytes) -> None: ...

    with pytest.raises(HandlerDeclarationError) as refused:
        App("t").handler("orders", max_deliveries=10**18)(h)
    assert str(refused.value).endswith(
        "max_deliveries must be an int from 1 to 2147483647 (what the wire's cv-attempt "
        "and a delivery count hold), got 1000000000000000000"), str(refused.value)


def test_the_context_parameter_may_go_unannotated() -> None:
    app = App("t")

    @app.handler("orders")
    async def h(body: dict, ctx) -> None: ...  # type: ignore[no-untyped-def, type-arg]

    assert app.handlers[0].takes_context


def test_an_app_made_with_a_name_or_interceptors_of_the_wrong_kind_is_refused_in_one_line(
) -> None:
    with pytest.raises(HandlerDeclarationError, match="app name 5"):  # was TypeError
        App(5)  # type: ignore[arg-type]
    with pytest.raises(HandlerDeclarationError, match="interceptors=5: a list of"):
        App("x", interceptors=5)  # type: ignore[arg-type]


class NoFromKeywords(HandlerOptions):
    keywords: ClassVar[frozenset[str]] = frozenset({"audit"})


class ClaimsRetry(HandlerOptions):
    keywords: ClassVar[frozenset[str]] = frozenset({"audit", "retry_attempts"})

    @classmethod
    def from_keywords(cls, where: str, given: Mapping[str, Any]) -> "ClaimsRetry | None":
        return cls() if given else None


@pytest.mark.parametrize(("options", "says"), [
    # Taken, then every handler declared on the app failed in Conveyor's own code:
    # "'int' object has no attribute 'keywords'", a bare NotImplementedError.
    (5, "options = 5: a conveyor.HandlerOptions subclass (or None)"),
    (dict, "options = <class 'dict'>: a conveyor.HandlerOptions subclass (or None)"),
    (NoFromKeywords, "options = NoFromKeywords: it does not define from_keywords, which "
     "builds its value from a handler's keywords"),
    # Two types reading one keyword: both built a value from it.
    (ClaimsRetry, "options = ClaimsRetry: keyword(s) ['retry_attempts'] belong to "
     "RetryPolicy already"),
])
def test_an_interceptor_whose_options_no_handler_could_be_declared_with_is_refused(
    options: object, says: str,
) -> None:
    class Audit(Interceptor):
        """An interceptor that changes nothing: its options, set below, are the test."""

    Audit.options = options  # type: ignore[assignment]
    with pytest.raises(HandlerDeclarationError) as refused:
        App("shop", interceptors=[Audit()])
    assert str(refused.value) == f"app 'shop': interceptor Audit: {says}"


async def test_a_partial_binding_keywords_runs_like_a_function() -> None:
    # A partial that bound a keyword was refused ("takes (body) or (body, ctx), got 3
    # parameters"): its bound keywords show as keyword-only parameters with defaults.
    from conveyor.testing import TestWorker

    app = App("t")
    seen: list[tuple[str, Any, str]] = []

    async def charge(order: Order, ctx: MessageContext, gateway: str) -> None:
        seen.append(("charge", order, f"{gateway} {ctx.handler}"))

    def render(body: bytes, *, size: int, dpi: int = 72) -> None:
        seen.append(("render", body, f"{size} {dpi}"))

    async def audit(body: dict[str, int], *, dry_run: bool = False) -> None:
        seen.append(("audit", body, f"dry_run={dry_run}"))

    app.handler("orders", name="charge")(functools.partial(charge, gateway="stripe"))
    app.handler("renders")(functools.partial(render, size=10, dpi=300))
    app.handler("audits")(audit)  # a keyword-only parameter with a default: left to it
    charging, rendering, auditing = app.handlers
    assert not auditing.takes_context
    assert (charging.takes_context, charging.sync) == (True, False)
    assert rendering.name == f"{__name__}.{render.__qualname__}" and rendering.sync
    async with TestWorker(app) as worker:
        await worker.publish("orders", "k", {"id": 7})
        await worker.publish("renders", "k", b"abc")
        await worker.publish("audits", "k", {"n": 1})
        await worker.settle()
    assert sorted(seen) == [("audit", {"n": 1}, "dry_run=False"),
                            ("charge", Order(7), "stripe charge"),
                            ("render", b"abc", "10 300")]


def test_a_partial_whose_keyword_leaves_the_body_keyword_only_is_refused_saying_why() -> None:
    app = App("t")

    async def charge(gateway: str, order: Order) -> None: ...

    async def tag(order: Order, *, region: str) -> None: ...

    with pytest.raises(HandlerDeclarationError, match=(
            r"^handler '.*charge': parameter 'order' can only be passed by keyword: it "
            r"comes after 'gateway', which the functools.partial binds by keyword, and "
            r"Conveyor passes \(body\) or \(body, ctx\) by position; bind them by "
            r"position, or move them after 'order'$")):
        app.handler("orders")(functools.partial(charge, gateway="stripe"))
    app.handler("orders")(functools.partial(charge, "stripe"))  # by position: fine
    with pytest.raises(HandlerDeclarationError, match=(
            r"keyword-only parameter 'region' has no default; Conveyor passes only "
            r"\(body\) or \(body, ctx\): give it a default or bind it with "
            r"functools.partial$")):
        app.handler("tags")(tag)
    app.handler("tags")(functools.partial(tag, region="eu"))
    with pytest.raises(HandlerDeclarationError, match=(
            r"^handler '.*charge': the functools.partial's arguments do not fit its "
            r"function: one is given twice \(by position and by keyword\) or names no "
            r"parameter$")):  # was a ValueError out of inspect
        app.handler("more")(functools.partial(charge, "stripe", gateway="x"))


def test_a_partial_and_a_staticmethod_declare_the_function_they_hold() -> None:
    # A functools.partial was refused ("cannot resolve type annotations: … is not a
    # module, class, method, or function"), and @app.handler over @staticmethod in a
    # class body taken for a plain function wrapping an `async def`.
    app = App("t")

    async def charge(gateway: str, order: Order, ctx: MessageContext) -> str:
        return f"{gateway} {order.id} {ctx.handler}"

    def render(size: int, body: bytes) -> int:
        return size + len(body)

    app.handler("orders")(functools.partial(charge, "stripe"))
    app.handler("renders")(functools.partial(render, 10))

    class Shop:
        @app.handler("refunds")
        @staticmethod
        async def refund(order: Order) -> int:
            return order.id

    assert isinstance(Shop.__dict__["refund"], staticmethod)  # the class keeps its own
    charging, rendering, refunding = app.handlers
    assert (charging.name, charging.sync, charging.takes_context) == (
        f"{__name__}.test_a_partial_and_a_staticmethod_declare_the_function_they_hold"
        ".<locals>.charge", False, True)
    assert (rendering.sync, rendering.takes_context, refunding.sync) == (True, False, False)
    assert refunding.name.endswith(".<locals>.Shop.refund")
    order = charging.decode(msg(b'{"id": 7}'))
    assert order == Order(7)
    ctx = MessageContext(msg(b"{}"), handler="h")
    assert asyncio.run(charging.fn(order, ctx)) == "stripe 7 h"
    assert rendering.fn(rendering.decode(msg(b"abc"))) == 13
    assert asyncio.run(refunding.fn(refunding.decode(msg(b'{"id": 3}')))) == 3


@pytest.mark.parametrize(("body_type", "content_type", "body"), [
    (list, "application/json", b"[" * 100_000 + b"]" * 100_000),
    (typing.Any, "application/json", b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
    (list, CONTENT_MSGPACK, b"\x91" * 100_000 + b"\x90"),  # fixarray of 1, nested
])
def test_a_body_nested_too_deeply_is_a_decode_error_saying_so(
    body_type: Any, content_type: str, body: bytes,
) -> None:
    # msgspec raises RecursionError past its depth: it escaped the decode as itself, so the
    # dead letter read "RecursionError: maximum recursion depth exceeded while
    # deserializing an object", and the testing kit's record of it raised it again.
    app = App("t")

    async def deep(body: Any) -> None: ...

    deep.__annotations__["body"] = body_type
    app.handler("orders")(deep)
    with pytest.raises(DecodeError) as caught:
        app.handlers[0].decode(msg(body, content_type))
    assert str(caught.value).startswith("cannot decode body as "), str(caught.value)
    assert str(caught.value).endswith(": it is nested too deeply"), str(caught.value)


def test_object_takes_any_value_at_the_top_and_inside() -> None:
    # msgspec decodes `object` as `Any`; a body typed `object` was refused ("no built-in
    # decoding for <class 'object'>") while `list[object]` was declared.
    app = App("t")

    @app.handler("orders")
    async def whole(body: object) -> None: ...

    @app.handler("orders")
    async def items(body: list[object]) -> None: ...

    assert [s.decode(msg(b'[1, {"a": null}]')) for s in app.handlers] == [[1, {"a": None}]] * 2


class Node(msgspec.Struct):
    children: "list[Node]"


def test_a_recursive_body_type_is_declared_and_decodes() -> None:
    # The walk that looks for types msgspec cannot decode ends on a type that holds
    # itself.
    app = App("t")

    @app.handler("trees")
    async def on_tree(tree: Node) -> None: ...

    tree = app.handlers[0].decode(msg(b'{"children": [{"children": []}]}'))
    assert tree == Node([Node([])])


LOCAL_TYPES = """
from __future__ import annotations

import msgspec


def declare(app):
    class Local(msgspec.Struct):
        id: int

    @app.handler("orders")
    async def on_order(order: Local, ctx: MessageContext) -> None: ...

    @app.handler("orders", batch_size=10)
    async def on_orders(orders: list[Local]) -> None: ...

    return Local
"""


def test_a_type_local_to_the_declaring_function_resolves_under_postponed_annotations() -> None:
    # With `from __future__ import annotations` (docs/testing.md's examples have it), a
    # handler declared in a test function on a type of that function was refused:
    # "cannot resolve type annotations: name 'Local' is not defined".
    namespace: dict[str, Any] = {"MessageContext": MessageContext}
    exec(LOCAL_TYPES, namespace)
    app = App("t")
    local = namespace["declare"](app)
    assert [spec.decode(msg(b'{"id": 7}')) for spec in app.handlers] == [local(7)] * 2
    assert app.handlers[0].takes_context


def test_a_type_defined_after_the_handler_is_refused_saying_to_define_it_first() -> None:
    namespace: dict[str, Any] = {}
    exec("from __future__ import annotations\n"
         "async def h(order: Later) -> None: ...\n", namespace)
    with pytest.raises(HandlerDeclarationError) as refused:
        App("t").handler("orders")(namespace["h"])
    assert str(refused.value) == (
        "handler 'h': cannot resolve type annotations: name 'Later' is not defined "
        "(a type named in an annotation must exist when the handler is declared: define "
        "it above the handler)")


@pytest.mark.parametrize("source", [
    "async def hook() -> None: ...",
    "async def hook(client, region) -> None: ...",
    "async def hook(*, client) -> None: ...",
])
def test_a_startup_hook_that_cannot_take_the_client_is_refused_at_declaration(
    source: str,
) -> None:
    # It was declared, then each daemon's start called it with its client and logged
    # "TypeError: hook() takes 0 positional arguments but 1 was given".
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    with pytest.raises(HandlerDeclarationError) as refused:
        App("t").startup(namespace["hook"])
    assert str(refused.value).startswith(
        "startup hook 'hook': a daemon calls it with one argument, its conveyor.Client: "
        "declare it `async def hook(client: conveyor.Client)` ("), str(refused.value)


def test_a_startup_hook_may_take_more_with_defaults() -> None:
    async def hook(client: Any, region: str = "eu", *rest: Any, **options: Any) -> None: ...

    assert App("t").startup(hook) is hook


def test_a_startup_hook_partial_binding_all_but_the_client_is_declared() -> None:
    async def hook(region: str, client: Any) -> None: ...

    bound = functools.partial(hook, "eu")
    assert App("t").startup(bound) is bound
    with pytest.raises(HandlerDeclarationError, match=r"startup hook functools.partial\("):
        App("t").startup(functools.partial(bound, None))


def test_a_batch_of_message_contexts_is_refused_at_declaration() -> None:
    # Declared, every message was dead-lettered: its body decoded as a MessageContext.
    async def on_batch(contexts: list[MessageContext]) -> None: ...

    with pytest.raises(HandlerDeclarationError) as refused:
        App("t").handler("orders", batch_size=10)(on_batch)
    assert str(refused.value).endswith(
        "a batch handler's list[T] holds the bodies (T decodes each), not their "
        "MessageContext")


def test_the_handler_decorator_without_its_namespace_is_refused_not_a_silent_no_op() -> None:
    # `@app.handler` without (namespace) declared nothing, raised nothing, and left the
    # module's `on_order` bound to Conveyor's inner decorator.
    app = App("shop")

    async def on_order(order: Order) -> None: ...

    with pytest.raises(HandlerDeclarationError) as refused:
        app.handler(on_order)  # type: ignore[arg-type]
    assert str(refused.value) == (
        'app.handler(namespace) declares a handler: write @app.handler("orders") above '
        f"{on_order.__qualname__!r}, with the namespace it handles, not @app.handler")
    assert app.handlers == []
