"""The CLI as a user runs it: subprocesses, signals, exit codes, messages."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port, reaped, stop_when, wait_until_sync
from tests.e2e.test_tour import Daemon

ROOT = Path(__file__).resolve().parents[2]


def conveyor(*args: str, env: dict[str, str] | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conveyor.cli", *args], capture_output=True, text=True,
        cwd=ROOT, env={**os.environ, **(env or {})}, timeout=timeout,
    )


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_sigterm_drains_a_real_worker_losing_and_leaving_nothing(tmp_path: Path) -> None:
    out = tmp_path / "handled.txt"
    env = {**os.environ, "CONVEYOR_TEST_OUT": str(out), "CONVEYOR_TEST_MESSAGES": "3000",
           "CONVEYOR_TEST_WORK_MS": "5"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.drain_app:app",
         "--config", "configs/local.toml", "--slots", "16"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    stderr = stop_when(proc, lambda: len(lines(out)) >= 200, 30, "the worker to handle 200")
    assert "Traceback" not in stderr
    handled = [line.split()[0] for line in lines(out)]
    published = set(lines(Path(str(out) + ".published")))
    assert len(published) == 3000
    match = re.search(r"drained pulled=(\d+) acked=(\d+) handled=(\d+) "
                      r"dead_lettered=(\d+) abandoned=(\d+) skipped=(\d+) released=(\d+)",
                      stderr)
    assert match, stderr
    pulled, acked, n_handled, dead, abandoned, skipped, released = map(int, match.groups())
    # Every call under way finished and was acknowledged; what no handler had started was
    # handed back unacknowledged (released) for the next owner; nothing left half-done.
    assert acked == n_handled == len(handled) and dead == abandoned == skipped == 0
    assert pulled == acked + released
    assert len(set(handled)) == len(handled), "duplicates"
    assert set(handled) <= published
    assert 200 <= len(handled) < 3000, "the signal should have arrived mid-run"
    # Per-stream order in what was handled.
    seqs: dict[str, list[int]] = {}
    for line in lines(out):
        _, key, seq = line.split()
        seqs.setdefault(key, []).append(int(seq))
    assert all(s == sorted(s) for s in seqs.values())


def test_bad_config_exits_2_and_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[worker]\ncache_capacity = -1\n")
    result = conveyor("worker", "tests.apps.drain_app:app", "--config", str(bad))
    assert result.returncode == 2
    assert "$.worker.cache_capacity" in result.stderr and "Traceback" not in result.stderr
    result = conveyor("worker", "tests.apps.drain_app:app",
                      env={"CONVEYOR_SLOTS__COUNT": "zero"})
    assert result.returncode == 2 and "$.slots.count" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["worker"], "Missing argument 'APP_PATH'"),
        (["worker", "no_such_module:app"], "cannot import"),
        (["worker", "tests.apps.drain_app:nope"], "has no attribute 'nope'"),
        (["worker", "x:app", "--config", "/no/such.toml"], "does not exist"),
        (["worker", "x:app", "--slots", "0"], "--slots"),
        (["demo", "--messages", "0"], "--messages"),
        (["demo", "--poison", "9", "-n", "5"], "--poison"),
        (["publish", "orders", "k1", "{}", "-H", "novalue"], "NAME=VALUE"),
        (["rewind", "--app", "a", "--to", "yesterday"], "neither a token"),
        # A time of day read as a token moved queue 3 to its first message.
        (["rewind", "--app", "a", "--to", "03:00"], "a time of day, not a token"),
        (["rewind", "--app", "a", "--to", "3:15"], "a time of day, not a token"),
        (["bench", "throughput", "--adapter", "nope"], "--adapter"),
        (["frobnicate"], "No such command"),
    ],
)
def test_wrong_arguments_get_a_usage_error_not_a_traceback(args: list[str], message: str) -> None:
    result = conveyor(*args)
    assert result.returncode == 2, result.stderr
    # Click's own parse errors too come in the CLI's one style: one line, not a usage block.
    [line] = result.stderr.splitlines()
    assert line.startswith("conveyor: error: ") and message in line, line


# Issue 13's list of user mistakes, each with the words its one-line message must hold.
USER_MISTAKES = [
    (["sim", "--pattern", "spike", "--plot", "/nonexistent/x.png"],
     "--plot", "no such directory /nonexistent"),
    (["sim", "filter", "--signal", "drop", "--plot", "/nonexistent/x.png"],
     "--plot", "no such directory /nonexistent"),
    (["sim", "placement", "--plot", "/nonexistent/x.png"],
     "--plot", "no such directory /nonexistent"),
    (["publish", "orders", "k1", "{}", "-H", "cv-ns=x", "--config", "configs/redis.toml"],
     "--header", "'cv-ns' is reserved by the wire format"),
    (["worker", "tests.apps.drain_app:app", "--processes", "1:2"],
     "--processes", "the memory adapter lives inside one process"),
    (["worker", "tests.apps.drain_app:app", "--processes", "20:20", "--config",
      "configs/redis.toml"],
     "--processes", "MIN 20 is more than the 8 queues ([queues] total)"),
    (["worker", "tests.apps.drain_app:nope"],
     "APP_PATH", "has no attribute 'nope'"),
    # Read until the kernel killed the command (exit 137).
    (["demo", "--config", "/dev/zero"], "/dev/zero", "larger than 1 MiB, which no config is"),
    (["deploy", "kubernetes", "--app", "tests.apps.recorder:app", "--config", "/dev/zero"],
     "/dev/zero", "larger than 1 MiB, which no config is"),
    (["rewind", "--app", "shop", "--to", "2:1-0"],
     "rewind", "the memory adapter lives inside the worker's process"),
    (["status", "--app", "shop"],
     "status", "the memory adapter lives inside the worker's process"),
    (["publish", "orders", "k1", "{}"],
     "publish", "the memory adapter lives inside the worker's process"),
    (["groups", "list"],
     "groups list", "would list none; use --config with a redis or kafka config"),
    (["groups", "delete", "--app", "shop"],
     "groups delete", "the memory adapter lives inside the worker's process"),
    # Checked before the config's broker is asked anything: no server needed.
    (["publish", "", "k1", "{}", "--config", "configs/redis.toml"],
     "NAMESPACE", "must be a non-empty string"),
    (["publish", "orders", "", "{}", "--config", "configs/redis.toml"],
     "KEY", "must be a non-empty string"),
    # Were published, as the client took them.
    (["publish", "a\x01b", "k1", "{}", "--config", "configs/redis.toml"],
     "NAMESPACE", r"'a\x01b' holds a control character ('\x01')"),
    (["publish", "n" * 300, "k1", "{}", "--config", "configs/redis.toml"],
     "NAMESPACE", "(300 characters) is longer than 255 characters"),
    (["publish", "orders", "k" * 2000, "{}", "--config", "configs/redis.toml"],
     "KEY", "(2,000 characters) is longer than 1,024 characters"),
    (["publish", "orders", "k1", "{}", "-H", "a=1", "-H", "a=2", "--config",
      "configs/redis.toml"],
     "--header", "'a' given twice"),
    (["publish", "orders", "k1", "x", "--content-type", "", "--config", "configs/redis.toml"],
     "--content-type", "'' is not a media type TYPE/SUBTYPE"),
    (["publish", "orders", "k1", "x", "--content-type", "bad type", "--config",
      "configs/redis.toml"],
     "--content-type", "'bad type' is not a media type TYPE/SUBTYPE"),
    (["bench", "throughput", "--adapter", "redis", "--redis-url", "htp://x"],
     "--redis-url", "expected redis:// or rediss://, got htp://x"),
]


@pytest.mark.parametrize("args", [
    ["asyncapi", "tests.apps.drain_app:app", "--output", "{file}/doc.yaml"],
    ["configs", "--copy", "{file}/configs"],
], ids=["asyncapi --output", "configs --copy"])
def test_a_path_that_cannot_be_written_is_one_line_naming_its_option(
    tmp_path: Path, args: list[str]
) -> None:
    # A path under a regular file: not writable by anyone, root included.
    file = tmp_path / "a-file"
    file.write_text("")
    result = conveyor(*[a.replace("{file}", str(file)) for a in args])
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()  # no traceback
    assert line.startswith("conveyor: error: ") and args[-2] in line, line
    assert f"{file}/" in line and "Not a directory" in line, line


def test_console_reports_an_address_it_cannot_listen_on_before_its_banner() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = conveyor("console", "--config", "configs/redis.toml", "--port", port)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""  # no "conveyor console on http://..." for a server not there
    [line] = result.stderr.splitlines()
    assert line.startswith("conveyor: error: --host/--port: ") and f":{port}:" in line, line
    assert "choose another --port" in line, line
    result = conveyor("console", "--config", "configs/redis.toml", "--host", "999.1.1.1")
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("conveyor: error: --host 999.1.1.1: "), line


def test_console_on_port_0_prints_the_port_it_listens_on() -> None:
    # Its poll loop reads the broker: a Redis of nobody's, not the config's 6379.
    env = {**os.environ, "CONVEYOR_REDIS__URL": f"redis://127.0.0.1:{free_port()}/0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "console", "--config", "configs/redis.toml",
         "--port", "0"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    match = re.match(r"conveyor console on http://127\.0\.0\.1:(\d+)/ ", banner)
    assert match and int(match[1]) > 0, banner


def test_console_on_every_interface_warns_in_the_clis_one_style() -> None:
    env = {**os.environ, "CONVEYOR_REDIS__URL": f"redis://127.0.0.1:{free_port()}/0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "console", "--config", "configs/redis.toml",
         "--host", "0.0.0.0", "--port", "0"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        warning = proc.stderr.readline()
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert warning == ("conveyor: warning: bound to 0.0.0.0: anyone who can reach it sees "
                       "your queues and dead letters' bodies\n")
    assert out.startswith("conveyor console on http://0.0.0.0:"), out


@pytest.mark.parametrize(("args", "names", "says"), USER_MISTAKES,
                         ids=[" ".join(a[:2]) for a, _, _ in USER_MISTAKES])
def test_each_listed_user_mistake_gets_one_line_naming_it_and_exit_2(
    args: list[str], names: str, says: str
) -> None:
    result = conveyor(*args)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    [line] = result.stderr.splitlines()  # no usage block, no traceback: one line
    assert line.startswith("conveyor: error: "), line
    assert names in line and says in line, line


def test_publish_refuses_a_body_that_is_not_json_before_connecting() -> None:
    # Was stored, then dead-lettered by its worker; a URL where nothing listens shows
    # that the refusal comes before any connection (none is tried, nothing is stored).
    nowhere = {"CONVEYOR_REDIS__URL": f"redis://127.0.0.1:{free_port()}/0"}
    result = conveyor("publish", "orders", "k1", "not json", "--config",
                      "configs/redis.toml", env=nowhere, timeout=30)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("conveyor: error: Invalid value for BODY: 'not json' is not "
                           "JSON ("), line
    assert "add --content-type text/plain" in line, line


def test_version_prints_the_installed_version() -> None:
    import conveyor as package

    result = conveyor("--version")
    assert result.returncode == 0
    assert result.stdout == f"conveyor {package.__version__}\n"


BAD_FILES = {
    "membership.toml": '[balancer]\nmembership = "nope"\n',
    "custom_slots.toml": '[slots]\nkind = "custom"\npath = "no_such_pkg.slots:Factory"\n',
    "slots_not_a_table.toml": "slots = 3\n",
    "cells_typo.toml": '[cells]\nsizes = { "no-such-handler/gold" = 4 }\n',
    "queues_not_a_table.toml": 'queues = "x"\n',
    "redis_memory.toml": '[queues]\nadapter = "redis"\n',
    "syntax_app.py": "import conveyor\napp = conveyor.App('x')\ndef broken(:\n",
    "raising_app.py": "import conveyor\napp = conveyor.App('x')\nraise RuntimeError('no db')\n",
    "redis_url.toml": '[queues]\nadapter = "redis"\n[redis]\nurl = "htp://x"\n'
                      '[balancer]\nmembership = "redis"\n',
}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["demo", "--config", "{membership.toml}"], "$.balancer.membership"),
        (["demo", "--config", "{custom_slots.toml}"], "$.slots.path: cannot load"),
        (["demo", "--config", "{queues_not_a_table.toml}"], "$.queues"),
        (["demo", "--config", "configs/redis.toml"], 'queues.adapter must be "memory"'),
        (["worker", "tests.apps.drain_app:app", "--config", "{custom_slots.toml}"],
         "$.slots.path: cannot load"),
        (["worker", "tests.apps.drain_app:app", "--config", "{cells_typo.toml}"],
         "$.cells.sizes: 'no-such-handler/gold' names handler 'no-such-handler', which "
         "has no cells"),
        (["worker", "tests.apps.drain_app:app", "--config", "{slots_not_a_table.toml}",
          "--slots", "4"], "$.slots: expected a table"),
        (["worker", "tests.apps.drain_app:app", "--config", "{redis_memory.toml}"],
         '$.balancer.membership: the redis adapter with the dynamic balancer needs '
         'membership = "redis"'),
        (["worker", "{syntax_app.py}:app"], "SyntaxError"),
        (["worker", "{raising_app.py}:app"], "raising_app.py:3: RuntimeError: no db"),
        # Checked when the config loads, like every other field, so the file is named.
        (["status", "--config", "{redis_url.toml}"],
         "redis_url.toml: $.redis.url: expected redis:// or rediss://, got htp://x"),
    ],
)
def test_bad_config_or_app_file_gets_a_clear_error_not_a_traceback(
    tmp_path: Path, args: list[str], message: str
) -> None:
    for name, text in BAD_FILES.items():
        (tmp_path / name).write_text(text)
        args = [a.replace(f"{{{name}}}", str(tmp_path / name)) for a in args]
    result = conveyor(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_demo_prints_a_computed_summary() -> None:
    result = conveyor("demo", "--messages", "3000", "--streams", "30", "--poison", "3")
    assert result.returncode == 0, result.stderr
    # Its output is the summary line alone (the progress bar is a terminal's, on stderr).
    assert re.fullmatch(
        r"published=3000 handled=2997 dead_lettered=3 duplicates=0 lost=0 elapsed_s=[\d.]+\n",
        result.stdout,
    ), result.stdout
    # The README: one warning names the first dead letter; the others are only counted.
    warnings = [x for x in result.stderr.splitlines() if " WARNING " in x]
    assert len(warnings) == 1 and "dead-lettering message" in warnings[0], result.stderr



def test_the_readmes_demo_runs_end_as_the_readme_shows() -> None:
    """The README's `make demo` summary, and its poison run as it prints the command: the
    summary counts what it says and one warning comes above it."""
    readme = re.sub(r"\s+", " ", (ROOT / "README.md").read_text())
    shown = re.search(r"``` (published=\S+ handled=.*?elapsed_s=)[\d.]+ ```", readme)
    assert shown is not None
    result = conveyor("demo")
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(re.escape(shown[1]) + r"[\d.]+\n", result.stdout), result.stdout

    command = re.search(r"Try `\.venv/bin/conveyor (demo [^`]+)`", readme)
    counts = re.search(r"the summary counts `([^`]+)`", readme)
    assert command is not None and counts is not None
    result = conveyor(*shlex.split(command[1]))
    assert result.returncode == 0, result.stderr
    assert f" {counts[1]} " in result.stdout, result.stdout
    warnings = [x for x in result.stderr.splitlines() if " WARNING " in x]
    assert len(warnings) == 1 and "dead-lettering message" in warnings[0], result.stderr

def test_bench_throughput_prints_comparable_json() -> None:
    result = conveyor("bench", "throughput", "--json", "--messages", "3000", "--repeats", "1")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    for key in ("msgs_per_s", "cpu_us_per_msg", "floor_msgs_per_s", "ratio",
                "publish_msgs_per_s", "publish_floor_msgs_per_s", "publish_ratio"):
        assert data[key] > 0
    assert data["ratio"] == pytest.approx(data["msgs_per_s"] / data["floor_msgs_per_s"])
    assert data["publish_ratio"] == pytest.approx(
        data["publish_msgs_per_s"] / data["publish_floor_msgs_per_s"])
    assert (data["variant"], data["config"]) == ("shipped", "configs/local.toml")


def test_bench_telemetry_prints_comparable_json() -> None:
    # Exported over OTLP/HTTP to an endpoint in another process, through a batch queue
    # made large enough (the standard variable) that a slow machine cannot overflow it.
    result = conveyor("bench", "telemetry", "--json", "--messages", "2000", "--repeats", "1",
                      env={"OTEL_BSP_MAX_QUEUE_SIZE": "8192"})
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    # A producer span (Client.publish) and a consumer span per message, all sampled,
    # all received.
    assert data["spans_exported"] == 2 * 2000 and data["spans_lost"] == 0
    assert data["off_over_uninstrumented"] == pytest.approx(
        data["off_msgs_per_s"] / data["uninstrumented_msgs_per_s"])
    assert data["ratio"] == pytest.approx(data["on_msgs_per_s"] / data["off_msgs_per_s"])
    for key in ("msgs_per_s", "cpu_us_per_msg", "floor_msgs_per_s", "ratio"):
        assert data[key] > 0


def test_bench_scale_down_prints_the_reference_shape_as_json() -> None:
    result = conveyor("bench", "scale-down", "--json", "--load-s", "0.5", "--cycles", "10",
                      "--cycle-s", "0.15", "--inspection-period-ms", "50")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(data) == {"monotonic", "adaptive"}
    for pool in data.values():
        assert len(pool["cycles"]) == 10
        assert all(set(c) == {"active", "average", "maximum"} for c in pool["cycles"])
    mono, adaptive = data["monotonic"]["cycles"], data["adaptive"]["cycles"]
    peak = mono[0]["maximum"]
    assert peak >= 5 and all(c["active"] == peak for c in mono), "monotonic stays at its peak"
    assert adaptive[-1]["active"] == 0, "adaptive falls to 0 by the last cycle"
    actives = [c["active"] for c in adaptive]
    assert actives == sorted(actives, reverse=True)


def test_processes_option_is_checked_before_anything_starts() -> None:
    result = conveyor("worker", "tests.apps.drain_app:app", "--processes", "3:1")
    assert result.returncode == 2 and "--processes" in result.stderr
    result = conveyor("worker", "tests.apps.drain_app:app", "--processes", "1:2")
    assert result.returncode == 2  # like any bad config
    assert result.stderr.startswith("conveyor: error: config: ")
    assert "memory adapter" in result.stderr
    assert "Traceback" not in result.stderr


def test_bench_throughput_table_fits_80_columns_with_its_ranges() -> None:
    result = conveyor("bench", "throughput", "--messages", "3000", "--repeats", "2",
                      env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line for line in lines if len(line) > 80] == []
    # Each figure's median on its row, the range of the two runs under it.
    [conveyor_row] = [line for line in lines if line.startswith("  conveyor ")]
    assert len(conveyor_row.split()) == 4, conveyor_row  # label, msgs/s, CPU, start-up
    assert any(line.startswith("    min..max ") for line in lines), result.stdout


def broker_config(tmp_path: Path, adapter: str, port: int) -> Path:
    config = tmp_path / f"{adapter}.toml"
    config.write_text(
        f'[queues]\nadapter = "redis"\n[redis]\nurl = "redis://127.0.0.1:{port}/0"\n'
        '[balancer]\nmembership = "redis"\n' if adapter == "redis" else
        f'[queues]\nadapter = "kafka"\n[kafka]\nbootstrap = "127.0.0.1:{port}"\n'
        '[balancer]\nkind = "kafka-group"\n')
    return config


@pytest.mark.parametrize("adapter", ["redis", "kafka"])
@pytest.mark.parametrize("command", [["publish", "orders", "k1", "{}"], ["status"],
                                     ["dlq", "list", "--app", "shop"]],
                         ids=lambda c: " ".join(c[:2]))
def test_ctrl_c_ends_a_command_waiting_for_its_broker_in_one_line_with_exit_130(
    tmp_path: Path, adapter: str, command: list[str]
) -> None:
    # A "broker" that accepts connections and never answers: the command waits on it.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent.settimeout(30)
        config = broker_config(tmp_path, adapter, silent.getsockname()[1])
        proc = subprocess.Popen([sys.executable, "-m", "conveyor.cli", *command, "--config",
                                 str(config)], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        with reaped(proc):
            connection, _ = silent.accept()  # the command is now waiting for an answer
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=30)
            connection.close()
    assert (proc.returncode, stderr) == (130, "conveyor: interrupted\n")


HOLDS_THE_LOOP = """
import sys, time
import click
from conveyor.cli.common import TaskGroup, run_command

