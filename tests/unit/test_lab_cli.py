"""The lab's click commands: JSON shapes, plots, usage errors (exit 2, no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conveyor.lab.cli import sim, tune


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_sim_json_has_exactly_the_documented_shape(runner: CliRunner) -> None:
    res = runner.invoke(sim, ["--pattern", "ramp", "--seed", "1", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert set(doc) == {"pattern", "static", "dynamic"}
    assert doc["pattern"] == "ramp"
    for run in ("static", "dynamic"):
        assert set(doc[run]) == {"avg_workers", "avg_queue_length"}
        assert all(isinstance(v, float) for v in doc[run].values())
    assert doc["dynamic"]["avg_workers"] < doc["static"]["avg_workers"]


def test_sim_is_reproducible_with_a_seed(runner: CliRunner) -> None:
    a = runner.invoke(sim, ["--pattern", "chaotic", "--seed", "4", "--json"]).output
    b = runner.invoke(sim, ["--pattern", "chaotic", "--seed", "4", "--json"]).output
    assert a == b


def test_sim_replays_an_arrivals_file_and_plots(runner: CliRunner, tmp_path: Path) -> None:
    arrivals = tmp_path / "a.txt"
    arrivals.write_text("\n".join(str(0.001 * i) for i in range(300)))
    png = tmp_path / "out.png"
    res = runner.invoke(sim, ["--arrivals", str(arrivals), "--json", "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["pattern"] == "replay"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_filter_json_reports_raw_and_filtered(runner: CliRunner) -> None:
    res = runner.invoke(sim, ["filter", "--signal", "drop", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["signal"] == "drop" and doc["samples"] == 2500
    assert (
        set(doc["raw"])
        == set(doc["filtered"])
        == {
            "mean",
            "min",
            "max",
            "std",
            "mean_abs_change",
        }
    )
    assert doc["stall"]["filtered_fall"] < 0.5 * doc["stall"]["raw_fall"]


def test_tune_json_shape(runner: CliRunner) -> None:
    res = runner.invoke(tune, ["--population", "2", "--generations", "0", "--seed", "1", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert set(doc["best"]) == {"kp", "ki", "kd"}
    assert doc["evaluations"] == 2 * 6
    assert set(doc["patterns"]) == {
        "constant",
        "periodic",
        "ramp",
        "spike",
        "burst",
        "chaotic",
        "poisson",
    }
    assert set(doc["patterns"]["poisson"]) == {"tuned", "default", "static"}
    assert "poisson" not in doc["training_patterns"]


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--pattern", "square"],
        ["--pattern", "spike", "--seed", "x"],
        ["--pattern", "spike", "--arrivals", "/nonexistent/file"],
        ["--json", "filter", "--signal", "drop"],
        ["filter"],
        ["filter", "--signal", "sawtooth"],
        ["placement", "--trials", "0"],
    ],
)
def test_sim_usage_errors_exit_2_without_traceback(runner: CliRunner, args: list[str]) -> None:
    res = runner.invoke(sim, args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_bad_arrivals_file_is_a_usage_error(runner: CliRunner, tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("1.0\nsoon\n")
    res = runner.invoke(sim, ["--arrivals", str(bad)])
    assert res.exit_code == 2
    assert "bad.txt:2" in res.output


@pytest.mark.parametrize(
    "args", [["--population", "1"], ["--mutation", "2"], ["--generations", "-3"]]
)
def test_tune_usage_errors_exit_2(runner: CliRunner, args: list[str]) -> None:
    res = runner.invoke(tune, args)
    assert res.exit_code == 2
    assert "Traceback" not in res.output
