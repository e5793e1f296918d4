"""Exit codes are the CLI's call, not the error tree's: a library error says what went
wrong; ``conveyor.cli.common`` decides which ones are the user's mistake (exit 2)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from conveyor.cli import main
from conveyor.cli.common import INTERRUPTED, USAGE_ERROR, TaskGroup, as_cli_error
from conveyor.platform.errors import (
    BrokerError,
    ConfigError,
    ConveyorError,
    ForwardRewindError,
    InvalidArgumentError,
    QueueOwnedError,
    UnknownGroupError,
)
from tests.conftest import free_port

NAMED_WRONG = [
    ForwardRewindError("that target is ahead of app 'shop''s position"),
    UnknownGroupError("app 'shpo' has no consumer group on queue(s) 0-3"),
]


@pytest.mark.parametrize("error", NAMED_WRONG, ids=lambda e: type(e).__name__)
def test_a_bad_rewind_target_or_app_name_is_a_bad_argument_not_a_bad_config(
    error: ConveyorError,
) -> None:
    assert isinstance(error, InvalidArgumentError) and isinstance(error, ValueError)
    assert not isinstance(error, ConfigError)


@pytest.mark.parametrize("error", NAMED_WRONG, ids=lambda e: type(e).__name__)
def test_the_cli_makes_them_usage_errors_with_their_own_message(error: ConveyorError) -> None:
    shown = as_cli_error(error)
    assert shown is not None
    assert shown.exit_code == USAGE_ERROR
    assert shown.format_message() == str(error)  # not "config: ...": it is no config


@pytest.mark.parametrize(("error", "code", "message"), [
    (ConfigError("$.slots.count: expected >= 1"), USAGE_ERROR, "config: $.slots.count: "
     "expected >= 1"),
    (InvalidArgumentError("a pool of no workers"), 1, "a pool of no workers"),
    (QueueOwnedError("queue 0 by d-1"), 1, "queue 0 by d-1"),
    (BrokerError("connection refused"), 1, "connection refused"),
])
def test_other_library_errors_keep_their_exit_status(error: ConveyorError, code: int,
                                                      message: str) -> None:
    shown = as_cli_error(error)
    assert shown is not None
    assert (shown.exit_code, shown.format_message()) == (code, message)


def invoke_raising(name: str, error: BaseException) -> Result:
    """Run a one-command group of the CLI's kind whose command ``name`` raises ``error``."""
    @click.group(cls=TaskGroup)
    def group() -> None:
        """The group: it only holds the command."""

    @click.command(name)
    def command() -> None:
        raise error

    group.add_command(command, section="run")
    return CliRunner().invoke(group, [name])


@pytest.mark.parametrize(("error", "code"), [
    (NAMED_WRONG[0], USAGE_ERROR), (NAMED_WRONG[1], USAGE_ERROR),
    (QueueOwnedError("queues of app 'shop' are still owned"), 1),
])
def test_an_error_escaping_a_command_is_one_line_with_the_clis_exit_status(
    error: ConveyorError, code: int,
) -> None:
    result = invoke_raising("rewind", error)
    assert result.exit_code == code
    assert result.stderr == f"conveyor: error: {error}\n"
    assert result.stdout == ""


def nowhere() -> dict[str, str]:
    """A Redis config's URL where nothing listens, given up on quickly: a publish that
    got past the CLI's own checks fails to connect (exit 1), and stores nothing."""
    return {"CONVEYOR_REDIS__URL": f"redis://127.0.0.1:{free_port()}/0",
            "CONVEYOR_REDIS__RETRY_MAX_S": "0.2", "CONVEYOR_REDIS__CONNECT_TIMEOUT_S": "0.1"}


@pytest.mark.parametrize(("body", "says"), [
    ("\udcff\udcfe", "is not UTF-8 text, so not JSON"),  # bytes from the shell, not UTF-8
    ("[" * 1000 + "]" * 1000, "is JSON nested too deeply to decode"),
])
def test_publish_refuses_a_body_no_handler_could_decode(body: str, says: str) -> None:
    args = ["publish", "orders", "k1", body, "--config", "configs/redis.toml"]
    result = CliRunner().invoke(main, args, env=nowhere())
    assert result.exit_code == USAGE_ERROR, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("conveyor: error: Invalid value for BODY: "), line
    assert says in line and "nothing was sent" in line, line