@click.group(cls=TaskGroup)
def group() -> None:
    "The group."

@group.command()
def build() -> None:
    "Works for a minute without yielding to the loop."
    async def work() -> None:
        print("building", file=sys.stderr, flush=True)
        deadline, turns = time.monotonic() + 60, 0
        while time.monotonic() < deadline:
            turns += 1
    run_command(work())

group.add_command(build, section="run")
group(["build"])
"""


def test_a_second_ctrl_c_ends_a_command_whose_code_holds_the_loop(tmp_path: Path) -> None:
    # run_command's SIGINT handler ran on the event loop, which runs nothing while a
    # command's synchronous step holds it: no Ctrl-C, first or later, was heard.
    proc = subprocess.Popen([sys.executable, "-c", HOLDS_THE_LOOP], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with reaped(proc):
        assert proc.stderr is not None
        assert proc.stderr.readline() == "building\n"

        def ctrl_c_ended_it() -> bool:
            proc.send_signal(signal.SIGINT)  # as a user does, again, until it ends
            try:
                proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                return False
            return True

        wait_until_sync(ctrl_c_ended_it, 20, "Ctrl-C to end the command")
        stderr = proc.stderr.read()
    assert (proc.returncode, stderr) == (130, "conveyor: interrupted\n")


def test_one_ctrl_c_ends_a_throughput_benchmark_whose_timed_loops_hold_the_loop() -> None:
    # Its timed loops never yield to the event loop, where asyncio.run's first Ctrl-C
    # only cancels the run at its next await: minutes later, so a second was needed.
    import psutil

    proc = subprocess.Popen([sys.executable, "-m", "conveyor.cli", "bench", "throughput",
                             "-n", "1000000", "--repeats", "100"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with reaped(proc):
        process = psutil.Process(proc.pid)
        # Imports take about a second of CPU; past three it is in the benchmark's work.
        wait_until_sync(lambda: process.cpu_times().user > 3, 60, "the benchmark under way")
        proc.send_signal(signal.SIGINT)  # once
        stdout, stderr = proc.communicate(timeout=10)
    assert (proc.returncode, stdout, stderr) == (130, "", "conveyor: interrupted\n")


def sigint_held(pid: int) -> bool:
    """Whether process ``pid`` holds SIGINT back (its blocked-signals mask, in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:  # exited
        return False
    [mask] = [line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")]
    return bool(int(mask, 16) & (1 << (signal.SIGINT - 1)))


def test_ctrl_c_while_the_command_loads_is_one_line_with_exit_130(tmp_path: Path) -> None:
    """The installed `conveyor` script holds SIGINT while its modules load (about half a
    second): a Ctrl-C then is raised once they have, where the command's own handling
    ends it. Before, it was a traceback from inside an import, and exit -2."""
    script = Path(sys.executable).with_name("conveyor")
    assert script.exists(), "the package's `conveyor` script is not installed"
    # The command then waits on a broker that never answers: on a loaded machine the
    # signal, sent just after SIGINT was seen held, may land once the modules are loaded
    # (a command failing at once, as on a missing config, had exited 2 by then).
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        config = broker_config(tmp_path, "redis", silent.getsockname()[1])
        proc = subprocess.Popen([script, "status", "--config", str(config)],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        with reaped(proc):
            wait_until_sync(lambda: sigint_held(proc.pid), 10,
                            "the command to hold SIGINT while it loads")
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=30)
    assert (proc.returncode, stderr) == (130, "conveyor: interrupted\n")


def test_python_m_conveyor_holds_ctrl_c_while_the_command_loads_too(tmp_path: Path) -> None:
    """`python -m conveyor` (where the script is not on the PATH) loads the command's
    modules under the same hold: it started them with SIGINT open, so a Ctrl-C then was
    a traceback from inside an import."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        config = broker_config(tmp_path, "redis", silent.getsockname()[1])
        proc = subprocess.Popen([sys.executable, "-m", "conveyor", "status", "--config",
                                 str(config)], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        with reaped(proc):
            wait_until_sync(lambda: sigint_held(proc.pid), 10,
                            "the command to hold SIGINT while it loads")
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=30)
    assert (proc.returncode, stderr) == (130, "conveyor: interrupted\n")


@pytest.mark.parametrize("command", [["publish", "orders", "k1", "{}"], ["status"]],
                         ids=lambda c: c[0])
def test_a_kafka_broker_that_is_down_is_one_line_naming_the_bootstrap_address(
    tmp_path: Path, command: list[str]
) -> None:
    with socket.socket() as closed:  # a free port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    result = conveyor(*command, "--config", str(broker_config(tmp_path, "kafka", port)))
    assert result.returncode == 1, result.stderr
    [line] = result.stderr.splitlines()  # not aiokafka's own "Unable connect" line too
    assert re.fullmatch(rf"conveyor: error: kafka: [a-z ]+ failed: no broker reachable at "
                        rf"127\.0\.0\.1:{port} \(\$\.kafka\.bootstrap\)", line), line


def test_a_redis_that_is_down_costs_one_retrying_note_and_the_error(tmp_path: Path) -> None:
    """A one-shot command retries a call for [redis] retry_max_s (a Redis restarting
    should not fail a publish), says so once, and fails in one line; the outage's
    "still waiting" repeats (every 5 s) are a worker's, not a one-shot command's."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    result = conveyor("publish", "orders", "k1", "{}", "--config",
                      str(broker_config(tmp_path, "redis", port)),
                      env={"CONVEYOR_REDIS__RETRY_MAX_S": "6"})
    assert result.returncode == 1, result.stderr
    note, error = result.stderr.splitlines()
    assert note.endswith("retrying with back-off for up to 6s a call ([redis] retry_max_s)")
    assert f"redis at redis://127.0.0.1:{port}/0 unreachable while " in note, note
    assert error.startswith("conveyor: error: redis unreachable while "), error


def worker_of(tmp_path: Path, module: str, source: str) -> subprocess.CompletedProcess[str]:
    """``conveyor worker MODULE:app`` (on the embedded adapter) of an app whose module
    holds ``source``, run in ``tmp_path`` (at most 60 s)."""
    (tmp_path / f"{module}.py").write_text(source)
    return subprocess.run([sys.executable, "-m", "conveyor.cli", "worker", f"{module}:app"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_worker_whose_interceptor_wraps_in_nothing_is_a_usage_error(tmp_path: Path) -> None:
    # An interceptor's wrap that forgot its `return`: the worker refuses to start (exit 2,
    # one line) instead of dead-lettering every message with "'NoneType' object is not
    # callable".
    result = worker_of(tmp_path, "forgetful", (
        "from conveyor import App, Interceptor\n"
        "class Forgetful(Interceptor):\n"
        "    def wrap(self, handler, next):\n"
        "        async def audited(delivery):\n"
        "            return await next(delivery)\n"
        "app = App('fg', interceptors=[Forgetful()])\n"
        "@app.handler('jobs')\n"
        "async def job(body: dict) -> None:\n"
        "    \"\"\"Never called: the worker refuses to start.\"\"\"\n"))
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        "conveyor: error: Forgetful.wrap returned None for handler 'forgetful.job': it must "
        "return a step (an async callable) or `next`\n")


def test_a_worker_whose_handler_retries_past_the_bound_is_a_usage_error(
        tmp_path: Path) -> None:
    # retry_attempts=10**18 was taken: a failing message held its stream for good.
    result = worker_of(tmp_path, "eager", (
        "from conveyor import App\n"
        "app = App('eager')\n"
        "@app.handler('jobs', retry_attempts=10**18)\n"
        "async def job(body: dict) -> None:\n"
        "    raise ValueError(body)\n"))
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("conveyor: error: Invalid value for APP_PATH: "), line
    assert ("eager.py:3: HandlerDeclarationError: handler for 'jobs': retry_attempts must "
            "be an int from 1 to 2147483647 (what the wire's cv-attempt and a delivery count "
            "hold), got 1000000000000000000") in line, line


def run_quitter(tmp_path: Path, handler: str, timeout_s: float = 60) -> tuple[int, str]:
    """``conveyor worker`` of an app whose startup publishes one job to ``handler``
    (its decorator and definition); its exit status and its one ERROR line."""
    (tmp_path / "quitter.py").write_text(
        "import conveyor\n"
        "app = conveyor.App('quitter')\n"
        f"{handler}\n"
        "@app.startup\n"
        "async def first(client: conveyor.Client) -> None:\n"
        "    await client.publish('jobs', 'j-1', {'n': 1})\n")
    result = subprocess.run([sys.executable, "-m", "conveyor.cli", "--log-level", "warning",
                             "worker", "quitter:app"],
                            cwd=tmp_path, capture_output=True, text=True,
                            timeout=timeout_s, env={**os.environ, "PYTHONPATH": str(ROOT)})
    errors = [line for line in result.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1, result.stderr
    return result.returncode, errors[0]


@pytest.mark.parametrize(("raised", "status"), [("SystemExit()", 1), ("SystemExit(3)", 3)])
def test_a_handler_that_raises_system_exit_stops_the_worker_saying_so(
    tmp_path: Path, raised: str, status: int,
) -> None:
    # It ended the process at once without a word, with status 0 for sys.exit(): a crash
    # that looked like a clean stop to a supervisor.
    code, said = run_quitter(tmp_path, "@app.handler('jobs')\n"
                                       "async def job(body: dict) -> None:\n"
                                       f"    raise {raised}")
    assert code == status, said
    assert re.search(
        rf"handler quitter.job raised {re.escape(raised)} on message \w+ of jobs/j-1: the "
        "worker stops at once, without draining; the message comes back as a redelivered "
        r"one \(see max_deliveries\)$", said), said


@pytest.mark.parametrize(("raised", "status"), [("KeyboardInterrupt", 130),
                                                 ("SystemExit(3)", 3)])
def test_a_handler_that_stops_the_worker_beside_a_thread_of_the_app_still_exits(
    tmp_path: Path, raised: str, status: int,
) -> None:
    # A thread the app started (not a daemon thread) held the exit after a
    # KeyboardInterrupt for good: `conveyor: interrupted` was said, the process stayed.
    code, said = run_quitter(tmp_path, "import threading\n"
                                       "@app.handler('jobs')\n"
                                       "async def job(body: dict) -> None:\n"
                                       "    threading.Thread(target=threading.Event().wait)"
                                       ".start()\n"
                                       f"    raise {raised}", timeout_s=20)
    assert code == status, said
    assert f"handler quitter.job raised {raised}" in said, said


def test_a_batch_handler_that_raises_system_exit_stops_the_worker_saying_so(
    tmp_path: Path,
) -> None:
    code, said = run_quitter(tmp_path, "@app.handler('jobs', batch_size=10, batch_wait_ms=10)\n"
                                       "async def jobs(bodies: list[dict]) -> None:\n"
                                       "    raise SystemExit(4)")
    assert code == 4, said
    assert re.search(
        r"batch handler quitter.jobs raised SystemExit\(4\) on a batch of 1 message\(s\) "
        r"from \w+ on: the worker stops at once, without draining; the messages come back "
        r"as redelivered ones \(see max_deliveries\)$", said), said


def warning_worker(tmp_path: Path, app: str) -> Daemon:
    """``conveyor --log-level warning worker APP`` in ``tmp_path``, its output read."""
    return Daemon(subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "--log-level", "warning", "worker", app],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))


def test_a_startup_hook_that_raises_is_logged_when_it_raises(tmp_path: Path) -> None:
    # Nothing was said, then or at the stop: a tour's Kafka worker whose hook's publish
    # failed ran on without its first order, and no line told why.
    (tmp_path / "hooked.py").write_text(
        "import conveyor\n"
        "app = conveyor.App('hooked')\n"
        "@app.handler('jobs')\n"
        "async def job(body: bytes) -> None: ...\n"
        "@app.startup\n"
        "async def connect(client: conveyor.Client) -> None:\n"
        "    raise ConnectionError('the database is down')\n")
    worker = warning_worker(tmp_path, "hooked:app")
    try:
        said = "ERROR conveyor.daemon: startup hook connect raised ConnectionError: " \
               "the database is down"
        wait_until_sync(lambda: any(said in x for x in worker.lines)
                        or worker.proc.poll() is not None, 30, "the hook's failure logged")
        lines = worker.interrupt()  # the worker runs on, and drains as ever
    finally:
        worker.kill()
    assert [x for x in lines if said in x] == [next(x for x in lines if "ERROR" in x)]
    assert "    raise ConnectionError('the database is down')" in lines
    assert lines[-1].startswith("conveyor: drained pulled=0 "), lines


def test_a_handler_that_stops_the_event_loop_does_not_end_the_worker(tmp_path: Path) -> None:
    # loop.stop() in a handler (a script's habit) ended `conveyor worker` with a 40-line
    # "RuntimeError: Event loop stopped before Future completed." and exit 1, undrained.
    (tmp_path / "stopper.py").write_text(
        "import asyncio\n"
        "import conveyor\n"
        "app = conveyor.App('stopper')\n"
        "@app.handler('jobs')\n"
        "async def job(body: dict) -> None:\n"
        "    if body['n'] < 2:\n"
        "        asyncio.get_running_loop().stop()\n"
        "    print('handled', body['n'], flush=True)\n"
        "@app.startup\n"
        "async def first(client: conveyor.Client) -> None:\n"
        "    for n in range(4):\n"
        "        await client.publish('jobs', f'j-{n}', {'n': n})\n")
    worker = warning_worker(tmp_path, "stopper:app")
    try:
        wait_until_sync(lambda: sum(x.startswith("handled ") for x in worker.lines) == 4
                        or worker.proc.poll() is not None, 30, "the four jobs handled")
        lines = worker.interrupt()
    finally:
        worker.kill()
    assert sorted(x for x in lines if x.startswith("handled ")) == [
        f"handled {n}" for n in range(4)], lines
    assert "Traceback (most recent call last):" not in lines, lines
    [warning] = [x for x in lines if "WARNING" in x]
    assert warning.endswith("a handler or hook stopped the event loop (loop.stop()): the "
                            "worker runs it again and goes on; stop a worker with SIGTERM "
                            "or sys.exit()"), warning
    assert lines[-1].startswith("conveyor: drained pulled=4 acked=4 handled=4 "), lines
    assert worker.proc.returncode == 0


def publishing(count: int, key: str = "'j'") -> str:
    """An app's startup hook, as source: it publishes ``{'n': 0..count-1}`` to ``jobs``,
    each under the stream key the expression ``key`` makes."""
    return ("@app.startup\n"
            "async def first(client: conveyor.Client) -> None:\n"
            f"    for n in range({count}):\n"
            f"        await client.publish('jobs', {key}, {{'n': n}})\n")


@pytest.mark.parametrize("unplug", ["sys.stderr.close()", "sys.stderr = None",
                                    "sys.stdout.close()", "sys.stdout = None"])
def test_a_handler_that_closes_or_drops_stderr_or_stdout_leaves_the_worker_its_log(
    tmp_path: Path, unplug: str,
) -> None:
    # sys.stderr.close() in a handler ended `conveyor worker` with status 1 at its next
    # line of its own ("ready", a log line: ValueError: I/O operation on closed file),
    # undrained, and its last words, "lost sys.stderr", said nothing of why; the
    # handler's own log call raised. With a thread of the app's left running, the
    # closed or dropped sys.stdout failed the exit too, which then waited for good.
    out = tmp_path / "handled.txt"
    (tmp_path / "unplugger.py").write_text(
        "import logging, sys, threading\n"
        "import conveyor\n"
        "app = conveyor.App('unplugger')\n"
        "@app.handler('jobs')\n"
        "async def job(body: dict) -> None:\n"
        "    if body['n'] == 0:\n"
        f"        {unplug}\n"
        "        threading.Thread(target=threading.Event().wait, name='waiter').start()\n"
        "    logging.getLogger('unplugger').warning('logged %d', body['n'])\n"
        f"    with open({str(out)!r}, 'a') as handled:\n"
        "        handled.write(f\"{body['n']}\\n\")\n"
        + publishing(4))
    worker = warning_worker(tmp_path, "unplugger:app")
    try:
        wait_until_sync(lambda: len(lines(out)) == 4 or worker.proc.poll() is not None, 30,
                        "the four jobs handled")
        said = worker.interrupt()  # exit 0, drained
    finally:
        worker.kill()
    assert lines(out) == ["0", "1", "2", "3"], said  # each once, none lost
    assert [x.split(": ", 1)[1] for x in said if "WARNING unplugger" in x] == [
        f"logged {n}" for n in range(4)], said  # its log goes on where it went
    assert "Traceback (most recent call last):" not in said, said
    assert said[-2].startswith("conveyor: drained pulled=4 acked=4 handled=4 "), said
    assert "exiting without waiting for 1 thread(s) still running after the stop: waiter" \
        in said[-1], said


@pytest.mark.parametrize(("holds", "named"), [
    ("multiprocessing.get_context('spawn').Process(target=nap, name='napper').start()",
     "the atexit function multiprocessing.util._exit_function"),
    ("atexit.register(time.sleep, 60)", "an atexit function"),  # no Python frame to name
    ("atexit.register(hang)", "the atexit function holder.hang")],
    ids=["a-process", "an-atexit-hook", "a-hook-of-python-code"])
def test_an_atexit_function_that_does_not_return_does_not_hold_the_exit(
    tmp_path: Path, holds: str, named: str,
) -> None:
    # A process a handler started and left running (not a daemon process: the
    # multiprocessing default), or a hook it registered with atexit, held the exit for
    # good after the drain: Python's exit waits for them, and `conveyor worker` said
    # `drained` and stayed (multiprocessing joins its children at exit).
    pid = tmp_path / "pid.txt"
    (tmp_path / "holder.py").write_text(
        "import atexit, multiprocessing, os, threading, time\n"
        "import conveyor\n"
        "app = conveyor.App('holder')\n"
        "def nap() -> None:\n"
        f"    with open({str(pid)!r}, 'a') as file:\n"
        "        file.write(f'{os.getpid()}\\n')\n"
        "    os.close(1), os.close(2)  # the test's pipe is the worker's, not the nap's\n"
        "    time.sleep(60)\n"
        "def hang() -> None:\n"
        "    threading.Event().wait()\n"
        "@app.handler('jobs')\n"
        "async def job(body: dict) -> None:\n"
        f"    {holds}\n"
        "    print('handled', body['n'], flush=True)\n"
        "@app.startup\n"
        "async def first(client: conveyor.Client) -> None:\n"
        "    await client.publish('jobs', 'j', {'n': 1})\n")
    worker = warning_worker(tmp_path, "holder:app")
    try:
        worker.wait_for(1, "the job handled")
        if "Process" in holds:
            wait_until_sync(lambda: len(lines(pid)) == 1, 30, "the process started")
        started = time.monotonic()
        worker.proc.send_signal(signal.SIGINT)
        status = worker.proc.wait(30)
        took = time.monotonic() - started
    finally:
        worker.kill()
        for napper in lines(pid):  # its multiprocessing resource tracker holds our pipe
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(napper), signal.SIGKILL)
    worker._reader.join(10)
    said = worker.lines
    assert status == 0, said
    assert took < 5, said  # the drain, 1 s for the atexit functions, the exit
    assert said[-2].startswith("conveyor: drained pulled=1 acked=1 handled=1 "), said
    assert said[-1].endswith(
        f"exiting without waiting for {named}, still running 1.0s "
        "after the stop (a process the app started that is not a daemon process, or a "
        "hook of the app's)"), said


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_hook_that_adds_a_loop_signal_handler_does_not_take_the_workers_stop(
    tmp_path: Path, sig: signal.Signals,
) -> None:
    # loop.add_signal_handler(SIGTERM, cleanup) in a startup hook (asyncio's idiom for
    # a cleanup) replaced the worker's own: SIGTERM ran the cleanup and nothing else, the
    # worker never drained and stayed until a SIGKILL.
    (tmp_path / "cleaner.py").write_text(
        "import asyncio, signal\n"
        "import conveyor\n"
        "app = conveyor.App('cleaner')\n"
        "@app.handler('jobs')\n"
        "async def job(body: dict) -> None:\n"
        "    print('handled', body['n'], flush=True)\n"
        "@app.startup\n"
        "async def first(client: conveyor.Client) -> None:\n"
        "    loop = asyncio.get_running_loop()\n"
        f"    loop.add_signal_handler(signal.{sig.name}, print, 'cleaned up', 1)\n"
        f"    loop.add_signal_handler(signal.{sig.name}, print, 'cleaned up', 2)\n"
        "    for n in range(4):\n"
        "        await client.publish('jobs', 'j', {'n': n})\n")
    worker = warning_worker(tmp_path, "cleaner:app")
    try:
        worker.wait_for(4, "the four jobs handled")
        worker.proc.send_signal(sig)
        status = worker.proc.wait(15)
    finally:
        worker.kill()
    worker._reader.join(10)
    said = worker.lines
    assert status == 0, said
    assert sorted(x for x in said if x.startswith("handled ")) == [
        f"handled {n}" for n in range(4)], said
    assert [x for x in said if x.startswith("cleaned up")] == ["cleaned up 2"], said
    assert said[-1].startswith("conveyor: drained pulled=4 acked=4 handled=4 "), said


