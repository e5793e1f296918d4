"""An app with every kind of handler body, for `conveyor asyncapi` tests."""

from __future__ import annotations

import enum

import msgspec

from conveyor import App, MessageContext


class Size(enum.Enum):
    SMALL = "small"
    LARGE = "large"


class Line(msgspec.Struct):
    sku: str
    quantity: int
    size: Size = Size.SMALL


class Order(msgspec.Struct):
    """An order as the shop publishes it."""

    id: str
    lines: list[Line]
    total: float
    note: str | None = None


class Refund(msgspec.Struct):
    order_id: str
    amount: float


app = App("shop")


@app.handler("orders")
async def on_order(order: Order, ctx: MessageContext) -> None:
    """Reserve the stock of each line."""


@app.handler("orders", name="audit")
async def audit(order: Order) -> None:
    """A second handler of the same body: one message, two receive operations."""


@app.handler("orders", name="refund-check")
async def refund_check(refund: Refund) -> None: ...


@app.handler("events")
async def on_event(event: dict) -> None: ...  # type: ignore[type-arg]


@app.handler("blobs")
async def on_blob(blob: bytes) -> None: ...


@app.handler("notes")
async def on_note(note: str) -> None: ...


@app.handler("refunds", batch_size=50)
async def on_refunds(refunds: list[Refund]) -> None: ...
