"""The throughput table and JSON: Conveyor next to both consume floors (the counting
loop and the loop awaiting a no-op per record), with a ratio to each."""

from __future__ import annotations

import pytest

from conveyor.bench.figures import ThroughputResult, spreads


def _result() -> ThroughputResult:
    runs = [
        {"msgs_per_s": 60.0, "cpu_us_per_msg": 10.0, "startup_s": 0.1,
         "floor_msgs_per_s": 80.0, "floor_cpu_us_per_msg": 8.0, "floor_startup_s": 0.0,
         "count_floor_msgs_per_s": 100.0, "count_floor_cpu_us_per_msg": 5.0,
         "count_floor_startup_s": 0.0},
        {"msgs_per_s": 70.0, "cpu_us_per_msg": 12.0, "startup_s": 0.1,
         "floor_msgs_per_s": 90.0, "floor_cpu_us_per_msg": 8.0, "floor_startup_s": 0.0,
         "count_floor_msgs_per_s": 100.0, "count_floor_cpu_us_per_msg": 6.0,
         "count_floor_startup_s": 0.0},
    ]
    return ThroughputResult("redis", "shipped", "configs/redis.toml", 100, 10, 8, 64,
                            spreads(runs), repeats=2, floor="await loop",
                            count_floor="counting loop")


def test_the_ratios_compare_conveyor_with_each_floor() -> None:
    data = _result().as_dict()
    assert data["count_ratio"] == pytest.approx(65.0 / 100.0)
    assert data["ratio"] == pytest.approx(65.0 / 85.0)
    assert data["count_cpu_ratio"] == pytest.approx(5.5 / 11.0)
    assert data["spread"]["count_ratio"] == pytest.approx([0.6, 0.7])
    assert (data["floor"], data["count_floor"]) == ("await loop", "counting loop")


def test_the_table_prints_both_floors_and_says_what_each_is() -> None:
    table = _result().table()
    lines = table.splitlines()
    labels = [line[2:].split("  ")[0] for line in lines
              if line.startswith("  ") and not line.startswith("    ")]
    assert labels[:4] == ["conveyor", "raw loop, counting", "raw loop, await each",
                          "ratio (/ counting)"]
    assert "  ratio (/ await each)" in table
    assert "raw consume loop, counting: counting loop" in table
    assert "raw consume loop, await each: await loop" in table
    assert all(len(line) <= 80 for line in lines)


def test_a_result_without_a_counting_floor_prints_the_ratio_it_has() -> None:
    runs = [{"msgs_per_s": 60.0, "cpu_us_per_msg": 10.0, "floor_msgs_per_s": 80.0,
             "floor_cpu_us_per_msg": 8.0}]
    table = ThroughputResult("memory", "shipped", "x", 1, 1, 1, 1, spreads(runs)).table()
    assert "ratio (/ await each)" in table
    assert "counting" not in table
