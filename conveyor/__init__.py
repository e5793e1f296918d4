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
from conveyor.platform.delivery import Delivery, Interceptor, Step
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
from conveyor.platform.handlers import HandlerSpec, MessageContext
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.message import DeadLetter, Message, Undecodable
from conveyor.platform.options import (
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
from conveyor.workers.daemon import WorkerDaemon
from conveyor.workers.fixed_slots import FixedSlotSupplier

__all__ = [
    "App",
    "BrokerConnectionError",
    "BrokerError",
    "CellOptions",
    "Client",
    "Config",
    "ConfigError",
    "ConveyorError",
    "DeadLetter",
    "DecodeError",
    "Delivery",
    "FixedSlotSupplier",
    "HandlerDeclarationError",
    "HandlerOptions",
    "HandlerSpec",
    "HashRingQueueMapper",
    "Interceptor",
    "LeaseLostError",
    "Message",
    "MessageContext",
    "PoolOptions",
    "Publish",
    "RetryPolicy",
    "ScaleDownPolicy",
    "SequenceToken",
    "ShutdownError",
    "SlotInfo",
    "SlotPermit",
    "SlotReleaseReason",
    "SlotReservationContext",
    "SlotSupplier",
    "Step",
    "StreamId",
    "SyncClient",
    "Undecodable",
    "WorkerDaemon",
    "load_config",
]
