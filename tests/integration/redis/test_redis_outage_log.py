"""A Redis outage is logged as the server's, once a process: every caller of the server
(the adapter's, the balancer's membership and leases) shares one log of it, so the first
call that gets through ends it, whichever caller makes it."""

from __future__ import annotations

import logging

import pytest

from conveyor.adapters.redis import RedisAdapter
from conveyor.adapters.redis.coordination import redis_coordination
from conveyor.platform.config import load_config
from conveyor.platform.errors import BrokerConnectionError
from tests.integration.redis.conftest import RedisServer


def outage_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "conveyor.redis" and "reachable" in r.getMessage()]


async def test_an_outage_met_by_two_callers_is_logged_once_and_ended_by_either(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, each caller had a log of its own: a worker whose balancer met the outage
    but whose adapter made the first call after it logged "unreachable" twice and
    "reachable again" only once its balancer called again, which a worker stopped
    meanwhile never did (CI saw such a log once)."""
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis", "total": 2},
        "redis": {"url": redis_server.url, "prefix": "t", "retry_max_s": 0.3},
        "balancer": {"kind": "dynamic", "membership": "redis"},
    })
    adapter = RedisAdapter(config.redis)
    membership, leases = redis_coordination(config, "rec")
    caplog.set_level(logging.WARNING, logger="conveyor.redis")
    try:
        assert await membership.members() == []
        redis_server.stop()
        with pytest.raises(BrokerConnectionError):
            await membership.members()
        with pytest.raises(BrokerConnectionError):
            await adapter.lag(0, "rec")
        [down] = outage_lines(caplog)
        assert "unreachable while reading the membership" in down

        redis_server.start()
        assert await adapter.lag(0, "rec") == 0  # the adapter's call ends the outage
        assert len(outage_lines(caplog)) == 2
        assert "reachable again after" in outage_lines(caplog)[1]
        assert await membership.members() == []  # and the balancer's logs nothing more
        assert len(outage_lines(caplog)) == 2
    finally:
        await adapter.close()
        await leases.close()
        await membership.close()