@pytest.mark.parametrize("body", ["not json", '{"id": 17', "NaN", "", "x" * 500])
def test_publish_refuses_a_body_that_is_not_json_as_a_usage_error(body: str) -> None:
    # Sent as it was, a worker dead-lettered it later: "cannot decode body".
    args = ["publish", "orders", "k1", body, "--config", "configs/redis.toml"]
    result = CliRunner().invoke(main, args, env=nowhere())
    assert result.exit_code == USAGE_ERROR, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("conveyor: error: Invalid value for BODY: "), line
    assert "is not JSON (" in line and "add --content-type text/plain" in line, line
    assert len(line) < 250, line  # a long BODY is cut short, not repeated whole
    result = CliRunner().invoke(main, [*args, "--content-type", "application/json"],
                                env=nowhere())
    assert result.exit_code == USAGE_ERROR and "BODY" in result.stderr, result.output


def test_publish_says_a_body_of_dash_is_not_standard_input() -> None:
    # `publish orders k1 - < body.json`, as many commands read stdin, was told to add
    # --content-type text/plain: the body `-` itself would have been sent.
    args = ["publish", "orders", "k1", "-", "--config", "configs/redis.toml"]
    result = CliRunner().invoke(main, args, env=nowhere(), input='{"id": 17}')
    assert result.exit_code == USAGE_ERROR, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("conveyor: error: Invalid value for BODY: '-' is not read from "
                           "standard input: give --body-file - for that; nothing was "
                           "sent"), line


def test_publish_sends_a_body_that_is_not_json_when_the_content_type_says_so() -> None:
    args = ["publish", "orders", "k1", "not json", "--config", "configs/redis.toml",
            "--content-type", "text/plain"]
    result = CliRunner().invoke(main, args, env=nowhere())
    assert result.exit_code == 1, result.output  # past the check: no server there
    assert "BODY" not in result.stderr


def test_ctrl_c_in_a_command_is_one_line_and_exit_130_not_clicks_aborted() -> None:
    result = invoke_raising("publish", KeyboardInterrupt())
    assert (result.exit_code, result.stderr, result.stdout) == (
        INTERRUPTED, "conveyor: interrupted\n", "")


@pytest.mark.parametrize("argv", [["worker", "--log-level", "warning", "shop:app"],
                                  ["dlq", "list", "--log-level", "debug"]])
def test_the_main_commands_option_after_a_subcommand_says_it_goes_before(
    argv: list[str],
) -> None:
    result = CliRunner().invoke(main, argv, prog_name="conveyor")
    under = " ".join(argv[: argv.index("--log-level")])
    assert (result.exit_code, result.stdout) == (USAGE_ERROR, "")
    assert result.stderr == (
        "conveyor: error: No such option '--log-level': --log-level is conveyor's own "
        f"option, so it goes before the command ('conveyor --log-level … {under} …')\n")


def test_an_unknown_option_of_a_subcommand_still_points_at_its_help() -> None:
    result = CliRunner().invoke(main, ["worker", "--confg", "x"], prog_name="conveyor")
    assert result.exit_code == USAGE_ERROR
    assert result.stderr == ("conveyor: error: No such option '--confg'. Did you mean "
                             "'--config'? (see 'conveyor worker --help')\n")


def float_options() -> list[tuple[str, click.Parameter]]:
    """(command path, option) of every float-valued option of every command."""
    from tests.unit.test_cli_help import ALL

    return [(ctx.command_path, param) for ctx, cmd in ALL for param in cmd.params
            if isinstance(param.type, click.types.FloatParamType)]


def test_the_commands_have_float_options_to_check() -> None:
    assert len(float_options()) >= 10  # the test below is not vacuous


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e300", "1e999"])
def test_every_float_option_refuses_a_value_no_duration_or_ratio_can_be(value: str) -> None:
    # click's FloatRange lets nan past any bound and has no ceiling by default:
    # `status --watch nan` reached time.sleep as a traceback, `demo --work-ms inf`
    # never ended.
    for path, param in float_options():
        with pytest.raises(click.BadParameter):
            param.type.convert(value, param, None)
            pytest.fail(f"{path} {param.opts[0]} took {value}")


@pytest.mark.parametrize("args", [
    ["status", "--config", "configs/redis.toml", "--app", "shop", "--watch", "nan"],
    ["status", "--config", "configs/redis.toml", "--app", "shop", "--watch", "1e300"],
    ["demo", "-n", "1", "--work-ms", "-inf"],
    ["bench", "telemetry", "--sample-ratio", "nan"],
    ["sim", "balancer", "--ramp", "1e300"],
])
def test_a_float_option_out_of_bounds_is_one_line_naming_it(args: list[str]) -> None:
    result = CliRunner().invoke(main, args, env=nowhere())
    assert result.exit_code == USAGE_ERROR, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(f"conveyor: error: Invalid value for '{args[-2]}': "), line


