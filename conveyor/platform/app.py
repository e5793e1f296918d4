"""The application object: a named set of handlers, and the interceptors around them."""

from __future__ import annotations

import inspect
import sys
import weakref
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from conveyor.platform.delivery.chain import Interceptor
from conveyor.platform.errors import HandlerDeclarationError
from conveyor.platform.handlers import HandlerFn, HandlerSpec, build_spec, handler_where
from conveyor.platform.ids import NAME
from conveyor.platform.options import BUILTIN_OPTIONS, HandlerOptions, parse_options

F = TypeVar("F", bound=HandlerFn)
Hook = Callable[[Any], Coroutine[Any, Any, None]]
"""``async (client) -> None``: the client is the daemon's :class:`conveyor.Client` (a
room above this one, so not named here)."""
H = TypeVar("H", bound=Hook)


class App:
    """Holds handlers. Its ``name`` is the consumer group: daemons of one app share work.

    ::

        app = conveyor.App("shop")

        @app.handler("orders")
        async def on_order(order: Order) -> None: ...

        @app.handler("invoices")
        def on_invoice(invoice: Invoice) -> None: ...  # blocking code: runs on a thread

    ``interceptors`` wrap every handler's delivery, in the given order, inside retry
    (see :class:`~conveyor.platform.delivery.chain.Interceptor` for the contract).
    """

    def __init__(self, name: str, *, interceptors: Sequence[Interceptor] = ()) -> None:
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise HandlerDeclarationError(
                f"app name {name!r}: use 1-128 ASCII letters, digits, '-', '_' or '.' (it "
                "names the consumer group on the broker)"
            )
        self.name = name
        self._holders: weakref.WeakSet[object] = weakref.WeakSet()
        """What runs these handlers now (a daemon, a TestWorker): see :meth:`hold`."""
        self.handlers: list[HandlerSpec] = []
        self.on_startup: list[Hook] = []
        self.interceptors: tuple[Interceptor, ...] = ()
        self._option_types: tuple[type[HandlerOptions], ...] = BUILTIN_OPTIONS
        if isinstance(interceptors, str | bytes) or not hasattr(interceptors, "__iter__"):
            raise HandlerDeclarationError(
                f"app {name!r}: interceptors={interceptors!r:.80}: a list of "
                "conveyor.Interceptor")
        for interceptor in interceptors:
            self.add_interceptor(interceptor)

    def hold(self, holder: object) -> None:
        """Mark the app run by ``holder`` (a daemon made from it, until it stops): it runs
        the handlers declared so far, so :meth:`handler` refuses more while any holder
        is there (one it would never call was skipped in silence). Held weakly: a
        holder dropped without :meth:`release` lets go as it is collected."""
        self._holders.add(holder)

    def release(self, holder: object) -> None:
        """``holder`` no longer runs the app (stopped); releasing twice does no harm."""
        self._holders.discard(holder)

    def __copy__(self) -> App:
        """A copy held by nothing (what runs the original does not run it)."""
        twin = object.__new__(App)
        twin.__dict__.update(self.__dict__)
        twin._holders = weakref.WeakSet()
        return twin

    def add_interceptor(self, interceptor: Interceptor) -> None:
        """Add an interceptor inside the ones added before; before declaring handlers
        that use its options."""
        if not isinstance(interceptor, Interceptor):
            raise HandlerDeclarationError(
                f"app {self.name!r}: {interceptor!r} is not a conveyor.Interceptor"
            )
        option_type = type(interceptor).options
        if option_type is not None and option_type not in self._option_types:
            self._check_option_type(type(interceptor).__name__, option_type)
            self._option_types = (*self._option_types, option_type)
        self.interceptors = (*self.interceptors, interceptor)

    def _check_option_type(self, interceptor: str, option_type: object) -> None:
        """Refuse an interceptor's ``options`` that no handler could be declared with:
        the first ``App.handler`` failed inside Conveyor instead."""
        where = f"app {self.name!r}: interceptor {interceptor}: options = "
        if not (isinstance(option_type, type) and issubclass(option_type, HandlerOptions)):
            raise HandlerDeclarationError(
                f"{where}{option_type!r:.80}: a conveyor.HandlerOptions subclass (or None)")
        name = option_type.__name__
        if option_type.from_keywords.__func__ is HandlerOptions.from_keywords.__func__:  # type: ignore[attr-defined]
            raise HandlerDeclarationError(
                f"{where}{name}: it does not define from_keywords, which builds its value "
                "from a handler's keywords")
        for known in self._option_types:
            shared = option_type.keywords & known.keywords
            if shared:
                raise HandlerDeclarationError(
                    f"{where}{name}: keyword(s) {sorted(shared)} belong to "
                    f"{known.__name__} already")

    def handler(
        self, namespace: str, *, name: str | None = None, **options: Any
    ) -> Callable[[F], F]:
        """Declare a handler for every message of ``namespace``.

        An ``async def`` handler runs on the event loop and must not block it. A plain
        ``def`` handler runs on a thread of the daemon's handler threads
        (:mod:`conveyor.workers.threads`): it may block (sync drivers, ``time.sleep``,
        CPU work that releases the GIL); each call holds its slot while its thread runs,
        so ``[slots]`` bounds these calls as any, and the current span and other
        ``contextvars`` are carried into the thread. A thread cannot be interrupted: a
        drain that times out abandons a running call (its message is redelivered), it
        does not stop it. Generators, and plain functions that wrap an ``async def``,
        are refused.

        The first parameter's annotation decides how the body is decoded (a msgspec
        Struct, ``dict``, ``list``, ``bytes`` or ``str``); an optional second parameter
        receives a :class:`~conveyor.platform.handlers.MessageContext`. Several handlers
        may subscribe to one namespace; each sees every message.

        Options (checked now, see :mod:`conveyor.platform.options`): ``retry_attempts``
        (3), ``retry_delay_s`` (0.05), ``retry_multiplier`` (2.0), ``retry_max_delay_s``
        (5.0), ``retry_jitter_s`` (0); ``stateless``, ``max_workers``, ``scale_down``;
        ``cell_key``, ``cell_size``, ``cell_sizes``, ``cell_job_timeout_s``; and those of
        the app's interceptors.
        """

        def register(fn: F) -> F:
            where = handler_where(fn)
            if self._holders:
                raise HandlerDeclarationError(
                    f"{where}: app {self.name!r} is run by a worker daemon already, which "
                    "runs the handlers declared before it was made: this one would never be "
                    "called; declare it first (at import, as `conveyor worker` sees them)")
            values = parse_options(where, options, self._option_types)
            # The declaring scope's names: a type local to it resolves in annotations
            # that `from __future__ import annotations` left as text.
            spec = build_spec(fn, namespace, name=name, options=values,
                              local_names=sys._getframe(1).f_locals)
            if any(h.name == spec.name for h in self.handlers):
                raise HandlerDeclarationError(
                    f"handler name {spec.name!r} is declared twice; "
                    "pass name=... to tell them apart"
                )
            self.handlers.append(spec)
            return fn

        if callable(namespace):  # `@app.handler` without (namespace): it declared nothing
            raise HandlerDeclarationError(
                "app.handler(namespace) declares a handler: write @app.handler(\"orders\") "
                f"above {getattr(namespace, '__qualname__', namespace)!r}, with the namespace "
                "it handles, not @app.handler")
        where = f"handler for {namespace!r}"
        parse_options(where, options, self._option_types)  # a bad option fails at the call
        return register

    def startup(self, hook: H) -> H:
        """Run ``hook(client)`` once when a daemon of this app has started.

        Hooks are ``async def``: the client they receive publishes with ``await``. Do
        blocking set-up inside one with ``await asyncio.to_thread(...)``.
        """
        if not inspect.iscoroutinefunction(hook):
            raise HandlerDeclarationError(
                f"startup hook {getattr(hook, '__qualname__', hook)!r}: declare it "
                "`async def` (it receives the async Client; run blocking set-up in it "
                "with `await asyncio.to_thread(...)`)"
            )
        try:
            inspect.signature(hook).bind(None)  # what the daemon passes: its client
        except TypeError as exc:
            raise HandlerDeclarationError(
                f"startup hook {getattr(hook, '__qualname__', hook)!r}: a daemon calls it "
                "with one argument, its conveyor.Client: declare it `async def "
                f"{getattr(hook, '__name__', 'hook')}(client: conveyor.Client)` ({exc})"
            ) from None
        self.on_startup.append(hook)
        return hook

    def subscriptions(self) -> dict[str, tuple[HandlerSpec, ...]]:
        """Namespace -> the handlers subscribed to it, in declaration order."""
        subs: dict[str, list[HandlerSpec]] = {}
        for spec in self.handlers:
            subs.setdefault(spec.namespace, []).append(spec)
        return {ns: tuple(specs) for ns, specs in subs.items()}
