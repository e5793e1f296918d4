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
from conveyor.version import version as _version
from conveyor.workers.cells.cells import CellJobTimeout
from conveyor.workers.daemon import WorkerDaemon
from conveyor.workers.slots.fixed import FixedSlotSupplier
from conveyor.workers.slots.resource import ResourceBasedSlotSupplier
from conveyor.workers.slots.wrappers import GuardedSlotSupplier, PauseableSlotSupplier

__version__ = _version()
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
