"""A small bookshop: an order is charged, then a receipt is published and sent once."""

from __future__ import annotations

import msgspec

import conveyor

app = conveyor.App("bookshop")


class Order(msgspec.Struct):
    id: str
    total_cents: int


class Receipt(msgspec.Struct):
    order_id: str
    total_cents: int


class Gateway:
    """Stands for a payment service, which sometimes times out."""

    def __init__(self) -> None:
        self.charged: dict[str, int] = {}
        self.timeouts_to_come = 0

    async def charge(self, order_id: str, cents: int) -> None:
        if self.timeouts_to_come:
            self.timeouts_to_come -= 1
            raise TimeoutError("the payment gateway timed out")
        self.charged[order_id] = cents


gateway = Gateway()
sent: list[str] = []  # stands for the mail server: receipts sent, by order id
publisher: list[conveyor.Client] = []


@app.startup
async def connect(client: conveyor.Client) -> None:
    publisher[:] = [client]


@app.handler("orders", retry_attempts=3, retry_delay_s=0.5)
async def on_order(order: Order) -> None:
    if order.total_cents <= 0:
        raise ValueError(f"order {order.id}: the total must be positive")
    await gateway.charge(order.id, order.total_cents)
    await publisher[0].publish("receipts", order.id, Receipt(order.id, order.total_cents))


@app.handler("receipts", idempotent=True)
async def send_receipt(receipt: Receipt) -> None:
    sent.append(receipt.order_id)
