"""What ``conveyor rewind --to`` and ``--queue`` accept: a token's parts within the
positions a broker can have (Redis stream ids: two unsigned 64-bit numbers; Kafka
offsets: signed 64-bit), and queues that exist and agree with the token's. Every
refusal is a one-line usage error (exit 2), found before the broker is asked anything:
no server listens where these configs point."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from conveyor.adapters.kafka.adapter import KAFKA_OFFSET_MAX
from conveyor.backends import create_adapter
from conveyor.cli import main
from conveyor.cli.common import USAGE_ERROR
from conveyor.platform.config import load_config
from conveyor.platform.errors import InvalidArgumentError, TokenRangeError
from conveyor.platform.ids import POSITION_MAX, SequenceToken
from tests.conftest import free_port

TOO_BIG = "99999999999999999999999"


@pytest.mark.parametrize(("text", "token"), [
    ("3:1042-0", SequenceToken(3, 1042, 0)),
    ("3:1042", SequenceToken(3, 1042, 0)),
    ("0:1700000000000-3", SequenceToken(0, 1700000000000, 3)),
    (f"7:{POSITION_MAX}-{POSITION_MAX}", SequenceToken(7, POSITION_MAX, POSITION_MAX)),
    ("0:0-0", SequenceToken(0, 0, 0)),
])
def test_a_token_parses_up_to_the_largest_redis_stream_id(text: str,
                                                          token: SequenceToken) -> None:
    assert SequenceToken.parse(text) == token


@pytest.mark.parametrize(("text", "message"), [
    (f"0:{TOO_BIG}-0", "MAJOR is above 18446744073709551615"),
    (f"0:1-{TOO_BIG}", "MINOR is above 18446744073709551615"),
    (f"0:{POSITION_MAX + 1}", "MAJOR is above"),
    (f"0:1-{POSITION_MAX + 1}", "MINOR is above"),
    (f"{TOO_BIG}:1-0", "QUEUE is above"),
    ("0:" + "9" * 5000, "MAJOR is above"),  # more digits than int() takes
    ("-1:0-0", "whole numbers from 0"),
    ("0:-1", "whole numbers from 0"),
    ("0:5--3", "whole numbers from 0"),
    ("0:+5", "whole numbers from 0"),
    ("0: 5", "whole numbers from 0"),
    ("0:1_000", "whole numbers from 0"),
    ("0:\u0661\u0662", "whole numbers from 0"),  # digits int() takes, not ASCII
    ("0:1-", "whole numbers from 0"),
    ("0:abc", "whole numbers from 0"),
    (5, "5 is int, not text"),  # was "TypeError: expected string or bytes-like object"
    (b"3:1042-0", "b'3:1042-0' is bytes, not text"),
    (None, "None is NoneType, not text"),
])
def test_a_token_out_of_range_or_not_in_plain_digits_is_refused(text: object,
                                                               message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message) as caught:
        SequenceToken.parse(text)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)
    assert len(str(caught.value)) < 200  # a long token is cut short in the message


def test_kafka_takes_offsets_up_to_a_signed_64_bit_number() -> None:
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "kafka", "total": 4},
        "kafka": {"bootstrap": f"127.0.0.1:{free_port()}"},
        "balancer": {"kind": "kafka-group"}})
    adapter = create_adapter("kafka", config)  # builds no connection
    assert KAFKA_OFFSET_MAX == 2**63 - 1
    adapter.check_token(SequenceToken(0, KAFKA_OFFSET_MAX))
    with pytest.raises(TokenRangeError, match="out of the kafka adapter's range"):
        adapter.check_token(SequenceToken(0, KAFKA_OFFSET_MAX + 1))
    with pytest.raises(TokenRangeError):
        adapter.check_token(SequenceToken(0, -1))


def run(*args: str, adapter: str = "redis") -> tuple[int, str, str]:
    """``conveyor rewind ARGS`` on a config whose broker does not answer (a check that
    let the command through would fail to connect: exit 1)."""
    env = {"CONVEYOR_REDIS__URL": f"redis://127.0.0.1:{free_port()}/0",
           "CONVEYOR_REDIS__RETRY_MAX_S": "0.2", "CONVEYOR_REDIS__CONNECT_TIMEOUT_S": "0.1",
           "CONVEYOR_KAFKA__BOOTSTRAP": f"127.0.0.1:{free_port()}"}
    result = CliRunner().invoke(
        main, ["rewind", "--app", "shop", *args, "--config", f"configs/{adapter}.toml"],
        env=env)
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(("args", "message"), [
    # Defect: exit 1 with Redis's "Invalid stream ID", or aiokafka's traceback.
    (["--to", f"0:{TOO_BIG}-0"], "Invalid value for --to: not a sequence token"),
    (["--to", f"0:1-{TOO_BIG}"], "MINOR is above 18446744073709551615"),
    (["--to", "-1:0-0"], "not a sequence token: '-1:0-0'"),
    (["--to", "0:5--3"], "not a sequence token"),
    (["--to", "8:0-0"], "token 8:0-0 names queue 8, which does not exist: the config's "
                        "queues are 0-7"),
    # Defect: --queue was ignored with a token, whatever queue it named.
    (["--queue", "5", "--to", "0:0-0"],
     "Invalid value for --queue: queue(s) [5] given, but token 0:0-0 names queue 0"),
    (["--queue", "0", "--queue", "1", "--to", "0:0-0"], "queue(s) [1] given"),
    (["--queue", "-1", "--to", "0:0-0"], "Invalid value for --queue: no such queue(s) [-1]"),
    (["--queue", "-3", "--to", "2026-11-22T10:00:00Z"], "no such queue(s) [-3]"),
    (["--queue", "8", "--to", "2026-11-22T10:00:00Z"],
     "no such queue(s) [8]: the config's queues are 0-7"),
])
def test_a_bad_token_or_queue_is_a_one_line_usage_error(args: list[str], message: str) -> None:
    code, out, err = run(*args)
    assert code == USAGE_ERROR, err
    [line] = err.splitlines()
    assert line.startswith("conveyor: error: ") and message in line, line
    assert out == ""


def test_a_kafka_offset_above_a_signed_64_bit_number_is_a_usage_error() -> None:
    code, _, err = run("--to", f"0:{KAFKA_OFFSET_MAX + 1}-0", "--allow-forward",
                       adapter="kafka")
    assert code == USAGE_ERROR, err
    [line] = err.splitlines()
    assert line.startswith(
        f"conveyor: error: Invalid value for --to: token 0:{KAFKA_OFFSET_MAX + 1}-0: its "
        f"major part is out of the kafka adapter's range 0..{KAFKA_OFFSET_MAX} (see "), line


@pytest.mark.parametrize("args", [
    ["--to", f"0:{POSITION_MAX}-{POSITION_MAX}"],  # the largest Redis stream id
    ["--queue", "3", "--to", "3:17-0"],  # --queue naming the token's own queue
    ["--queue", "1", "--queue", "1", "--to", "2026-11-22T10:00:00Z"],
])
def test_targets_in_range_get_past_the_checks_to_the_broker(args: list[str]) -> None:
    code, _, err = run(*args)
    assert code == 1, err  # nothing listens there: the connection fails
    assert "redis" in err and "Traceback" not in err