def path_options() -> list[tuple[str, click.Parameter]]:
    """(command path, option) of every option or argument that takes a path."""
    from tests.unit.test_cli_help import ALL

    return [(ctx.command_path, param) for ctx, cmd in ALL for param in cmd.params
            if isinstance(param.type, click.Path)]


def test_every_path_option_refuses_an_empty_path() -> None:
    # click reads '' as the current directory: `sim placement --plot ''` wrote ./.png,
    # `configs --copy "$DIR"` with DIR unset copied into the current directory.
    found = path_options()
    assert len(found) >= 10
    for path, param in found:
        with pytest.raises(click.BadParameter, match="an empty path names nothing"):
            param.type.convert("", param, None)
            pytest.fail(f"{path} {param.opts[0]} took ''")


@pytest.mark.parametrize("args", [
    ["sim", "placement", "--plot", ""],
    ["configs", "--copy", ""],
    ["deploy", "kubernetes", "--app", "tests.apps.drain_app:app", "--config",
     "{root}/configs/redis.toml", "--output", ""],
])
def test_an_empty_output_path_writes_nothing_and_names_its_option(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(root))
    result = CliRunner().invoke(main, [a.format(root=root) for a in args])
    assert result.exit_code == USAGE_ERROR, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("conveyor: error: Invalid value for ") and args[-2] in line, line
    assert "an empty path names" in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("args", "option"), [
    (["deploy", "kubernetes", "--app", "tests.apps.drain_app:app", "--config",
      "{root}/configs/redis.toml", "--output", "{long}"], "--output"),
    (["dev", "redis", "--port", "{port}", "--write-config", "{long}"], "--write-config"),
    (["sim", "filter", "--signal", "drop", "--plot", "{long}/plot.png"], "--plot"),
])
def test_an_output_path_past_the_file_systems_limit_is_one_line_naming_its_option(
    args: list[str], option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A name of more than 255 bytes: Path.exists() and is_dir() raise ENAMETOOLONG
    # (Python 3.11), a traceback from the option's check.
    root = Path(__file__).resolve().parents[2]
    monkeypatch.syspath_prepend(str(root))
    long = str(tmp_path / ("a" * 300))
    result = CliRunner().invoke(main, [a.format(root=root, long=long, port=free_port())
                                       for a in args])
    assert result.exit_code == USAGE_ERROR, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("conveyor: error: ") and option in line, line
    assert line.endswith("File name too long") or "File name too long (see" in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["console", "--config", "configs/redis.toml"],
                                     ["dev", "redis"], ["dev", "kafka"]])
def test_a_bad_port_from_the_environment_names_the_variable(command: list[str]) -> None:
    # `CONVEYOR_CONSOLE_PORT=abc conveyor console` said "Invalid value for '--port'", an
    # option that was not given; dev's ports named their variable already.
    variable = ("CONVEYOR_CONSOLE_PORT" if command[0] == "console"
                else f"CONVEYOR_DEV_{command[1].upper()}_PORT")
    root = Path(__file__).resolve().parents[2]
    args = [str(root / a) if a.endswith(".toml") else a for a in command]
    result = CliRunner().invoke(main, args, env={variable: "abc"})
    assert result.exit_code == USAGE_ERROR, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(f"conveyor: error: Invalid value for '--port' (env var: "
                           f"'{variable}'): 'abc' is not a valid integer range"), line


def test_an_arrivals_file_that_is_not_utf8_is_one_line_naming_the_option(
    tmp_path: Path,
) -> None:
    file = tmp_path / "arrivals.txt"
    file.write_bytes(b"0.5\n\xff\xfe1.0\n")
    result = CliRunner().invoke(main, ["sim", "--arrivals", str(file)])
    assert result.exit_code == USAGE_ERROR, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(f"conveyor: error: Invalid value for --arrivals: {file}: not "
                           "UTF-8 text (byte 0xff at offset 4); expected one number of "
                           "seconds per line"), line


