"""aiokafka logs an error at every attempt to reach a broker that is down (every 1-5 s,
from each client): one line per address passes every ``CONNECT_REPEAT_S``, the next one
saying how many were held back (``conveyor.adapters.kafka.connection``). Real aiokafka
clients against a port nothing listens on."""

from __future__ import annotations

import logging

import pytest
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaConnectionError

from conveyor.adapters.kafka import connection
from tests.conftest import free_port


async def _bootstrap(port: int) -> None:
    client = AIOKafkaClient(bootstrap_servers=f"127.0.0.1:{port}")
    try:
        with pytest.raises(KafkaConnectionError):
            await client.bootstrap()
    finally:
        await client.close()


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "aiokafka"]


async def test_one_connect_error_an_interval_per_address_then_the_count_held_back(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.ERROR, logger="aiokafka")
    down, other = free_port(), free_port()
    for _ in range(3):
        await _bootstrap(down)
    await _bootstrap(other)  # another address is another line
    lines = _lines(caplog)
    assert len(lines) == 2, lines
    assert lines[0].startswith(f'Unable connect to "127.0.0.1:{down}": ')
    assert lines[1].startswith(f'Unable connect to "127.0.0.1:{other}": ')
    assert "more like it" not in lines[0]

    caplog.clear()
    monkeypatch.setattr(connection, "CONNECT_REPEAT_S", 0.0)  # the interval is over
    await _bootstrap(down)
    [line] = _lines(caplog)
    assert line.startswith(f'Unable connect to "127.0.0.1:{down}": ')
    assert line.endswith("(and 2 more like it in the last 0s)"), line


async def test_other_lines_of_aiokafka_pass_untouched(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="aiokafka")
    logger = logging.getLogger("aiokafka")
    for _ in range(3):
        logger.error("Something else broke: %s", "twice")
    assert _lines(caplog) == ["Something else broke: twice"] * 3