@pytest.mark.parametrize(("installs", "then"), [
    ("signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))", "pass  # the test's SIGTERM"),
    ("signal.signal(signal.SIGALRM, time_out)", "signal.setitimer(signal.ITIMER_REAL, 0.2)"),
], ids=["sys.exit-on-SIGTERM", "a-timeout-on-SIGALRM"])
def test_a_signal_handler_of_the_app_that_raises_does_not_end_the_worker_undrained(
    tmp_path: Path, installs: str, then: str,
) -> None:
    # A Python signal handler runs wherever the main thread is: mostly in the event
    # loop's wait. One that raised there (sys.exit() on SIGTERM, a SIGALRM timeout left
    # armed) ended `conveyor worker` undrained, with status 1 and no word (sys.exit) or
    # a 50-line traceback.
    (tmp_path / "alarmed.py").write_text(
        "import asyncio, os, signal, sys\n"
        "import conveyor\n"
        "app = conveyor.App('alarmed')\n"
        "class Timeout(Exception): ...\n"
        "def time_out(*_: object) -> None:\n"
        "    raise Timeout('took too long')\n"
        "@app.handler('jobs')\n"
        "async def job(body: dict) -> None:\n"
        "    if body['n'] == 0:\n"
        f"        {installs}\n"
        "    print('handled', body['n'], flush=True)\n"
        "    if body['n'] == 3:\n"
        "        await asyncio.sleep(0.5)  # the loop waits meanwhile\n"
        f"        {then}\n"
        "        await asyncio.sleep(0.5)\n"
        + publishing(4))
    worker = warning_worker(tmp_path, "alarmed:app")
    try:
        if "SIGTERM" in installs:  # sent while the last call sleeps: the loop waits
            worker.wait_for(4, "the four jobs handled")
            worker.proc.send_signal(signal.SIGTERM)
        wait_until_sync(lambda: any("ERROR" in x for x in worker.lines)
                        or worker.proc.poll() is not None, 30, "the signal handler to raise")
        if "SIGTERM" in installs:  # the worker's own drain follows
            worker.proc.wait(15)
        else:
            worker.interrupt()
    finally:
        worker.kill()
    worker._reader.join(10)
    said = worker.lines
    assert worker.proc.returncode == 0, said
    assert sorted(x for x in said if x.startswith("handled ")) == [
        f"handled {n}" for n in range(4)], said
    assert "Traceback (most recent call last):" not in said, said
    raised = "SystemExit(0)" if "SIGTERM" in installs else "Timeout('took too long')"
    [line] = [x for x in said if "ERROR" in x]
    assert line.endswith(f"the app's signal handler for {installs[21:28]} raised {raised} "
                         "in the event loop's wait: the worker goes on"), said
    assert said[-1].startswith("conveyor: drained pulled=4 acked=4 handled=4 "), said