@pytest.mark.parametrize(("args", "says"), [
    # Measured the memory adapter under the broker's name: --adapter was left out.
    (["--bootstrap", "kafka.example:9092"],
     "--bootstrap is for --adapter kafka, and this run measures memory"),
    (["--redis-url", "redis://r.example/0"],
     "--redis-url is for --adapter redis, and this run measures memory"),
    (["--adapter", "kafka", "--daemons", "2"],
     "--daemons is for --adapter redis, and this run measures kafka"),
    # Found by the config only once the benchmark ran (exit 1), or taken as no address.
    (["--adapter", "kafka", "--bootstrap", "k:99999"],
     "--bootstrap: expected HOST:PORT[,HOST:PORT...], got 'k:99999'"),
    (["--adapter", "kafka", "--bootstrap", ""],
     "--bootstrap: expected HOST:PORT[,HOST:PORT...], got ''"),
    (["--set", "queues.total=\udcff"],  # bytes from the shell, not UTF-8: a traceback
     "Invalid value for '--set': 'queues.total=\\udcff' is not UTF-8 text"),
    (["--set", "slots.count=4", "--set", "slots.count=8"],
     "Invalid value for '--set': slots.count is set twice; set it once"),
    (["--slots", "4", "--set", "slots.count=8"],
     "--slots N is --set slots.count=N: give one of them"),
])
def test_bench_throughput_refuses_options_it_would_ignore_or_misread(
    args: list[str], says: str,
) -> None:
    result = CliRunner().invoke(main, ["bench", "throughput", "-n", "1", *args])
    assert result.exit_code == USAGE_ERROR, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(f"conveyor: error: {says}"), line


def test_bench_throughput_refuses_a_config_it_could_not_read_again(tmp_path: Path) -> None:
    # A pipe (`--config <(...)`) was read twice: the second read found it empty, and the
    # benchmark ran the defaults (8 queues, 64 slots) under the pipe's name, exit 0.
    import os

    read, write = os.pipe()
    os.write(write, b'[queues]\nadapter = "memory"\ntotal = 2\n')
    os.close(write)
    try:
        result = CliRunner().invoke(main, ["bench", "throughput", "-n", "1", "--repeats", "1",
                                           "--streams", "1", "--config", f"/dev/fd/{read}"])
    finally:
        os.close(read)
    assert result.exit_code == USAGE_ERROR, result.output
    [line] = result.stderr.splitlines()
    assert line == (f"conveyor: error: --config: /dev/fd/{read} is not a regular file, and "
                    "a benchmark reads its config again in each run (and in each worker it "
                    "starts): give a file"), line


def test_bench_throughput_reads_a_config_file_as_every_command_does(tmp_path: Path) -> None:
    # Bytes that are not UTF-8 were a UnicodeDecodeError traceback; the byte order mark
    # every other command skips was "Invalid statement (at line 1, column 1)".
    bad, marked = tmp_path / "bad.toml", tmp_path / "marked.toml"
    bad.write_bytes(b'\xff\xfe[queues]\r\nadapter = "memory"\r\n')
    marked.write_bytes(b'\xef\xbb\xbf[queues]\r\nadapter = "memory"\r\ntotal = 2\r\n')
    result = CliRunner().invoke(main, ["bench", "throughput", "-n", "1", "--config", str(bad)])
    assert result.exit_code == USAGE_ERROR, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("conveyor: error: Invalid value for --set / --slots / --config: "
                           f"{bad}: not valid TOML: not UTF-8 text (byte 0xff at offset 0)"), line
    from conveyor.bench.shipped import Variant, bench_config

    assert bench_config("memory", {}, Variant(config_file=marked)).config.queues.total == 2


def test_every_seed_option_refuses_a_negative_seed() -> None:
    # numpy's generators take whole numbers from 0: `sim --seed -1` was a traceback.
    from tests.unit.test_cli_help import ALL

    seeds = [(ctx.command_path, p) for ctx, cmd in ALL for p in cmd.params if p.name == "seed"]
    assert len(seeds) >= 5
    for path, param in seeds:
        with pytest.raises(click.BadParameter):
            param.type.convert("-1", param, None)
            pytest.fail(f"{path} --seed took -1")


