"""The benchmark's worker app: a no-op handler (``conveyor worker conveyor.bench.noop_app:app``)."""

from __future__ import annotations

from conveyor.platform.app import App

app = App("bench")


@app.handler("bench")
async def noop(body: bytes) -> None:
    return None
