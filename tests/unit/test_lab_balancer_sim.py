"""The balancer at scale, simulated: the real DynamicBalancer on a virtual clock against a
store that counts what Redis would be asked (``conveyor sim balancer``)."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.lab.balancer_sim import BalancerSimConfig, BalancerSimResult, run
from conveyor.lab.balancer_store import (
    GRANT,
    HEARTBEAT,
    POLL,
    REBALANCE,
    RENEWAL,
    SimLeaseStore,
    SimStore,
)
from conveyor.lab.virtual_time import VirtualTimeLoop, run_virtual

SMALL = BalancerSimConfig(daemons=3, queues=8, steady_s=6.0)


@pytest.fixture(scope="module")
def small() -> BalancerSimResult:
    return run(SMALL)


def test_a_seed_gives_the_same_run_every_time(small: BalancerSimResult) -> None:
    again = run(SMALL)
    assert (again.load, again.startup, again.events) == (small.load, small.startup, small.events)
    assert again.timeline == small.timeline


def test_steady_load_of_3_daemons_and_8_queues_is_what_a_hand_count_gives(
    small: BalancerSimResult,
) -> None:
    load = {entry.category: entry for entry in small.load}
    # One membership write a second per daemon: the balancer's heartbeat (every ttl/3,
    # with fresh stats) rides on the membership's own beat instead of adding a write.
    assert load[HEARTBEAT].ops_per_s == pytest.approx(3 * 1.0)
    # A lease is renewed at the first ttl/10 = 0.5 s tick after ttl/3 = 1.67 s has
    # passed: every 2 s. Eight leases: 4 renewals a second, one key each.
    assert load[RENEWAL].ops_per_s == pytest.approx(8 / 2.0)
    assert load[RENEWAL].keys_per_s == pytest.approx(8 / 2.0)
    # wait_changed polls the membership version every 0.2 s until the 1 s interval
    # ends: 4 or 5 polls a second per daemon.
    assert 3 * 4 <= load[POLL].ops_per_s <= 3 * 5
    # Settled, a daemon reads two counters per interval (membership version, lease
    # generation) and never the lease holders: well under 8 keys a second each.
    assert 3 * 1.8 <= load[REBALANCE].ops_per_s <= 3 * 2.2
    assert load[REBALANCE].keys_per_s < 3 * 4
    assert load[GRANT].ops_per_s == 0  # nothing moves in steady state


def test_join_and_leave_move_only_the_surplus_and_a_crash_settles_within_ttl_plus_interval(
    small: BalancerSimResult,
) -> None:
    assert small.startup.settle_s is not None
    join, leave, crash = small.events
    # 3 -> 4 daemons over 8 queues: the newcomer's share is 2, one from each daemon
    # holding 3; drained and handed off.
    assert (join.moved, join.handed_off) == (2, 2)
    # 4 -> 3: the leaver's 2 queues, handed off.
    assert (leave.moved, leave.handed_off) == (2, 2)
    # 3 -> 2: the victim's queues (2 or 3) are taken once its leases lapse.
    assert crash.moved in (2, 3) and crash.handed_off == 0
    assert crash.settle_s is not None
    assert crash.settle_s <= SMALL.lease_ttl_s + SMALL.rebalance_interval_s
    for event in (join, leave):
        assert event.settle_s is not None
        assert event.settle_s <= SMALL.rebalance_interval_s + 0.5
    assert [e.double_owned for e in (small.startup, *small.events)] == [0, 0, 0, 0]


def test_at_fifty_daemons_the_store_load_grows_with_daemons_not_daemons_times_queues() -> None:
    cfg = BalancerSimConfig(daemons=50, queues=256, steady_s=4.0, seed=3)
    result = run(cfg)
    load = {entry.category: entry for entry in result.load}
    # No daemon reads the 256 lease holders while nothing changes.
    assert load[REBALANCE].keys_per_s < 4 * cfg.daemons
    assert load[HEARTBEAT].ops_per_s == pytest.approx(cfg.daemons * 1.0, rel=0.02)
    assert load[RENEWAL].ops_per_s == pytest.approx(cfg.queues / 2.0, rel=0.05)
    join, leave, crash = result.events
    assert join.moved == join.handed_off == cfg.queues // (cfg.daemons + 1)
    assert leave.moved == leave.handed_off in (5, 6)  # 256 / 51: the leaver held 5 or 6
    assert crash.moved in (5, 6) and crash.handed_off == 0
    for event in result.events:
        assert event.settle_s is not None and event.double_owned == 0
    assert crash.settle_s is not None
    assert crash.settle_s <= cfg.lease_ttl_s + cfg.rebalance_interval_s


def test_a_renewal_costs_the_bytes_of_its_resp_request_and_reply() -> None:
    async def renew_one() -> tuple[int, int]:
        store = SimStore(8, rtt_s=0.0)
        lease = await SimLeaseStore(store).acquire(3, "host-a", 5.0)
        assert lease is not None
        ok, nbytes = store.renew(lease, 5.0)
        assert ok
        return lease.token, nbytes

    token, nbytes = run_virtual(renew_one())
    key, value = "conveyor:app:sim:lease:3", f"{token} host-a"
    request = (f"*6\r\n$7\r\nEVALSHA\r\n$40\r\n{'0' * 40}\r\n$1\r\n1\r\n"
               f"${len(key)}\r\n{key}\r\n${len(value)}\r\n{value}\r\n$4\r\n5000\r\n")
    assert nbytes == len(request) + len(":1\r\n")


def test_the_virtual_clock_jumps_over_sleeps_and_kill_stops_a_whole_process() -> None:
    loop = VirtualTimeLoop()
    ticks: list[float] = []

    async def ticking() -> None:
        while True:
            await asyncio.sleep(10.0)
            ticks.append(loop.time())

    async def main() -> None:
        import contextvars

        from conveyor.lab.virtual_time import owner_var

        context = contextvars.copy_context()
        context.run(owner_var.set, "daemon-a")
        loop.create_task(ticking(), context=context)
        await asyncio.sleep(35.0)
        assert loop.kill("daemon-a") == 1
        await asyncio.sleep(100.0)

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert ticks == [10.0, 20.0, 30.0]
    assert loop.time() == pytest.approx(135.0)


def test_daemons_started_at_once_do_not_hit_the_store_in_step() -> None:
    # Every timer starts at a phase drawn from the daemon's id: without it, fifty
    # daemons started together poll, beat and renew in the same instant (the busiest
    # 0.1 s held 8x the mean rate); with it, under 4x.
    result = run(BalancerSimConfig(daemons=50, queues=256, steady_s=4.0, ramp_s=0.0))
    mean = sum(entry.ops_per_s for entry in result.load)
    assert result.peak_ops_per_s < 4 * mean


def test_a_settled_daemon_still_rebalances_in_full_every_30_to_60_intervals(
    small: BalancerSimResult,
) -> None:
    # A counter can miss a change (a daemon of an older version, a failed-over Redis),
    # so every 30-60 s (interval 1 s) a settled daemon reads the members and all 8 lease
    # holders anyway: 13 keys instead of the 3 of a settled check, 10 more per re-check.
    long = run(BalancerSimConfig(daemons=3, queues=8, steady_s=120.0))
    extra = ({e.category: e for e in long.load}[REBALANCE].keys_per_s
             - {e.category: e for e in small.load}[REBALANCE].keys_per_s)
    assert 3 * 10 / 60 * 0.6 <= extra <= 3 * 10 / 30


INTERRUPT_AT_S = 60.0
"""Virtual seconds into a run when the Ctrl-C test interrupts it."""


def test_ctrl_c_during_a_run_leaves_no_task_to_be_destroyed_pending(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    # `conveyor sim balancer` stopped by Ctrl-C printed its one line, then some 8,500 of
    # "Task was destroyed but it is pending!" and "Exception ignored in" tracebacks: the
    # loop was closed with every simulated daemon's tasks still in it.
    import gc
    import sys

    from conveyor.lab.virtual_time import VirtualTimeLoop

    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    # Ctrl-C as the loop waits for its next timer (where a run spends its time), once
    # the daemons are up and balancing: deterministic, where a real signal could land
    # in a finalizer and be swallowed as unraisable.
    advance = VirtualTimeLoop.advance
    pressed: list[float] = []  # once, as a person presses it

    def interrupted_advance(loop: VirtualTimeLoop, seconds: float) -> None:
        advance(loop, seconds)
        if loop.time() > INTERRUPT_AT_S and not pressed:
            pressed.append(loop.time())
            raise KeyboardInterrupt

    monkeypatch.setattr(VirtualTimeLoop, "advance", interrupted_advance)
    with pytest.raises(KeyboardInterrupt):
        run(BalancerSimConfig(daemons=20, queues=80, steady_s=3_600.0))
    assert len(pressed) == 1
    gc.collect()
    logged = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert logged == [] and unraisable == [], (len(logged), logged[:3], unraisable[:3])
