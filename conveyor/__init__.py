"""Conveyor: a message-broker-backed worker platform.

The public API::

    import conveyor

    app = conveyor.App("shop")

    @app.handler("orders")
    async def on_order(order: dict) -> None: ...

    async with conveyor.Client.from_config(conveyor.load_config("configs/local.toml")) as c:
        await c.publish("orders", "order-1", {"total": 3})
"""

from conveyor.platform.app import App
from conveyor.platform.client import Client, Publish, SyncClient
from conveyor.platform.config import Config, load_config
from conveyor.platform.errors import (
    BrokerConnectionError,
    BrokerError,
    ConfigError,
    ConveyorError,
    DecodeError,
    HandlerDeclarationError,
    LeaseLostError,
    ShutdownError,
)
from conveyor.platform.handlers import MessageContext, RetryPolicy
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.message import DeadLetter, Message
from conveyor.workers.daemon import WorkerDaemon
from conveyor.workers.slots import (
    FixedSlotSupplier,
    SlotInfo,
    SlotPermit,
    SlotReleaseReason,
    SlotReservationContext,
    SlotSupplier,
)

__all__ = [
    "App",
    "BrokerConnectionError",
    "BrokerError",
    "Client",
    "Config",
    "ConfigError",
    "ConveyorError",
    "DeadLetter",
    "DecodeError",
    "FixedSlotSupplier",
    "HandlerDeclarationError",
    "HashRingQueueMapper",
    "LeaseLostError",
    "Message",
    "MessageContext",
    "Publish",
    "RetryPolicy",
    "SequenceToken",
    "ShutdownError",
    "SlotInfo",
    "SlotPermit",
    "SlotReleaseReason",
    "SlotReservationContext",
    "SlotSupplier",
    "StreamId",
    "SyncClient",
    "WorkerDaemon",
    "load_config",
]
