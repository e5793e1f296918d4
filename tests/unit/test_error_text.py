"""An exception in a log line or a reason: ``Type: message``, or the type alone when its
message is empty (``TimeoutError()``), where ``TimeoutError: `` read as cut off."""

from __future__ import annotations

import asyncio
import logging

import pytest

from conveyor.platform.balancing.balancer import DynamicBalancer
from conveyor.platform.balancing.leases import Lease, MemoryLeaseStore
from conveyor.platform.balancing.membership import MemberInfo, MemoryMembership
from conveyor.platform.errors import error_text
from tests.conftest import wait_until


def test_an_exception_with_no_message_is_its_type_alone() -> None:
    assert error_text(TimeoutError()) == "TimeoutError"
    assert error_text(asyncio.CancelledError()) == "CancelledError"
    assert error_text(ConnectionError("refused")) == "ConnectionError: refused"
    assert error_text(KeyError("k")) == "KeyError: 'k'"


class TimingOut(MemoryLeaseStore):
    """A lease store whose renewals time out (as ``asyncio.timeout`` raises: no message)."""

    async def renew(self, lease: Lease, ttl_s: float) -> Lease | None:
        raise TimeoutError


class Listener:
    async def queue_acquired(self, queue: int, lease: Lease | None) -> None:
        pass

    async def queue_released(self, queue: int) -> None:
        pass

    async def queue_lost(self, queue: int) -> None:
        pass

    def balancer_failed(self, error: BaseException) -> None:
        raise AssertionError(f"the balancer failed: {error}")


async def test_a_lease_renewal_that_timed_out_says_so_with_no_empty_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    balancer = DynamicBalancer(MemoryMembership(), TimingOut(), 1, lease_ttl_s=0.3,
                               rebalance_interval_s=0.05)
    with caplog.at_level(logging.WARNING, logger="conveyor.balancer"):
        await balancer.start(MemberInfo("only", "h", 1, 0.0), Listener())
        try:
            await wait_until(lambda: any("lease renewal failed" in r.getMessage()
                                         for r in caplog.records), 10, what="a renewal")
        finally:
            await balancer.stop()
    said = next(r.getMessage() for r in caplog.records
                if "lease renewal failed" in r.getMessage())
    assert said == "queue 0: lease renewal failed: TimeoutError", said