@pytest.mark.parametrize("pool", [
    "concurrent.futures.ThreadPoolExecutor(2)",
    "concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context('spawn'))",
], ids=["threads", "processes"])
def test_an_idle_executor_of_the_app_ends_with_the_worker_unnamed(
    tmp_path: Path, pool: str,
) -> None:
    # A module-level executor (docs/sync-handlers.md advises a ProcessPoolExecutor for
    # work that holds the GIL), idle at the stop: its threads wait for work until Python's
    # exit tells them to end, so every stop waited 1 s, named them as calls that had not
    # returned, and left with os._exit.
    (tmp_path / "pooled.py").write_text(
        "import asyncio, concurrent.futures, multiprocessing\n"
        "import conveyor\n"
        "app = conveyor.App('pooled')\n"
        f"POOL = {pool}\n"
        "@app.handler('jobs')\n"
        "async def job(body: dict) -> None:\n"
        "    n = await asyncio.get_running_loop().run_in_executor(POOL, abs, -body['n'])\n"
        "    print('handled', n, flush=True)\n"
        + publishing(4, "f'j-{n}'"))
    worker = warning_worker(tmp_path, "pooled:app")
    try:
        worker.wait_for(4, "the four jobs handled")
        started = time.monotonic()
        said = worker.interrupt()  # exit 0
        took = time.monotonic() - started
    finally:
        worker.kill()
    assert sorted(x for x in said if x.startswith("handled ")) == [
        f"handled {n}" for n in range(4)], said
    assert said[-1].startswith("conveyor: drained pulled=4 acked=4 handled=4 "), said
    assert not [x for x in said if "WARNING" in x], said
    assert took < 1, said


