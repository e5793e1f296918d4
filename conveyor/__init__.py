"""Conveyor: a message-broker-backed worker platform.

The public API::

    import conveyor

    app = conveyor.App("shop")

    @app.handler("orders")
    async def on_order(order: dict) -> None: ...

    # from another process: a broker both sides reach (the embedded adapter lives in
    # the worker's process; there, publish from an @app.startup hook's client)
    async with conveyor.Client.from_config(conveyor.load_config("configs/redis.toml")) as c:
        await c.publish("orders", "order-1", {"total": 3})

The README's tour is the walk-through (run as printed by tests/e2e/test_tour.py).
"""

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.client import Client, Publish, SyncClient
    from conveyor.platform.app import App
    from conveyor.platform.config import Config, load_config
    from conveyor.platform.delivery import Delivery, Interceptor, Step
    from conveyor.platform.errors import (
        AppAliveError,
        BodyEncodeError,
        BrokerConnectionError,
        BrokerError,
        ConfigError,
        ConveyorError,
        DecodeError,
        DeliveryLimit,
        ForwardRewindError,
        HandlerDeclarationError,
        InvalidArgumentError,
        LeaseLostError,
        MessageTooLargeError,
        PartialPublishError,
        PublishNotReplicated,
        PublishUncertain,
        QueueOwnedError,
        ShutdownError,
        SlotSupplierError,
        StoreUnfitError,
        TokenRangeError,
        UnknownGroupError,
    )
    from conveyor.platform.handlers import HandlerSpec, MessageContext
    from conveyor.platform.ids import SequenceToken, StreamId
    from conveyor.platform.letters import StoredLetter
    from conveyor.platform.mapper import HashRingQueueMapper
    from conveyor.platform.message import DeadLetter, Message, Undecodable
    from conveyor.platform.options import (
        BatchOptions,
        CellOptions,
        HandlerOptions,
        PoolOptions,
        RetryPolicy,
        ScaleDownPolicy,
    )
    from conveyor.platform.slots import (
        SlotInfo,
        SlotPermit,
        SlotReleaseReason,
        SlotReservationContext,
        SlotSupplier,
    )
    from conveyor.workers.cells.cells import CellJobTimeout
    from conveyor.workers.daemon import WorkerDaemon
    from conveyor.workers.slots.fixed import FixedSlotSupplier
    from conveyor.workers.slots.resource import ResourceBasedSlotSupplier
    from conveyor.workers.slots.wrappers import GuardedSlotSupplier, PauseableSlotSupplier

