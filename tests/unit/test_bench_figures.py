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


def _publish_run(send_floor: float | None) -> dict[str, float]:
    run = {"msgs_per_s": 60.0, "cpu_us_per_msg": 10.0, "floor_msgs_per_s": 80.0,
           "floor_cpu_us_per_msg": 8.0, "publish_msgs_per_s": 50.0,
           "publish_cpu_us_per_msg": 4.0, "publish_floor_msgs_per_s": 100.0,
           "publish_floor_cpu_us_per_msg": 2.0, "publish_single_msgs_per_s": 5.0,
           "publish_single_cpu_us_per_msg": 20.0}
    if send_floor is not None:
        run |= {"publish_send_floor_msgs_per_s": send_floor,
                "publish_send_floor_cpu_us_per_msg": 5.0}
    return run


def test_a_second_publish_floor_is_printed_next_to_the_first_with_its_own_ratio() -> None:
    runs = [_publish_run(40.0), _publish_run(60.0)]
    result = ThroughputResult("kafka", "shipped", "configs/kafka.toml", 100, 10, 8, 64,
                              spreads(runs), repeats=2, floor="await loop",
                              publish_floor="send_batch", publish_send_floor="send each")
    data = result.as_dict()
    assert data["publish_ratio"] == pytest.approx(50.0 / 100.0)  # its meaning unchanged
    assert data["publish_send_ratio"] == pytest.approx(50.0 / 50.0)
    assert data["spread"]["publish_send_ratio"] == pytest.approx([50.0 / 60.0, 50.0 / 40.0])
    assert data["spread"]["publish_send_floor_msgs_per_s"] == [40.0, 60.0]
    assert (data["publish_floor"], data["publish_send_floor"]) == ("send_batch", "send each")
    table = result.table()
    assert "  raw loop, send each" in table
    ratio = [line for line in table.splitlines() if line.startswith("  ratio (batch / send)")]
    assert ratio and ratio[0].endswith(" 1.000 (0.833..1.250)")
    assert "raw publish loop, send each: send each" in table
    assert all(len(line) <= 80 for line in table.splitlines())


def test_a_result_with_one_publish_floor_prints_no_second() -> None:
    result = ThroughputResult("redis", "shipped", "configs/redis.toml", 100, 10, 8, 64,
                              spreads([_publish_run(None)]), floor="await loop",
                              publish_floor="pipeline")
    data = result.as_dict()
    assert "publish_send_ratio" not in data and "publish_send_floor" not in data
    assert "send each" not in result.table()
    assert "ratio (batch / raw)" in result.table()