@pytest.mark.parametrize(("args", "option"), [
    # numpy's MemoryError as a traceback ("Unable to allocate 1.46 TiB"), or a run of years.
    (["sim", "placement", "--trials", "99999999999"], "--trials"),
    (["sim", "placement", "--balls-per-bin", "99999999999"], "--balls-per-bin"),
    (["tune", "--population", "99999999999", "--generations", "0"], "--population"),
    # The config allows 4096 queues at most; the simulation is of what a config can run.
    (["sim", "balancer", "--queues", "4097"], "--queues"),
    # Hours of wall-clock time: a day of virtual steady state at the default size, a
    # demo of 10**12 messages (the embedded adapter holds each: ~250 bytes a message).
    (["sim", "balancer", "--steady", "86400"], "--steady"),
    (["demo", "-n", "1000000000000"], "--messages' / '-n"),
    # More streams than a demo may have messages names no more keys.
    (["demo", "--streams", "1000001"], "--streams' / '-s"),
    # A bench builds every message before it runs (a million: 1.8 GB on memory), and
    # each repeat is a whole run: 10**12 messages ran out of memory, 10**19 repeats on.
    (["bench", "throughput", "-n", "1000000000000"], "--messages' / '-n"),
    (["bench", "throughput", "--streams", "1000001"], "--streams' / '-s"),
    (["bench", "throughput", "--repeats", "10000000000000000000"], "--repeats"),
    (["bench", "throughput", "--adapter", "kafka", "--io-messages", "1000001"],
     "--io-messages"),
    (["bench", "telemetry", "--messages", "1000001"], "--messages' / '-n"),
    (["bench", "telemetry", "--repeats", "101"], "--repeats"),
    # Each cycle runs in real time: 10**19 cycles never ended (short ones here, so that
    # without the bound the run ends, exit 0, and the test fails rather than hangs).
    (["bench", "scale-down", "--load-s", "0.01", "--cycle-s", "0.01", "--cycles", "1001"],
     "--cycles"),
])
def test_a_lab_size_past_what_the_machine_or_a_config_can_hold_is_a_usage_error(
    args: list[str], option: str,
) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == USAGE_ERROR, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(f"conveyor: error: Invalid value for '{option}': "), line


@pytest.mark.parametrize("command", [["worker", "tests.apps.drain_app:app"],
                                     ["bench", "throughput", "-n", "1"]])
def test_slots_past_what_the_config_holds_names_the_option_not_the_config_field(
    command: list[str],
) -> None:
    # It named `a command-line option (slots.count)`, a config field, as a config error.
    result = CliRunner().invoke(main, [*command, "--slots", "99999999999999999999"])
    assert result.exit_code == USAGE_ERROR, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("conveyor: error: Invalid value for '--slots': "), line
    assert "slots.count" not in line, line


@pytest.mark.parametrize("kind", [BrokerError, ConfigError, InvalidArgumentError])
def test_an_error_naming_a_producers_text_is_still_one_line_with_no_escape_sequence(
    kind: type[ConveyorError],
) -> None:
    # A stream key is whatever a producer wrote: `publish ns $'k\nforged'` over the
    # body limit printed the key's newline as a second line, its ESC as it was.
    result = invoke_raising("publish", kind("stream ns/k\x1b[31mred\nforged: too large"))
    [line] = result.stderr.splitlines()
    assert line.startswith("conveyor: error: ") and line.endswith(": too large"), line
    assert "ns/k\\x1b[31mred\\nforged" in line, line
    assert "\x1b" not in result.stderr


def test_a_warning_is_one_line_with_no_escape_sequence() -> None:
    from conveyor.cli.common import warn

    @click.command()
    def command() -> None:
        warn("key k\x1b[2J\nforged")

    result = CliRunner().invoke(command, [])
    assert result.stderr == "conveyor: warning: key k\\x1b[2J\\nforged\n"


@pytest.mark.parametrize("command", [
    ["console", "--config", "configs/redis.toml", "--port", "0"],
    ["dev", "redis", "--port", "{port}"],
    ["dev", "kafka", "--port", "{port}"],
], ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("host", ["a" * 64, "a..b"])
def test_a_host_no_resolver_takes_is_one_line_naming_host(command: list[str],
                                                          host: str) -> None:
    # The resolver's IDNA codec raises UnicodeError ("label too long"), not OSError: a
    # traceback, exit 1.
    port = str(free_port())
    args = [a.replace("{port}", port) for a in command] + ["--host", host]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == USAGE_ERROR, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(f"conveyor: error: Invalid value for '--host': {host!r} is no "
                           "host name: a dot-separated part is empty or longer than 63 "
                           "characters"), line


@pytest.mark.parametrize(("args", "says"), [
    (["k1", "{}", "--body-file", "-"],
     "give the body as BODY or as --body-file, one of them, not both"),
    (["k1"], "give the body as BODY or as --body-file, one of them"),
    (["k1", "--body-file", "/dev/zero"],  # read whole, it would never end
     "Invalid value for --body-file: /dev/zero is larger than $.queues.max_body_bytes "
     "(16777216 bytes); nothing was sent"),
    (["k1", "--body-file", "-"],  # stdin, here the runner's "not json"
     "Invalid value for --body-file: 'not json' is not JSON ("),
])
def test_publish_takes_the_body_from_one_place_and_no_larger_than_a_body(
    args: list[str], says: str,
) -> None:
    result = CliRunner().invoke(main, ["publish", "orders", *args, "--config",
                                       "configs/redis.toml"], input="not json",
                                env=nowhere())
    assert result.exit_code == USAGE_ERROR, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(f"conveyor: error: {says}"), line