def test_an_apps_dict_config_does_not_silence_the_workers_log(tmp_path: Path) -> None:
    # logging.config.dictConfig at the app's import (disable_existing_loggers is true by
    # default) disabled every conveyor.* logger: a dead letter, a crash, the stop went
    # unsaid, in the app's format or any other; only `ready` and `drained` were left.
    (tmp_path / "configured.py").write_text(
        "import logging.config\n"
        "import conveyor\n"
        "logging.config.dictConfig({'version': 1, 'root': {'level': 'WARNING', "
        "'handlers': ['h']}, 'handlers': {'h': {'class': 'logging.StreamHandler', "
        "'formatter': 'f', 'stream': 'ext://sys.stdout'}}, "
        "'formatters': {'f': {'format': 'APP %(levelname)s %(name)s: %(message)s'}}})\n"
        "app = conveyor.App('configured')\n"
        "@app.handler('jobs', retry_attempts=1)\n"
        "async def job(body: dict) -> None:\n"
        "    if body['n'] == 1:\n"
        "        raise ValueError('the poison')\n"
        "    print('handled', body['n'], flush=True)\n"
        + publishing(3))
    worker = warning_worker(tmp_path, "configured:app")
    try:
        worker.wait_for(2, "the two good jobs handled")
        said = worker.interrupt()
    finally:
        worker.kill()
    assert sorted(x for x in said if x.startswith("handled ")) == ["handled 0", "handled 2"]
    [letter] = [x for x in said if "dead-lettering" in x]
    assert letter.startswith("APP WARNING conveyor.dead_letters: dead-lettering message "), said
    assert letter.endswith("after 1 attempt(s): ValueError: the poison"), said
    assert said[-1].startswith("conveyor: drained pulled=3 acked=3 handled=2 "
                               "dead_lettered=1 "), said


def test_python_dash_m_conveyor_is_the_command() -> None:
    result = subprocess.run([sys.executable, "-m", "conveyor", "--version"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("conveyor"), result.stdout


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["demo", "--help"],
                                  ["configs", "local"], ["demo", "-n", "1"]])
def test_output_that_cannot_be_written_is_one_line_not_a_traceback(args: list[str]) -> None:
    # A full disk (here /dev/full) under `conveyor dlq list --json > letters.json`: the
    # first write of every command was an OSError traceback.
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "conveyor.cli", *args], cwd=ROOT,
                                stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (
        1, "conveyor: error: cannot write the output: No space left on device\n")