_WHERE: dict[str, str] = {
    "App": "conveyor.platform.app",
    "AppAliveError": "conveyor.platform.errors",
    "BatchOptions": "conveyor.platform.options",
    "BodyEncodeError": "conveyor.platform.errors",
    "BrokerConnectionError": "conveyor.platform.errors",
    "BrokerError": "conveyor.platform.errors",
    "CellJobTimeout": "conveyor.workers.cells.cells",
    "CellOptions": "conveyor.platform.options",
    "Client": "conveyor.client",
    "Config": "conveyor.platform.config",
    "ConfigError": "conveyor.platform.errors",
    "ConveyorError": "conveyor.platform.errors",
    "DeadLetter": "conveyor.platform.message",
    "DecodeError": "conveyor.platform.errors",
    "Delivery": "conveyor.platform.delivery",
    "DeliveryLimit": "conveyor.platform.errors",
    "FixedSlotSupplier": "conveyor.workers.slots.fixed",
    "ForwardRewindError": "conveyor.platform.errors",
    "GuardedSlotSupplier": "conveyor.workers.slots.wrappers",
    "HandlerDeclarationError": "conveyor.platform.errors",
    "HandlerOptions": "conveyor.platform.options",
    "HandlerSpec": "conveyor.platform.handlers",
    "HashRingQueueMapper": "conveyor.platform.mapper",
    "Interceptor": "conveyor.platform.delivery",
    "InvalidArgumentError": "conveyor.platform.errors",
    "LeaseLostError": "conveyor.platform.errors",
    "Message": "conveyor.platform.message",
    "MessageContext": "conveyor.platform.handlers",
    "MessageTooLargeError": "conveyor.platform.errors",
    "PartialPublishError": "conveyor.platform.errors",
    "PauseableSlotSupplier": "conveyor.workers.slots.wrappers",
    "PoolOptions": "conveyor.platform.options",
    "Publish": "conveyor.client",
    "PublishNotReplicated": "conveyor.platform.errors",
    "PublishUncertain": "conveyor.platform.errors",
    "QueueOwnedError": "conveyor.platform.errors",
    "ResourceBasedSlotSupplier": "conveyor.workers.slots.resource",
    "RetryPolicy": "conveyor.platform.options",
    "ScaleDownPolicy": "conveyor.platform.options",
    "SequenceToken": "conveyor.platform.ids",
    "ShutdownError": "conveyor.platform.errors",
    "SlotInfo": "conveyor.platform.slots",
    "SlotPermit": "conveyor.platform.slots",
    "SlotReleaseReason": "conveyor.platform.slots",
    "SlotReservationContext": "conveyor.platform.slots",
    "SlotSupplier": "conveyor.platform.slots",
    "SlotSupplierError": "conveyor.platform.errors",
    "Step": "conveyor.platform.delivery",
    "StoreUnfitError": "conveyor.platform.errors",
    "StoredLetter": "conveyor.platform.letters",
    "StreamId": "conveyor.platform.ids",
    "SyncClient": "conveyor.client",
    "TokenRangeError": "conveyor.platform.errors",
    "Undecodable": "conveyor.platform.message",
    "UnknownGroupError": "conveyor.platform.errors",
    "WorkerDaemon": "conveyor.workers.daemon",
    "load_config": "conveyor.platform.config",
}
"""Each public name's module. The names are imported when first asked for (PEP 562), not
with the package: ``import conveyor`` alone costs a few milliseconds, so a command that
needs no worker (``conveyor dlq list``) or a producer that needs no daemon does not load
one, and ``python -m conveyor`` starts its SIGINT hold before most of the package loads.
``from conveyor import App`` and ``conveyor.App`` read the same as eager imports would."""


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif name == "__version__":
        from conveyor.version import version
        value = version()
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}"):
        # a subpackage (conveyor.client, conveyor.testing...): loaded with the names
        # before, so `import conveyor` then `conveyor.platform.config` kept working
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # asked once: later reads are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "__version__"})


__version__: str
"""The installed distribution's version (``conveyor --version`` prints it too)."""

__all__ = [
    "App",
    "AppAliveError",
    "BatchOptions",
    "BodyEncodeError",
    "BrokerConnectionError",
    "BrokerError",
    "CellJobTimeout",
    "CellOptions",
    "Client",
    "Config",
    "ConfigError",
    "ConveyorError",
    "DeadLetter",
    "DecodeError",
    "Delivery",
    "DeliveryLimit",
    "FixedSlotSupplier",
    "ForwardRewindError",
    "GuardedSlotSupplier",
    "HandlerDeclarationError",
    "HandlerOptions",
    "HandlerSpec",
    "HashRingQueueMapper",
    "Interceptor",
    "InvalidArgumentError",
    "LeaseLostError",
    "Message",
    "MessageContext",
    "MessageTooLargeError",
    "PartialPublishError",
    "PauseableSlotSupplier",
    "PoolOptions",
    "Publish",
    "PublishNotReplicated",
    "PublishUncertain",
    "QueueOwnedError",
    "ResourceBasedSlotSupplier",
    "RetryPolicy",
    "ScaleDownPolicy",
    "SequenceToken",
    "ShutdownError",
    "SlotInfo",
    "SlotPermit",
    "SlotReleaseReason",
    "SlotReservationContext",
    "SlotSupplier",
    "SlotSupplierError",
    "Step",
    "StoreUnfitError",
    "StoredLetter",
    "StreamId",
    "SyncClient",
    "TokenRangeError",
    "Undecodable",
    "UnknownGroupError",
    "WorkerDaemon",
    "load_config",
]
