"""The lab's click commands: JSON shapes, plots, usage errors (exit 2, no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conveyor.cli import main
from conveyor.cli.sim import sim
from conveyor.cli.tune import tune


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
    assert_png(png)


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


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000  # a drawn figure, not an empty canvas


@pytest.mark.slow
def test_tune_json_shape(runner: CliRunner) -> None:
    res = runner.invoke(tune, ["--population", "2", "--generations", "0", "--seed", "1", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert set(doc["best"]) == {"kp", "ki", "kd"}
    # one GA over the six patterns, then one GA per pattern: 2 x 6 + 6 x 2
    assert doc["evaluations"] == 2 * 6 + 6 * 2
    assert set(doc["patterns"]) == {
        "constant",
        "periodic",
        "ramp",
        "spike",
        "burst",
        "chaotic",
        "poisson",
    }
    assert set(doc["patterns"]["poisson"]) == {"tuned", "averaged", "default", "static"}
    assert "poisson" not in doc["training_patterns"]
    assert set(doc["per_pattern"]) == set(doc["training_patterns"])
    assert set(doc["plateau"]) == {"count", "centroid", "low", "high"}
    assert 1 <= doc["plateau"]["count"] <= 2
    for k in ("kp", "ki", "kd"):
        assert doc["plateau"]["low"][k] <= doc["best"][k] <= doc["plateau"]["high"][k]
        winners = [r["best"][k] for r in doc["per_pattern"].values()]
        assert doc["averaged"][k] == pytest.approx(sum(winners) / len(winners))


@pytest.mark.slow
def test_tune_text_report_names_the_plateau_and_the_averaged_gains(runner: CliRunner) -> None:
    res = runner.invoke(tune, ["--population", "2", "--generations", "0"])
    assert res.exit_code == 0, res.output
    assert "distinct" in res.output and "plateau" in res.output
    assert "averaged: Kp=" in res.output
    assert "poisson*" in res.output
    too_wide = [line for line in res.stdout.splitlines() if len(line) > 80]
    assert not too_wide, "\n".join(too_wide)  # readable in an 80-column terminal


def test_placement_json_shape(runner: CliRunner) -> None:
    res = runner.invoke(sim, ["placement", "--trials", "1", "--balls-per-bin", "2", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert set(doc) == {"balls_per_bin", "trials", "results"}
    assert doc["balls_per_bin"] == 2 and doc["trials"] == 1
    rows = doc["results"]
    assert {r["strategy"] for r in rows} == {"random", "k2", "ksqrt", "jsq"}
    ns = sorted({r["n"] for r in rows})
    assert ns[0] == 2 and ns[-1] == 1000
    assert len(rows) == len(ns) * 4 * 2  # every size x strategy x fresh/stale
    for r in rows:
        assert set(r) == {"n", "strategy", "stale", "max_load", "spread"}
        assert isinstance(r["stale"], bool)
        assert r["max_load"] >= 2 and 0 <= r["spread"] <= r["max_load"]
    # join-shortest-queue with fresh statistics places perfectly evenly
    assert all(r["spread"] == 0 for r in rows if r["strategy"] == "jsq" and not r["stale"])


def test_placement_plot(runner: CliRunner, tmp_path: Path) -> None:
    png = tmp_path / "placement.png"
    res = runner.invoke(
        sim, ["placement", "--trials", "1", "--balls-per-bin", "2", "--plot", str(png)]
    )
    assert res.exit_code == 0, res.output
    assert_png(png)
    assert "K=sqrt(n)" in res.output  # the table is still printed


def test_pattern_plot(runner: CliRunner, tmp_path: Path) -> None:
    png = tmp_path / "burst.png"
    res = runner.invoke(sim, ["--pattern", "burst", "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert_png(png)
    assert f"plot written to {png}" in res.output


@pytest.mark.parametrize("signal", ["drop", "rise", "wave", "noise"])
def test_filter_plot(runner: CliRunner, tmp_path: Path, signal: str) -> None:
    png = tmp_path / f"{signal}.png"
    res = runner.invoke(sim, ["filter", "--signal", signal, "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert_png(png)


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


@pytest.mark.parametrize(("text", "says"), [
    # An OverflowError (an infinite duration), then numpy's MemoryError ("Unable to
    # allocate 74.5 GiB"), as tracebacks.
    ("1.0\n1e308\n", "a.txt:2: an arrival time is at most 86400 seconds (a day), got 1e308"),
    ("1.0\n1e9\n", "a.txt:2: an arrival time is at most 86400 seconds (a day), got 1e9"),
    # A line without end (/dev/zero has no newline) was read whole, into memory.
    ("1.0\n" + "0" * 100_000, "a.txt:2: a line of more than 1000 characters is no number"),
])
def test_an_arrivals_file_past_what_a_replay_can_run_is_a_usage_error(
    runner: CliRunner, tmp_path: Path, text: str, says: str,
) -> None:
    arrivals = tmp_path / "a.txt"
    arrivals.write_text(text)
    res = runner.invoke(main, ["sim", "--arrivals", str(arrivals)])
    assert res.exit_code == 2, res.output
    [line] = res.stderr.splitlines()
    assert line.startswith("conveyor: error: Invalid value for --arrivals: "), line
    assert says in line, line
    assert len(line) < 300, line


def test_a_plot_file_is_a_png_whatever_its_name(runner: CliRunner, tmp_path: Path) -> None:
    # Matplotlib chose the format from the name: `--plot plot.txt` was a traceback
    # ("Format 'txt' is not supported").
    out = tmp_path / "plot.txt"
    res = runner.invoke(sim, ["--pattern", "spike", "--plot", str(out)])
    assert res.exit_code == 0, res.output
    assert_png(out)


def test_a_plot_that_cannot_be_written_is_a_usage_error_not_a_plot_written(
    runner: CliRunner,
) -> None:
    # Matplotlib lost the write's error: exit 0, "plot written to /dev/full", nothing
    # written (a full disk: a cut PNG).
    res = runner.invoke(main, ["sim", "--pattern", "spike", "--plot", "/dev/full"])
    assert res.exit_code == 2, res.output
    assert "plot written" not in res.stdout
    [line] = res.stderr.splitlines()
    assert line.startswith("conveyor: error: Invalid value for --plot: cannot write "
                           "/dev/full: No space left on device"), line


@pytest.mark.parametrize(
    "args", [["--population", "1"], ["--mutation", "2"], ["--generations", "-3"]]
)
def test_tune_usage_errors_exit_2(runner: CliRunner, args: list[str]) -> None:
    res = runner.invoke(tune, args)
    assert res.exit_code == 2
    assert "Traceback" not in res.output


def test_sim_balancer_json_reports_steady_load_and_every_event(runner: CliRunner) -> None:
    res = runner.invoke(sim, ["balancer", "--daemons", "3", "--queues", "8", "--steady", "2",
                              "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert set(doc["steady"]) == {"heartbeat", "renewal", "change_poll", "rebalance_read",
                                  "acquire_release"}
    assert set(doc["steady"]["renewal"]) == {"ops_per_s", "keys_per_s", "bytes_per_s"}
    assert [e["event"] for e in doc["events"]] == ["join", "graceful leave", "crash"]
    assert all(e["double_owned"] == 0 and e["settle_s"] is not None for e in doc["events"])


def test_sim_balancer_prints_a_table_and_plots(runner: CliRunner, tmp_path: Path) -> None:
    png = tmp_path / "balancer.png"
    res = runner.invoke(sim, ["balancer", "--daemons", "3", "--queues", "8", "--steady", "2",
                              "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert "change poll" in res.output and "graceful leave" in res.output
    assert png.stat().st_size > 10_000


def test_sim_balancer_refuses_more_daemons_than_queues(runner: CliRunner) -> None:
    res = runner.invoke(sim, ["balancer", "--daemons", "9", "--queues", "8"])
    assert res.exit_code == 2
    assert "9 daemons for 8 queues" in res.output
    assert "Traceback" not in res.output
