"""Resource-based supplier: decisions from fed samples, on a fake clock."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import psutil
import pytest

from conveyor import load_config
from conveyor.platform.slots import SlotPermit
from conveyor.workers.resources import (
    CgroupV2Sampler,
    HostSampler,
    ResourceSample,
    own_cgroup,
)
from conveyor.workers.slots.build import supplier_from_config
from conveyor.workers.slots.resource import ResourceBasedSlotSupplier
from tests.slot_context import CTX


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def supplier(clock: Clock, **kw: object) -> ResourceBasedSlotSupplier:
    return ResourceBasedSlotSupplier(clock=clock, sample_in_background=False, **kw)  # type: ignore[arg-type]


async def test_min_slots_are_issued_before_any_sample_and_no_more() -> None:
    clock = Clock()
    s = supplier(clock, min_slots=2)
    a = s.try_reserve_slot(CTX)
    b = s.try_reserve_slot(CTX)
    assert a is not None and b is not None
    assert s.try_reserve_slot(CTX) is None  # no sample yet: no evidence of room


async def test_with_room_it_ramps_one_slot_per_throttle_interval() -> None:
    clock = Clock()
    s = supplier(clock, ramp_throttle_s=0.05, max_slots=100)
    s.observe(ResourceSample(cpu=0.1, memory=0.2))
    permits: list[SlotPermit] = []
    for _ in range(5):
        p = s.try_reserve_slot(CTX)
        assert p is not None
        permits.append(p)
        assert s.try_reserve_slot(CTX) is None  # throttled until 50 ms pass
        clock.now += 0.051
    assert s.issued == 5


async def test_cpu_or_memory_near_target_stops_issuing_and_max_slots_caps() -> None:
    clock = Clock()
    s = supplier(clock, ramp_throttle_s=0.0, max_slots=3, target_cpu=0.8, target_memory=0.8)
    for _ in range(3):  # steady: no derivative kick
        s.observe(ResourceSample(cpu=0.795, memory=0.2))  # P*0.005 < 0.05
    assert s.try_reserve_slot(CTX) is not None  # the min_slots floor
    assert s.try_reserve_slot(CTX) is None
    s2 = supplier(clock, ramp_throttle_s=0.0, max_slots=3)
    for _ in range(3):
        s2.observe(ResourceSample(cpu=0.1, memory=0.76))  # memory needs 5 points of room
    assert s2.try_reserve_slot(CTX) is not None and s2.try_reserve_slot(CTX) is None
    s3 = supplier(clock, ramp_throttle_s=0.0, max_slots=3)
    s3.observe(ResourceSample(cpu=0.1, memory=0.1))
    assert [s3.try_reserve_slot(CTX) is not None for _ in range(4)] == [True, True, True, False]


async def test_a_spike_stops_issuing_at_once_but_a_short_dip_does_not_open_the_gates() -> None:
    clock = Clock()
    s = supplier(clock, ramp_throttle_s=0.0, min_slots=1)
    for _ in range(20):
        s.observe(ResourceSample(cpu=0.95, memory=0.3))  # busy
    held = s.try_reserve_slot(CTX)
    assert held is not None and s.try_reserve_slot(CTX) is None
    s.observe(ResourceSample(cpu=0.05, memory=0.3))  # one sample of I/O stall
    assert s.cpu > 0.8, "the slow filter decays gently: a one-sample dip is not room"
    assert s.try_reserve_slot(CTX) is None
    for _ in range(60):  # the load really went away
        s.observe(ResourceSample(cpu=0.05, memory=0.3))
    assert s.try_reserve_slot(CTX) is not None
    s.observe(ResourceSample(cpu=0.99, memory=0.3))  # a spike is followed at once
    assert s.cpu > 0.9 and s.try_reserve_slot(CTX) is None


async def test_waiters_are_woken_by_a_sample_with_room_and_by_the_throttle_expiring() -> None:
    s = ResourceBasedSlotSupplier(ramp_throttle_s=0.03, sample_in_background=False)
    first = await s.reserve_slot(CTX)  # the floor
    waiters = [asyncio.create_task(s.reserve_slot(CTX)) for _ in range(2)]
    await asyncio.sleep(0.04)
    assert not any(w.done() for w in waiters)  # no sample yet: no evidence of room
    s.observe(ResourceSample(cpu=0.1, memory=0.1))  # room: one now, one after 30 ms
    await asyncio.sleep(0)
    assert sum(w.done() for w in waiters) == 1
    await asyncio.wait_for(asyncio.gather(*waiters), 1)
    assert s.issued == 3
    for p in [first, *(w.result() for w in waiters)]:
        p.release()
    assert s.issued == 0


async def test_a_cancelled_waiter_takes_no_slot() -> None:
    s = ResourceBasedSlotSupplier(sample_in_background=False)
    held = await s.reserve_slot(CTX)
    waiter = asyncio.create_task(s.reserve_slot(CTX))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    held.release()
    assert s.issued == 0


async def test_background_sampling_uses_the_injected_sampler() -> None:
    class Fixed:
        calls = 0

        def sample(self) -> ResourceSample:
            self.calls += 1
            return ResourceSample(cpu=0.2, memory=0.2)

    sampler = Fixed()
    s = ResourceBasedSlotSupplier(sampler=sampler, sample_period_s=0.01, ramp_throttle_s=0.0)
    permits = [await asyncio.wait_for(s.reserve_slot(CTX), 1) for _ in range(5)]
    assert sampler.calls >= 1 and len(permits) == 5
    await s.close()


def test_config_builds_it_and_the_samplers_read_this_machine() -> None:
    config = load_config(environ={}, overrides={"slots": {
        "kind": "resource-based", "resource": {"min_slots": 2, "max_slots": 50}}})
    s = supplier_from_config(config.slots)
    assert isinstance(s, ResourceBasedSlotSupplier)
    assert (s.min_slots, s.max_slots, s.ramp_throttle_s) == (2, 50, 0.05)
    sample = HostSampler().sample()
    assert 0 <= sample.cpu <= 1 and 0 < sample.memory < 1


def test_cgroup_sampler_reads_anon_memory_and_the_cpu_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu.stat").write_text("usage_usec 1000000\nuser_usec 1\n")
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    (tmp_path / "memory.max").write_text(str(1 << 30) + "\n")
    (tmp_path / "memory.stat").write_text(f"anon {1 << 28}\nfile {1 << 29}\n")
    sampler = CgroupV2Sampler(tmp_path)
    assert sampler.cpus == 0.5
    sample = sampler.sample()
    assert sample.memory == pytest.approx(0.25)  # the 512 MiB of page cache is ignored
    assert CgroupV2Sampler.available(tmp_path)


def test_the_cgroup_sampler_gives_placement_anon_memory_and_room_below_the_limit(
    tmp_path: Path,
) -> None:
    """Used is anonymous memory; available is the limit less the working set
    (memory.current less inactive_file), never above what the host has available."""
    mib = 1 << 20
    (tmp_path / "cpu.stat").write_text("usage_usec 0\n")
    (tmp_path / "memory.max").write_text(f"{64 * mib}\n")
    (tmp_path / "memory.current").write_text(f"{40 * mib}\n")
    (tmp_path / "memory.stat").write_text(
        f"anon {24 * mib}\nfile {16 * mib}\ninactive_file {8 * mib}\n")
    sample = CgroupV2Sampler(tmp_path).sample()
    assert (sample.memory_used_bytes, sample.memory_limit_bytes) == (24 * mib, 64 * mib)
    assert sample.memory == pytest.approx(24 / 64)
    assert psutil.virtual_memory().available > 32 * mib  # so the cgroup's figure is the bound
    assert sample.memory_available_bytes == (64 - (40 - 8)) * mib
    (tmp_path / "memory.current").unlink()  # the root cgroup has none: the host's figure
    no_current = CgroupV2Sampler(tmp_path).sample()
    assert 0 < no_current.memory_available_bytes <= psutil.virtual_memory().total


def test_the_host_sampler_gives_placement_psutils_used_available_and_total() -> None:
    sample = HostSampler().sample()
    assert sample.memory_limit_bytes == psutil.virtual_memory().total
    assert 0 < sample.memory_used_bytes < sample.memory_limit_bytes
    assert 0 < sample.memory_available_bytes <= sample.memory_limit_bytes
    assert sample.memory == pytest.approx(sample.memory_used_bytes / sample.memory_limit_bytes)


def fake_cgroup(d: Path, *, cpu_max: str | None = None, memory_max: str | None = None,
                anon: int = 0, usage_usec: int = 0) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "cpu.stat").write_text(f"usage_usec {usage_usec}\n")
    (d / "memory.stat").write_text(f"anon {anon}\nfile {1 << 29}\n")
    if cpu_max is not None:
        (d / "cpu.max").write_text(cpu_max + "\n")
    if memory_max is not None:
        (d / "memory.max").write_text(memory_max + "\n")
    return d


def test_the_sampler_finds_this_process_cgroup_from_proc_self_cgroup(tmp_path: Path) -> None:
    mount = fake_cgroup(tmp_path / "cgroup")
    unit = fake_cgroup(mount / "system.slice" / "app.service")
    proc = tmp_path / "cgroup-of-self"
    proc.write_text("4:memory:/elsewhere\n0::/system.slice/app.service\n")  # hybrid v1+v2
    assert own_cgroup(mount, proc) == unit
    proc.write_text("0::/\n")  # a container with its own cgroup namespace
    assert own_cgroup(mount, proc) == mount
    proc.write_text("0::/not/visible/here\n")
    assert own_cgroup(mount, proc) == mount
    proc.write_text("4:memory:/x\n")  # cgroup v1 only
    assert own_cgroup(mount, proc) == mount
    assert own_cgroup(mount, tmp_path / "missing") == mount


def test_the_sampler_reads_its_own_cgroup_under_the_tightest_parent_limit(
    tmp_path: Path,
) -> None:
    mount = fake_cgroup(tmp_path / "cgroup", anon=1 << 33)  # the root: everything's memory
    parent = fake_cgroup(mount / "pod", cpu_max="150000 100000", memory_max=str(1 << 30))
    own = fake_cgroup(parent / "worker", cpu_max="max", memory_max="max", anon=1 << 28)
    sampler = CgroupV2Sampler(own, mount=mount)
    assert sampler.cpus == min(1.5, os.cpu_count() or 1)  # never above the host's cores
    assert sampler.memory_limit == min(1 << 30, psutil.virtual_memory().total)
    # anon of this cgroup (256 MiB) against the parent's 1 GiB, not the root's 8 GiB.
    assert sampler.sample().memory == pytest.approx((1 << 28) / sampler.memory_limit)
    (own / "cpu.max").write_text("50000 100000\n")  # tighter than the parent's
    assert CgroupV2Sampler(own, mount=mount).cpus == 0.5
