"""A runner runs a lane's entries back to back, at most LANE_RUN of them and for at most
RUN_BUDGET_S, then lets the other ready lanes go first; a stream's order holds
throughout, and what a runner finished in one step is acknowledged once that step is
over."""

from __future__ import annotations

import asyncio

import pytest

from conveyor import App, Client, Publish
from conveyor.adapters.memory import MemoryAdapter, reset_broker
from conveyor.platform import agent as agent_module
from conveyor.platform.agent import LANE_RUN, PullingAgent
from conveyor.platform.config import load_config
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.workers.daemon.build import build_parts
from tests.conftest import wait_until


async def _run(name: str, items: list[Publish], slots: int, call_s: float = 0.0
               ) -> tuple[list[tuple[str, int]], PullingAgent]:
    reset_broker(name)
    adapter = MemoryAdapter(name)
    app = App(name)
    seen: list[tuple[str, int]] = []

    @app.handler("items")
    async def handle(item: dict[str, object]) -> None:
        seen.append((str(item["key"]), int(str(item["seq"]))))
        if call_s:
            await asyncio.sleep(call_s)

    config = load_config(None, environ={}, overrides={
        "memory": {"broker": name}, "queues": {"total": 1},
        "slots": {"kind": "fixed", "count": slots}})
    parts = build_parts(app, config, adapter=adapter)
    await Client(adapter, HashRingQueueMapper(1)).publish_batch(items)
    receiver = adapter.create_receiver(0, app.name)
    await receiver.initialize()
    agent = PullingAgent(0, receiver, parts.subscriptions, parts.orphans, parts.slots,
                         parts.settings)
    agent.start()
    await wait_until(lambda: agent.acked == len(items), 5, what="every message acknowledged")
    await agent.drain(5.0)
    return seen, agent


async def test_a_long_stream_lets_a_short_one_in_after_one_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_module, "RUN_BUDGET_S", 60.0)  # a loaded machine's pause
    # mid-run must not end it early here: the count is what this test shows
    long = [Publish("items", "a", {"key": "a", "seq": i}) for i in range(2 * LANE_RUN + 8)]
    short = [Publish("items", "b", {"key": "b", "seq": 0})]
    seen, _ = await _run("lane-runs", long + short, slots=1)
    assert seen.index(("b", 0)) == LANE_RUN  # after one run of a's, not after all of them
    assert [seq for key, seq in seen if key == "a"] == list(range(2 * LANE_RUN + 8))


async def test_handlers_slower_than_the_budget_run_one_call_a_turn() -> None:
    """20 ms handlers ran 16 deep into one stream while other streams waited (the paused
    daemon's fault test, 70 s instead of 20): a call longer than RUN_BUDGET_S ends the
    run, so the short stream goes second."""
    long = [Publish("items", "a", {"key": "a", "seq": i}) for i in range(6)]
    short = [Publish("items", "b", {"key": "b", "seq": 0})]
    seen, _ = await _run("lane-runs-slow", long + short, slots=1,
                         call_s=2 * agent_module.RUN_BUDGET_S)
    assert seen.index(("b", 0)) == 1
    assert [seq for key, seq in seen if key == "a"] == list(range(6))


async def test_many_streams_each_in_order_and_all_acknowledged() -> None:
    items = [Publish("items", f"k{i % 7}", {"key": f"k{i % 7}", "seq": i}) for i in range(300)]
    seen, agent = await _run("lane-runs-many", items, slots=3)
    for key in {key for key, _ in seen}:
        seqs = [seq for k, seq in seen if k == key]
        assert seqs == sorted(seqs)
    assert len(seen) == 300 and agent.unacknowledged == 0
