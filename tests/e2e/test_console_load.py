"""The console's load on a broker: a worker's throughput with the console open (its poll
loop reading the broker, as while a page is open) and closed, alternated on the same
redis-server and worker. Prints both figures (docs/console.md states them)."""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, cast

import psutil
import pytest

from conveyor.client import Publish, SyncClient
from conveyor.platform.config import load_config
from tests.conftest import wait_until_sync
from tests.e2e.test_console_browser import Console, ensure_groups
from tests.integration.redis.conftest import Worker, wait_file_lines, workers, write_config
from tests.servers import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.slow]
__all__ = ["workers"]  # the fixture, shared with the redis integration tests

BATCH = 20_000
"""Messages per round: about a second of work, two polls of the console and more."""
ROUNDS = 5
TOLERANCE = 0.4
"""How much slower the worker's best round with the console open may be than its best
round with it closed before the test fails. Rounds on the shared test machine spread by
a factor of two either way, and a round slowed by another process (a second pytest
worker's server, say) says nothing of the console: the best of each is compared (a run
whose medians were 41k and 72k msg/s had best rounds of 59k and 79k). So this only
catches a gross cost (a poll per request, a busy loop); the broker's share is measured
exactly below, in commands per poll."""


class OpenPage(threading.Thread):
    """What an open page does to the console: ask for the overview at the poll interval."""

    def __init__(self, url: str, interval_s: float) -> None:
        super().__init__(daemon=True)
        self.url, self.interval_s = url, interval_s
        self.closed = threading.Event()
        self.asked = 0

    def run(self) -> None:
        while not self.closed.wait(self.interval_s):
            with urllib.request.urlopen(self.url + "/api/overview", timeout=10) as answer:
                answer.read()
            self.asked += 1


def test_a_worker_s_throughput_is_the_same_with_the_console_open_or_closed(
    redis_server: RedisServer, tmp_path: Path, workers: list[Worker],
) -> None:
    path = write_config(tmp_path / "redis.toml", redis_server.url, queues={"total": 8})
    config = load_config(path)
    worker = Worker("w", path, tmp_path)
    workers.append(worker)
    handled = 0

    def drain_s(client: SyncClient, round_: int) -> float:
        nonlocal handled
        start = time.perf_counter()
        client.publish_batch(Publish("items", f"k{n % 64}", {"seq": n})
                             for n in range(round_ * BATCH, (round_ + 1) * BATCH))
        handled += BATCH
        wait_file_lines([worker.record], handled, 120, f"round {round_} handled")
        return time.perf_counter() - start

    closed: list[float] = []
    opened: list[float] = []
    with SyncClient.from_config(config) as client:
        drain_s(client, 0)  # warm-up: the worker has taken its queues
        for round_ in range(1, 2 * ROUNDS + 1):
            if round_ % 2:  # closed: no console process at all
                closed.append(BATCH / drain_s(client, round_))
                continue
            console = Console(path, write=False)
            page = OpenPage(console.url, 0.5)
            page.start()
            try:
                wait_until_sync(lambda p=page: p.asked >= 2, 10, "the page polling")
                opened.append(BATCH / drain_s(client, round_))
            finally:
                page.closed.set()
                page.join(15)
                console.stop()
    per_poll, cpu_ms = console_cost(path, redis_server)
    closed_rate, open_rate = statistics.median(closed), statistics.median(opened)
    print(f"\nworker throughput, console closed: {closed_rate:,.0f} msg/s "
          f"(rounds {', '.join(f'{r:,.0f}' for r in closed)})")
    print(f"worker throughput, console open (polling every 0.5 s): {open_rate:,.0f} msg/s "
          f"(rounds {', '.join(f'{r:,.0f}' for r in opened)})")
    print(f"the console's broker load: {per_poll:.0f} redis commands per poll "
          f"(one app, 8 queues, one daemon); its own CPU: {cpu_ms:.0f} ms per poll")
    assert max(opened) >= (1 - TOLERANCE) * max(closed), (opened, closed)
    assert per_poll < 200  # a few per queue, not per message


def console_cost(path: Path, server: RedisServer, window_s: float = 2.0
                 ) -> tuple[float, float]:
    """Redis commands the console adds per poll (the server's count over ``window_s``
    with the console polling, less the same window without it: the idle worker's), and
    the console process's CPU milliseconds per poll. Two seconds hold four polls: enough
    for a figure of about 100 against a bound of 200 (a window of 4 s only made the
    test 4 s longer)."""
    redis = server.client()

    def commands_in_window() -> int:
        before = int(redis.info("stats")["total_commands_processed"])
        time.sleep(window_s)  # a measuring window, not a wait for a condition
        return int(redis.info("stats")["total_commands_processed"]) - before - 1

    idle = commands_in_window()
    console = Console(path, write=False)
    page = OpenPage(console.url, 0.5)
    page.start()
    try:
        wait_until_sync(lambda: page.asked >= 2, 10, "the page polling")
        process = psutil.Process(console.proc.pid)
        polls_before, cpu_before = overview(console.url)["polls"], sum(process.cpu_times()[:2])
        busy = commands_in_window()
        polls = overview(console.url)["polls"] - polls_before
        cpu_s = sum(process.cpu_times()[:2]) - cpu_before
    finally:
        page.closed.set()
        page.join(15)
        console.stop()
    return max(busy - idle, 0) / max(polls, 1), 1000 * cpu_s / max(polls, 1)


def overview(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/api/overview", timeout=10) as answer:
        return cast(dict[str, Any], json.loads(answer.read()))


def test_a_burst_of_letter_requests_opens_a_bounded_number_of_connections(
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    """Each dead-letter request opens the broker's connections, as a CLI command does:
    40 at once use at most ``BROKER_CALLS`` requests' worth, the rest wait their turn,
    and all 40 are answered."""
    from conveyor.console.server import BROKER_CALLS

    path = write_config(tmp_path / "redis.toml", redis_server.url, queues={"total": 2})
    ensure_groups(load_config(path), "shop")  # an app the broker knows (else each is a 404)
    admin = redis_server.client()
    console = Console(path, write=False)
    try:
        def clients() -> int:
            return int(cast(dict[str, Any], admin.info("clients"))["connected_clients"])

        def letters() -> int:
            with urllib.request.urlopen(console.url + "/api/letters?app=shop",
                                        timeout=60) as answer:
                return int(json.loads(answer.read())["total"])

        letters()  # the poller's and this request's connections, once: the idle level
        idle = clients()
        peak, done = idle, threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, clients())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        answered: list[int] = []
        burst = [threading.Thread(target=lambda: answered.append(letters()), daemon=True)
                 for _ in range(40)]
        for thread in burst:
            thread.start()
        for thread in burst:
            thread.join(60)
        done.set()
        sampler.join()
    finally:
        console.stop()
    assert answered == [0] * 40
    print(f"connections: {idle} idle, {peak} at the burst's peak")
    assert peak - idle <= 2 * BROKER_CALLS, (idle, peak)
