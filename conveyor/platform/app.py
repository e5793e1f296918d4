"""The application object: a named set of handlers."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from conveyor.platform.errors import HandlerDeclarationError
from conveyor.platform.handlers import HandlerFn, HandlerSpec, RetryPolicy, build_spec
from conveyor.platform.ids import NAME

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
        if not NAME.fullmatch(name):
            raise HandlerDeclarationError(
                f"app name {name!r}: use 1-128 ASCII letters, digits, '-', '_' or '.' (it "
                "names the consumer group on the broker)"
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
        _validate_worker_options(f"handler for {namespace!r}", options)

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
_KNOWN_OPTIONS: frozenset[str] = frozenset({
    # stateless-worker pool (conveyor.workers.pool)
    "stateless", "max_workers", "scale_down",
    # cells (conveyor.workers.cells)
    "cell_key", "cell_size", "cell_sizes", "cell_job_timeout_s",
})


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _validate_worker_options(where: str, options: dict[str, Any]) -> None:
    """Pool and cell options: checked at declaration, so a typo never reaches a worker."""
    from conveyor.workers.scaledown import ScaleDownPolicy

    def bad(message: str) -> HandlerDeclarationError:
        return HandlerDeclarationError(f"{where}: {message}")

    stateless = options.get("stateless", False)
    if not isinstance(stateless, bool):
        raise bad(f"stateless must be True or False, got {stateless!r}")
    if not stateless and ({"max_workers", "scale_down"} & set(options)):
        raise bad("max_workers and scale_down apply to stateless=True handlers only")
    if "max_workers" in options and not _positive_int(options["max_workers"]):
        raise bad(f"max_workers must be an int >= 1, got {options['max_workers']!r}")
    scale_down = options.get("scale_down", False)
    if not isinstance(scale_down, (bool, ScaleDownPolicy)):
        raise bad(f"scale_down must be True, False or a ScaleDownPolicy, got {scale_down!r}")
    cell_options = {"cell_size", "cell_sizes", "cell_job_timeout_s"} & set(options)
    if "cell_key" not in options:
        if cell_options:
            raise bad(f"{sorted(cell_options)} need cell_key='header:NAME' or 'body:NAME'")
        return
    if stateless:
        raise bad("a handler is either stateless=True or has cells (cell_key), not both")
    key = options["cell_key"]
    source, sep, name = key.partition(":") if isinstance(key, str) else ("", "", "")
    if not sep or source not in ("header", "body") or not name:
        raise bad(f"cell_key must be 'header:NAME' or 'body:NAME', got {key!r}")
    if "cell_size" in options and not _positive_int(options["cell_size"]):
        raise bad(f"cell_size must be an int >= 1, got {options['cell_size']!r}")
    sizes = options.get("cell_sizes", {})
    if not isinstance(sizes, dict) or not all(
        isinstance(k, str) and _positive_int(v) for k, v in sizes.items()
    ):
        raise bad(f"cell_sizes must map cell names to ints >= 1, got {sizes!r}")
    timeout = options.get("cell_job_timeout_s")
    if timeout is not None and (
        not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0
    ):
        raise bad(f"cell_job_timeout_s must be a number > 0 or None, got {timeout!r}")
