"""The application object: a named set of handlers."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from conveyor.platform.errors import HandlerDeclarationError
from conveyor.platform.handlers import HandlerFn, HandlerSpec, RetryPolicy, build_spec

if TYPE_CHECKING:
    from conveyor.platform.client import Client

F = TypeVar("F", bound=HandlerFn)
Hook = Callable[["Client"], Coroutine[Any, Any, None]]


class App:
    """Holds handlers. Its ``name`` is the consumer group: daemons of one app share work.

    ::

        app = conveyor.App("shop")

        @app.handler("orders")
        async def on_order(order: Order) -> None: ...
    """

    def __init__(self, name: str) -> None:
        if not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise HandlerDeclarationError(
                f"app name {name!r}: use letters, digits, '-', '_' or '.' (it names the "
                "consumer group on the broker)"
            )
        self.name = name
        self.handlers: list[HandlerSpec] = []
        self.on_startup: list[Hook] = []

    def handler(
        self,
        namespace: str,
        *,
        name: str | None = None,
        retry_attempts: int = 3,
        retry_delay_s: float = 0.05,
        retry_max_delay_s: float = 5.0,
        retry_multiplier: float = 2.0,
        retry_jitter_s: float = 0.0,
        **options: Any,
    ) -> Callable[[F], F]:
        """Declare an ``async def`` handler for every message of ``namespace``.

        The first parameter's annotation decides how the body is decoded (a msgspec
        Struct, ``dict``, ``list``, ``bytes`` or ``str``); an optional second parameter
        receives a :class:`~conveyor.platform.handlers.MessageContext`. Several handlers
        may subscribe to one namespace; each sees every message.
        """
        retry = RetryPolicy(
            attempts=retry_attempts,
            initial_delay_s=retry_delay_s,
            multiplier=retry_multiplier,
            max_delay_s=retry_max_delay_s,
            jitter_s=retry_jitter_s,
        )
        unknown = set(options) - _KNOWN_OPTIONS
        if unknown:
            raise HandlerDeclarationError(
                f"handler for {namespace!r}: unknown option(s) {sorted(unknown)}"
            )

        def register(fn: F) -> F:
            spec = build_spec(fn, namespace, name=name, retry=retry, options=dict(options))
            if any(h.name == spec.name for h in self.handlers):
                raise HandlerDeclarationError(
                    f"handler name {spec.name!r} is declared twice; "
                    "pass name=... to tell them apart"
                )
            self.handlers.append(spec)
            return fn

        return register

    def startup(self, hook: Hook) -> Hook:
        """Run ``hook(client)`` once when a daemon of this app has started."""
        self.on_startup.append(hook)
        return hook

    def subscriptions(self) -> dict[str, tuple[HandlerSpec, ...]]:
        """Namespace -> the handlers subscribed to it, in declaration order."""
        subs: dict[str, list[HandlerSpec]] = {}
        for spec in self.handlers:
            subs.setdefault(spec.namespace, []).append(spec)
        return {ns: tuple(specs) for ns, specs in subs.items()}


# Options later subsystems read (pools, cells); validated here so typos fail at declaration.
_KNOWN_OPTIONS: frozenset[str] = frozenset()
