import re
from pathlib import Path

import msgspec
import pytest

from conveyor.platform.config import Config, load_config
from conveyor.platform.config.checks import KAFKA_TOPIC_MAX
from conveyor.platform.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_shipped_configs_load() -> None:
    for path in sorted((ROOT / "configs").glob("*.toml")):
        load_config(path, environ={})


def test_unknown_field_is_named_with_its_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown field `slotz` - at `\$.worker`"):
        load_config(write(tmp_path, "[worker]\nslotz = 3\n"), environ={})


def test_out_of_range_value_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r">= 1 - at `\$.queues.total`"):
        load_config(write(tmp_path, "[queues]\ntotal = 0\n"), environ={})


def test_wrong_type_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\$.slots.count"):
        load_config(write(tmp_path, '[slots]\ncount = "many"\n'), environ={})


def test_invalid_toml_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[worker\n"), environ={})


@pytest.mark.parametrize("data", [b"\xff\xfe\x00garbage", b'x = "\xff"\n'])
def test_a_file_that_is_not_utf8_is_not_toml(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "binary.toml"
    path.write_bytes(data)
    with pytest.raises(ConfigError, match=r"binary.toml: not valid TOML: not UTF-8 text "
                                          r"\(byte 0xff at offset \d+\)"):
        load_config(path, environ={})


def test_a_file_starting_with_a_utf8_byte_order_mark_loads_as_without_it(
    tmp_path: Path,
) -> None:
    # Editors on Windows write one ("UTF-8 with BOM"): the file was "not valid TOML:
    # Invalid statement (at line 1, column 1)", which showed nothing wrong there.
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf[queues]\ntotal = 3\n")
    assert load_config(path, environ={}).queues.total == 3


def test_a_file_larger_than_any_config_is_refused_without_reading_it_all(
    tmp_path: Path,
) -> None:
    # `--config /dev/zero` read until the kernel killed the process (exit 137); a file
    # of megabytes is no config either.
    from conveyor.platform.config import MAX_CONFIG_BYTES

    path = tmp_path / "huge.toml"
    path.write_bytes(b"[queues]\ntotal = 3\n#" + b"x" * MAX_CONFIG_BYTES)
    with pytest.raises(ConfigError, match=r"huge.toml: larger than 1 MiB, which no "
                                          r"config is"):
        load_config(path, environ={})
    with pytest.raises(ConfigError, match=r"^/dev/zero: larger than 1 MiB"):
        load_config("/dev/zero", environ={})


def test_a_config_read_from_a_pipe_is_read_once() -> None:
    # A file given as <(cat c.toml): the bytes read are the config, and a command that
    # needs the text too (deploy kubernetes puts it in a ConfigMap) gets those bytes.
    import os

    from conveyor.platform.config import parse_config, read_config_file

    read_end, write_end = os.pipe()
    os.write(write_end, b"[queues]\ntotal = 5\n")
    os.close(write_end)
    try:
        text = read_config_file(f"/dev/fd/{read_end}")
    finally:
        os.close(read_end)
    assert text == b"[queues]\ntotal = 5\n"
    assert parse_config(text, "<pipe>", environ={}).queues.total == 5


def test_a_kafka_client_id_longer_than_a_protocol_string_is_refused_naming_it() -> None:
    # Every request carries it as a Kafka string (a 16-bit length): a longer one was a
    # struct.error traceback from aiokafka's encoder at the first request.
    assert load_config(environ={"CONVEYOR_KAFKA__CLIENT_ID": "é" * 16_383}).kafka.client_id
    with pytest.raises(ConfigError) as caught:
        load_config(environ={"CONVEYOR_KAFKA__CLIENT_ID": "é" * 16_384})
    assert str(caught.value) == (
        "environment variable CONVEYOR_KAFKA__CLIENT_ID: $.kafka.client_id: at most 32767 "
        "bytes in UTF-8 (a Kafka protocol string), got 32768")


LABEL_64 = "a" * 64


@pytest.mark.parametrize(("environ", "field"), [
    # The resolver's IDNA encoding raises UnicodeError, not OSError, for such a name:
    # a traceback from the worker's /metrics endpoint, from the Kafka client, or a
    # Redis "unreachable" (exit 1) for what the file got wrong.
    ({"CONVEYOR_HTTP__HOST": f"{LABEL_64}.example.com"}, "$.http.host"),
    ({"CONVEYOR_HTTP__HOST": "a..b"}, "$.http.host"),
    ({"CONVEYOR_KAFKA__BOOTSTRAP": f"k1:9092,{LABEL_64}:9092"}, "$.kafka.bootstrap"),
    ({"CONVEYOR_QUEUES__ADAPTER": "redis", "CONVEYOR_BALANCER__MEMBERSHIP": "redis",
      "CONVEYOR_REDIS__URL": f"redis://{LABEL_64}:6379/0"}, "$.redis.url"),
    ({"CONVEYOR_REDIS__MODE": "sentinel",
      "CONVEYOR_REDIS__SENTINELS": f'["{LABEL_64}:26379"]'}, "$.redis.sentinels[0]"),
])
def test_a_host_no_resolver_takes_is_refused_naming_its_field(
    environ: dict[str, str], field: str,
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(environ=environ)
    message = str(caught.value)
    assert f"{field}: " in message, message
    assert ("is no host name: a dot-separated part is empty or longer than 63 "
            "characters") in message, message


def test_an_empty_kafka_default_namespace_is_refused_naming_it(tmp_path: Path) -> None:
    # Records without cv-ns were read under namespace '', which no handler can take:
    # every app skipped them (acknowledged) as another app's traffic.
    with pytest.raises(ConfigError, match=r"length >= 1 - at `\$.kafka.default_namespace`"):
        load_config(write(tmp_path, '[kafka]\ndefault_namespace = ""\n'), environ={})
    with pytest.raises(ConfigError, match="CONVEYOR_KAFKA__DEFAULT_NAMESPACE"):
        load_config(None, environ={"CONVEYOR_KAFKA__DEFAULT_NAMESPACE": ""})


def test_an_integer_beyond_64_bits_is_named_wherever_it_was_set(tmp_path: Path) -> None:
    """No setting needs one; Redis refused such a dead-letter bound on every letter."""
    huge = "99999999999999999999999"
    with pytest.raises(ConfigError, match=r"within 64 bits \(<= 9223372036854775807\) - "
                                          r"at `\$.dead_letters.max_entries`"):
        load_config(write(tmp_path, f"[dead_letters]\nmax_entries = {huge}\n"), environ={})
    with pytest.raises(ConfigError, match=r"CONVEYOR_DEAD_LETTERS__MAX_ENTRIES: .*"
                                          r"`\$.dead_letters.max_entries`"):
        load_config(None, environ={"CONVEYOR_DEAD_LETTERS__MAX_ENTRIES": huge})
    assert load_config(None, environ={}, overrides={
        "dead_letters": {"max_entries": (1 << 63) - 1}}).dead_letters.max_entries == (1 << 63) - 1


def test_balancer_queues_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\$.balancer.queues"):
        load_config(write(tmp_path, "[balancer]\nkind='static'\nqueues=[9]\n"), environ={})


def test_environment_overrides_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[worker]\ndrain_timeout_s = 30\n[slots]\ncount = 4\n")
    config = load_config(
        path, environ={"CONVEYOR_WORKER__DRAIN_TIMEOUT_S": "2.5", "CONVEYOR_SLOTS__COUNT": "9"}
    )
    assert config.worker.drain_timeout_s == 2.5
    assert config.slots.count == 9


def test_environment_with_unknown_section_or_field_is_an_error() -> None:
    with pytest.raises(ConfigError, match="CONVEYOR_NOPE__X"):
        load_config(environ={"CONVEYOR_NOPE__X": "1"})
    with pytest.raises(ConfigError, match=r"unknown field `slotz`"):
        load_config(environ={"CONVEYOR_WORKER__SLOTZ": "1"})


def test_unrelated_environment_is_ignored() -> None:
    assert load_config(environ={"CONVEYOR_HOME": "/x", "PATH": "/bin"}).queues.total == 8


@pytest.mark.parametrize(
    ("section", "text"),
    [("queues", 'adapter = "redix"'), ("balancer", 'membership = "nope"')],
)
def test_unknown_adapter_or_membership_is_named_at_load(
    tmp_path: Path, section: str, text: str
) -> None:
    field = text.split()[0]
    with pytest.raises(ConfigError, match=rf"\$.{section}.{field}"):
        load_config(write(tmp_path, f"[{section}]\n{text}\n"), environ={})


def test_redis_adapter_with_dynamic_balancer_needs_redis_membership(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r'\$.balancer.membership: .*needs membership = "redis"'):
        load_config(write(tmp_path, '[queues]\nadapter = "redis"\n'), environ={})
    # The working combinations still load: redis membership, or a static balancer.
    load_config(write(tmp_path, '[queues]\nadapter = "redis"\n[balancer]\nmembership = "redis"\n'),
                environ={})
    load_config(write(tmp_path, '[queues]\nadapter = "redis"\n[balancer]\nkind = "static"\n'),
                environ={})
    # Kafka's receivers take no lease: dynamic over in-process membership works.
    load_config(write(tmp_path, '[queues]\nadapter = "kafka"\n[balancer]\nkind = "dynamic"\n'),
                environ={})


def test_kafka_group_balancer_needs_the_kafka_adapter(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\$.balancer.kind"):
        load_config(write(tmp_path, '[balancer]\nkind = "kafka-group"\n'), environ={})


@pytest.mark.parametrize("text", ["slots = 3\n", 'queues = "x"\n'])
def test_a_section_that_is_not_a_table_is_named_even_with_overrides(
    tmp_path: Path, text: str
) -> None:
    section = text.split()[0]
    overrides = {"slots": {"count": 4}, "queues": {"adapter": "memory"}}
    with pytest.raises(ConfigError, match=rf"\$.{section}: expected a table"):
        load_config(write(tmp_path, text), environ={}, overrides=overrides)
    with pytest.raises(ConfigError, match=rf"\$.{section}"):
        load_config(write(tmp_path, text), environ={f"CONVEYOR_{section.upper()}__TOTAL": "2"})


def test_environment_strings_stay_strings_for_string_fields() -> None:
    config = load_config(environ={
        "CONVEYOR_KAFKA__TOPIC": "123",
        "CONVEYOR_MEMORY__BROKER": "true",
        "CONVEYOR_TELEMETRY__SERVICE_NAME": "[x]",
    })
    assert config.kafka.topic == "123"
    assert config.memory.broker == "true"
    assert config.telemetry.service_name == "[x]"


def test_environment_scalars_are_read_as_the_fields_type() -> None:
    config = load_config(environ={
        "CONVEYOR_REDIS__TLS_VERIFY": "false",
        "CONVEYOR_WORKER__DRAIN_TIMEOUT_S": "2.5",
        "CONVEYOR_CELLS__DEFAULT_SIZE": "6",
        "CONVEYOR_BALANCER__QUEUES": "[0, 3]",
        "CONVEYOR_BALANCER__KIND": "static",
        "CONVEYOR_TELEMETRY__HEADERS": '{"api-key": "k"}',
        "CONVEYOR_TELEMETRY__EXPORTER": "otlp",
    })
    assert config.redis.tls_verify is False
    assert config.worker.drain_timeout_s == 2.5
    assert config.cells.default_size == 6
    assert config.balancer.queues == [0, 3]
    assert config.telemetry.headers == {"api-key": "k"}
    with pytest.raises(ConfigError, match="CONVEYOR_BALANCER__QUEUES: expected JSON"):
        load_config(environ={"CONVEYOR_BALANCER__QUEUES": "0,3"})


@pytest.mark.parametrize(("name", "value", "says"), [
    # Said `Expected `float`, got `str``: every variable is text, and the value was not
    # shown, so an empty one (`X=${UNSET}` in a compose file) or " 5" could not be seen.
    ("CONVEYOR_WORKER__DRAIN_TIMEOUT_S", "", "expected a number, got ''"),
    ("CONVEYOR_WORKER__DRAIN_TIMEOUT_S", " 5", "expected a number, got ' 5'"),
    ("CONVEYOR_QUEUES__TOTAL", "eight", "expected a whole number, got 'eight'"),
    ("CONVEYOR_QUEUES__TOTAL", "8.5", "expected a whole number, got '8.5'"),
    ("CONVEYOR_REDIS__TLS_VERIFY", "maybe", "expected true or false, got 'maybe'"),
])
def test_an_environment_scalar_that_is_no_value_of_its_type_is_shown(
    name: str, value: str, says: str,
) -> None:
    path = "$." + name.removeprefix("CONVEYOR_").lower().replace("__", ".")
    with pytest.raises(ConfigError) as raised:
        load_config(environ={name: value})
    assert str(raised.value) == f"environment variable {name}: {path}: {says}"


def test_environment_reaches_nested_sections(tmp_path: Path) -> None:
    path = write(tmp_path, "[slots.resource]\nmax_slots = 50\n")
    config = load_config(path, environ={
        "CONVEYOR_SLOTS__RESOURCE__MIN_SLOTS": "3",
        "CONVEYOR_BALANCER__WEIGHTS__CPU_USAGE": "0.7",
    })
    assert config.slots.resource.min_slots == 3
    assert config.slots.resource.max_slots == 50, "the file's sibling field is kept"
    assert config.balancer.weights.cpu_usage == 0.7
    with pytest.raises(ConfigError, match=r"\$.slots.resource.min_slots"):
        load_config(environ={"CONVEYOR_SLOTS__RESOURCE__MIN_SLOTS": "0"})


def test_environment_path_errors_name_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"CONVEYOR_SLOTS__RESOURCE__NOPE: unknown field "
                                          r"`nope` at `\$.slots.resource`"):
        load_config(environ={"CONVEYOR_SLOTS__RESOURCE__NOPE": "1"})
    with pytest.raises(ConfigError, match=r"CONVEYOR_SLOTS__COUNT__X: \$.slots.count is not"):
        load_config(environ={"CONVEYOR_SLOTS__COUNT__X": "1"})


def test_environment_written_with_json_dumps_reads_the_same() -> None:
    # The supervisor hands CLI overrides to its children as json.dumps'd variables.
    from conveyor.workers.supervisor.run import env_for_overrides

    overrides = {"slots": {"count": 4}, "worker": {"drain_timeout_s": 2.5},
                 "kafka": {"topic": "orders"}, "redis": {"tls_verify": False},
                 "balancer": {"queues": [0, 1], "kind": "static"}}
    config = load_config(environ=env_for_overrides(overrides))
    assert load_config(environ={}, overrides=overrides) == config
    assert config.kafka.topic == "orders" and config.slots.count == 4


# -- bounds -----------------------------------------------------------------------------

BAD_VALUES = [
    # (TOML section, field, bad value as TOML, the path the error names)
    ("queues", "total", "4097", "$.queues.total"),
    ("balancer", "rebalance_interval_s", "1e-300", "$.balancer.rebalance_interval_s"),
    ("balancer", "lease_ttl_s", "inf", "$.balancer.lease_ttl_s"),
    ("balancer", "lease_ttl_s", "nan", "$.balancer.lease_ttl_s"),
    ("worker", "drain_timeout_s", "-inf", "$.worker.drain_timeout_s"),
    ("worker", "poll_timeout_ms", "0", "$.worker.poll_timeout_ms"),
    ("redis", "retention_s", "1e12", "$.redis.retention_s"),
    ("redis", "member_ttl_s", "0.0001", "$.redis.member_ttl_s"),
    ("supervisor", "inspection_period_ms", "inf", "$.supervisor.inspection_period_ms"),
    ("telemetry", "metrics_interval_s", "nan", "$.telemetry.metrics_interval_s"),
    ("kafka", "session_timeout_ms", "100000000000", "$.kafka.session_timeout_ms"),
    ("kafka", "replication_factor", "40000", "$.kafka.replication_factor"),
    ("cells", "default_size", "100000", "$.cells.default_size"),
    ("balancer.weights", "local_margin", "inf", "$.balancer.weights.local_margin"),
    ("kafka", "topic", '""', "$.kafka.topic"),
    ("kafka", "topic", '"a\\nb"', "$.kafka.topic"),
    ("kafka", "topic", '"../x"', "$.kafka.topic"),
    ("kafka", "topic", '".."', "$.kafka.topic"),
    ("kafka", "topic", f'"{"t" * 233}"', "$.kafka.topic"),
    ("kafka", "assignors", "[]", "$.kafka.assignors"),
    ("kafka", "assignors", '["sticky", "sticky"]', "$.kafka.assignors"),
    ("kafka", "assignors", '["range"]', "$.kafka.assignors"),
    ("kafka", "group_instance_id", '"pod 1"', "$.kafka.group_instance_id"),
    ("kafka", "group_instance_id", '".."', "$.kafka.group_instance_id"),
    ("kafka", "group_instance_id", f'"{"p" * 250}"', "$.kafka.group_instance_id"),
    ("kafka", "bootstrap", '"host:port"', "$.kafka.bootstrap"),
    ("kafka", "bootstrap", '"h:9092,"', "$.kafka.bootstrap"),
    ("redis", "prefix", '"conveyor\\n"', "$.redis.prefix"),
    ("redis", "prefix", '"a:b"', "$.redis.prefix"),
    ("redis", "password_env", '"MY PASSWORD"', "$.redis.password_env"),
    ("memory", "broker", '"x\\u0000y"', "$.memory.broker"),
    ("telemetry", "endpoint", '"localhost:4318"', "$.telemetry.endpoint"),
    # Set where the exporter would drop it without a word.
    ("telemetry", "endpoint", '"http://localhost:4318"', "$.telemetry.endpoint: only used "
     'with exporter = "otlp", got exporter = "none"'),
    ("telemetry", "headers", '{api-key = "k"}', "$.telemetry.headers: only used with "
     'exporter = "otlp"'),
]


@pytest.mark.parametrize(("section", "field", "value", "path"), BAD_VALUES)
def test_a_value_out_of_bounds_is_refused_naming_its_path(
    tmp_path: Path, section: str, field: str, value: str, path: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, f"[{section}]\n{field} = {value}\n"), environ={})
    assert path in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("name", "value", "path"),
    [
        ("CONVEYOR_QUEUES__TOTAL", "1000000", "$.queues.total"),
        ("CONVEYOR_BALANCER__LEASE_TTL_S", "inf", "$.balancer.lease_ttl_s"),
        ("CONVEYOR_BALANCER__REBALANCE_INTERVAL_S", "nan", "$.balancer.rebalance_interval_s"),
        ("CONVEYOR_WORKER__DRAIN_TIMEOUT_S", "Infinity", "$.worker.drain_timeout_s"),
        ("CONVEYOR_REDIS__PREFIX", "conveyor\n", "$.redis.prefix"),
        ("CONVEYOR_KAFKA__TOPIC", "a\nb", "$.kafka.topic"),
    ],
)
def test_the_same_bounds_hold_for_environment_values(name: str, value: str, path: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(path)):
        load_config(environ={name: value})


def test_every_float_is_bounded_on_both_sides_so_inf_and_nan_never_load() -> None:
    def floats(t: msgspec.inspect.Type, path: str) -> list[tuple[str, msgspec.inspect.Type]]:
        if isinstance(t, msgspec.inspect.StructType):
            return [x for f in t.fields for x in floats(f.type, f"{path}.{f.name}")]
        if isinstance(t, msgspec.inspect.UnionType):
            return [x for m in t.types for x in floats(m, path)]
        return [(path, t)] if isinstance(t, msgspec.inspect.FloatType) else []

    found = floats(msgspec.inspect.type_info(Config), "$")
    assert len(found) > 20
    for path, t in found:
        assert isinstance(t, msgspec.inspect.FloatType)
        low = t.ge if t.ge is not None else t.gt
        assert low is not None and t.le is not None, f"{path} is not bounded on both sides"


def test_all_placement_weights_zero_is_refused(tmp_path: Path) -> None:
    text = "[balancer.weights]\ncpu_usage = 0\nmemory_usage = 0\navailable_memory = 0\n"
    with pytest.raises(ConfigError, match=r"\$.balancer.weights: .* all 0"):
        load_config(write(tmp_path, text), environ={})
    load_config(write(tmp_path, text.replace("cpu_usage = 0", "cpu_usage = 2")), environ={})


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("[redis]\nmember_ttl_s = 1.0\nheartbeat_interval_s = 1.0\n",
         "$.redis.heartbeat_interval_s"),
        ("[kafka]\nsession_timeout_ms = 6000\nheartbeat_interval_ms = 6000\n",
         "$.kafka.heartbeat_interval_ms"),
        ("[kafka]\ncommand_timeout_ms = 2000\nfetch_max_wait_ms = 2000\n",
         "$.kafka.command_timeout_ms"),
        ('[queues]\nadapter = "redis"\n[balancer]\nmembership = "redis"\n'
         "[redis]\nsocket_timeout_s = 0.5\n[worker]\npoll_timeout_ms = 500\n",
         "$.redis.socket_timeout_s"),
    ],
)
def test_durations_that_must_come_in_order_are_checked(
    tmp_path: Path, text: str, path: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(path)):
        load_config(write(tmp_path, text), environ={})


def test_a_kafka_command_timeout_below_a_second_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r">= 1000 - at `\$.kafka.command_timeout_ms`"):
        load_config(write(tmp_path, "[kafka]\ncommand_timeout_ms = 999\n"), environ={})
    assert load_config(write(tmp_path, "[kafka]\ncommand_timeout_ms = 1000\n"),
                       environ={}).kafka.command_timeout_ms == 1000


def test_the_longest_topic_leaves_room_for_the_derived_topics() -> None:
    from conveyor.adapters.kafka import KafkaAdapter

    config = load_config(environ={}, overrides={
        "queues": {"adapter": "kafka"}, "kafka": {"topic": "t" * KAFKA_TOPIC_MAX},
    })
    adapter = KafkaAdapter(config.kafka, 1)
    assert len(adapter.dlq_topic) <= 249 and len(adapter.handoffs.topic) <= 249
    assert max(len(adapter.dlq_topic), len(adapter.handoffs.topic)) == 249


def test_zero_means_none_where_the_field_says_so(tmp_path: Path) -> None:
    text = ("[worker]\ndrain_timeout_s = 0\n[redis]\ntrim_interval_s = 0\nretention_s = 0\n"
            "[supervisor]\nscale_up_backoff_s = 0\n[slots.resource]\nramp_throttle_ms = 0\n")
    config = load_config(write(tmp_path, text), environ={})
    assert config.worker.drain_timeout_s == 0 and config.redis.trim_interval_s == 0


def test_a_toml_file_nested_too_deeply_is_a_config_error(tmp_path: Path) -> None:
    deep = "[slots]\noptions = { a = " + "[" * 60_000 + "]" * 60_000 + " }\n"
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(write(tmp_path, deep), environ={})


@pytest.mark.parametrize(("text", "says"), [
    # A field above every [section] line, or under the wrong section: no close name
    # there, so the sections that have it are named.
    ('adapter = "redis"\n[queues]\ntotal = 8\n',
     "unknown field `adapter` ([queues] has `adapter`)"),
    ("[worker]\ncount = 4\n", "unknown field `count` - at `$.worker` ([slots] has `count`)"),
    ("[worker]\nresource = 4\n", "- at `$.worker` ([slots.resource] is a section)"),
    ("[redis]\nbootstrap = 'k:9092'\n", "- at `$.redis` ([kafka] has `bootstrap`)"),
    ("[queues]\ntotl = 8\n", "- at `$.queues` (did you mean `total`?)"),  # close wins
])
def test_an_unknown_field_names_the_section_it_belongs_to(
    tmp_path: Path, text: str, says: str,
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text), environ={})
    assert str(caught.value).endswith(says), caught.value


# -- environment ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["CONVEYOR_BALANCER__QUEUES", "CONVEYOR_SLOTS__OPTIONS",
                                  "CONVEYOR_WORKER"])
def test_environment_json_nested_too_deeply_names_the_variable(name: str) -> None:
    with pytest.raises(ConfigError, match=rf"environment variable {name}: .*nested too deeply"):
        load_config(environ={name: "[" * 60_000 + "]" * 60_000})


@pytest.mark.parametrize(("name", "value", "at"), [
    # os.environ holds bytes that are not UTF-8 as lone surrogates (PEP 383): an int
    # field's was a UnicodeEncodeError traceback, a string field's reached the broker.
    ("CONVEYOR_QUEUES__TOTAL", "\udcff", 1),
    ("CONVEYOR_KAFKA__CLIENT_ID", "ab\udcff", 3),
    ("CONVEYOR_BALANCER__QUEUES", "[0, \udcff]", 5),
    ("CONVEYOR_QUEUES", '{"total": "\udcff"}', 12),
])
def test_an_environment_value_that_is_not_utf8_names_the_variable(
    name: str, value: str, at: int,
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(environ={name: value})
    assert str(caught.value) == (f"environment variable {name}: not UTF-8 text (at "
                                 f"character {at})")


@pytest.mark.parametrize(("name", "field"), [
    ("CONVEYOR_REDIS_PASSWORD", "$.redis.password_env"),
    ("CONVEYOR_REDIS_USERNAME", "$.redis.username_env"),
    ("CONVEYOR_KAFKA_PASSWORD", "$.kafka.sasl_password_env"),
])
def test_a_secret_variable_that_is_not_utf8_names_the_variable_not_the_secret(
    name: str, field: str,
) -> None:
    # Sent to the broker as UTF-8: CONVEYOR_REDIS_PASSWORD=$'\xff' was a
    # UnicodeEncodeError traceback at the first command, a Kafka one "no broker reachable".
    with pytest.raises(ConfigError) as caught:
        load_config(environ={name: "pa\udcffss"})
    assert str(caught.value) == (f"environment variable {name} (named by {field}): not "
                                 "UTF-8 text (at character 3)")


def test_malformed_environment_json_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="environment variable CONVEYOR_WORKER: expected JSON"):
        load_config(environ={"CONVEYOR_WORKER": '{"drain_timeout_s": '})


def test_a_variable_naming_a_section_is_merged_into_it_and_its_fields_win(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "[worker]\nmax_batch = 7\n[slots.resource]\nmax_slots = 50\n")
    config = load_config(path, environ={
        "CONVEYOR_WORKER": '{"drain_timeout_s": 5, "poll_timeout_ms": 100}',
        "CONVEYOR_WORKER__POLL_TIMEOUT_MS": "200",
        "CONVEYOR_SLOTS": '{"resource": {"min_slots": 3}}',
    })
    assert config.worker.drain_timeout_s == 5
    assert config.worker.max_batch == 7, "the file's other fields are kept"
    assert config.worker.poll_timeout_ms == 200, "a field's own variable wins"
    assert (config.slots.resource.min_slots, config.slots.resource.max_slots) == (3, 50)


def test_a_section_variable_must_hold_a_table_of_its_fields() -> None:
    with pytest.raises(ConfigError, match=r"CONVEYOR_WORKER: \$.worker is a section; "
                                          r"expected a JSON table, got int"):
        load_config(environ={"CONVEYOR_WORKER": "5"})
    with pytest.raises(ConfigError, match=r"unknown field `nope` - at `\$.worker`"):
        load_config(environ={"CONVEYOR_WORKER": '{"nope": 1}'})


def test_variables_that_are_not_config_are_left_alone() -> None:
    config = load_config(environ={
        "CONVEYOR_REQUIRE_SERVERS": "1",
        "CONVEYOR_REDIS_PASSWORD": '{"not": json',
        "CONVEYOR_REDIS_USERNAME": "[",
        "CONVEYOR_KAFKA_PASSWORD": "x\ny",
    })
    assert config == load_config(environ={})


def test_a_secret_variable_named_by_an_env_field_is_never_read_as_config(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, '[redis]\npassword_env = "CONVEYOR_REDIS__SECRET"\n'
                           '[kafka]\nsasl_password_env = "CONVEYOR_KAFKA"\n')
    config = load_config(path, environ={"CONVEYOR_REDIS__SECRET": "pw",
                                        "CONVEYOR_KAFKA": "not json"})
    assert config.redis.password_env == "CONVEYOR_REDIS__SECRET"
    # Named from the environment itself, too.
    config = load_config(environ={"CONVEYOR_REDIS__USERNAME_ENV": "CONVEYOR_TELEMETRY",
                                  "CONVEYOR_TELEMETRY": "alice"})
    assert config.redis.username_env == "CONVEYOR_TELEMETRY"
    config = load_config(environ={"CONVEYOR_REDIS": '{"password_env": "CONVEYOR_KAFKA__PW"}',
                                  "CONVEYOR_KAFKA__PW": "pw"})
    assert config.redis.password_env == "CONVEYOR_KAFKA__PW"


# -- what an error says -------------------------------------------------------------------
@pytest.mark.parametrize(("text", "suggestion"), [
    ("[worker]\ndrain_timout_s = 3\n", "unknown field `drain_timout_s` - at `$.worker` "
                                       "(did you mean `drain_timeout_s`?)"),
    ("[workr]\nmax_batch = 3\n", "unknown field `workr` (did you mean `worker`?)"),
    ("[slots.resorce]\nmin_slots = 3\n", "(did you mean `resource`?)"),
    ("[slots.resource]\nmin_slot = 3\n", "- at `$.slots.resource` (did you mean `min_slots`?)"),
])
def test_an_unknown_key_in_a_file_gets_the_closest_known_one(
    tmp_path: Path, text: str, suggestion: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text), environ={})
    assert str(caught.value).startswith(f"{tmp_path / 'c.toml'}: "), caught.value
    assert str(caught.value).endswith(suggestion), caught.value


@pytest.mark.parametrize(("text", "says"), [
    ('[queues]\nadapter = "reddis"\n', "Invalid enum value 'reddis' - at `$.queues.adapter` "
     "(one of `kafka`, `memory`, `redis`; did you mean `redis`?)"),
    ('[balancer]\nkind = "zzz"\n', "Invalid enum value 'zzz' - at `$.balancer.kind` "
     "(one of `dynamic`, `kafka-group`, `static`)"),
    ('[kafka]\nassignors = ["sticky", "round-robin"]\n', "- at `$.kafka.assignors[1]` "
     "(one of `roundrobin`, `sticky`; did you mean `roundrobin`?)"),
])
def test_a_value_that_is_not_one_of_the_choices_lists_them(
    tmp_path: Path, text: str, says: str,
) -> None:
    """msgspec says only "Invalid enum value": the user would have to read the docs to
    learn what `adapter = "reddis"` should have been."""
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text), environ={})
    assert str(caught.value).endswith(says), caught.value


def test_a_bad_choice_from_the_environment_lists_the_choices_too() -> None:
    with pytest.raises(ConfigError, match=r"^environment variable "
                                          r"CONVEYOR_QUEUES__NEW_GROUP_START: Invalid enum value "
                                          r"'lattest' - at `\$\.queues\.new_group_start` "
                                          r"\(one of `earliest`, `latest`; did you mean "
                                          r"`latest`\?\)$"):
        load_config(environ={"CONVEYOR_QUEUES__NEW_GROUP_START": "lattest"})


def test_a_key_close_to_nothing_gets_no_suggestion(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, "[worker]\nzzzzzz = 3\n"), environ={})
    assert str(caught.value).endswith("unknown field `zzzzzz` - at `$.worker`")


def test_an_unknown_variable_name_gets_the_closest_section_or_field() -> None:
    with pytest.raises(ConfigError, match=r"^environment variable CONVEYOR_WORKR__MAX_BATCH: no "
                                          r"config section \[workr\] \(did you mean `worker`\?\)$"):
        load_config(environ={"CONVEYOR_WORKR__MAX_BATCH": "3"})
    with pytest.raises(ConfigError, match=r"unknown field `max_bach` at `\$.worker` "
                                          r"\(did you mean `max_batch`\?\)$"):
        load_config(environ={"CONVEYOR_WORKER__MAX_BACH": "3"})


def test_a_bad_value_names_the_variable_that_set_it_not_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[worker]\nmax_batch = 5\n")
    env = {"CONVEYOR_WORKER__DRAIN_TIMEOUT_S": "-1", "CONVEYOR_SLOTS__COUNT": "4"}
    with pytest.raises(ConfigError, match=r"^environment variable CONVEYOR_WORKER__DRAIN_"
                                          r"TIMEOUT_S: .* - at `\$.worker.drain_timeout_s`$"):
        load_config(path, environ=env)
    # A section's JSON table: the section's variable is the one at fault.
    with pytest.raises(ConfigError, match=r"^environment variable CONVEYOR_WORKER: "):
        load_config(path, environ={"CONVEYOR_WORKER": '{"drain_timeout_s": -1}'})
    with pytest.raises(ConfigError, match=r"^environment variable CONVEYOR_WORKER: .*`max_bach`"
                                          r" - at `\$.worker` \(did you mean `max_batch`\?\)$"):
        load_config(path, environ={"CONVEYOR_WORKER": '{"max_bach": 1}'})
    # A value of the file is the file's fault, even with variables set beside it.
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: .*\$.worker.max_batch"):
        load_config(write(tmp_path, "[worker]\nmax_batch = 0\n"), environ=env)


def test_a_check_across_fields_names_the_variables_that_took_part() -> None:
    with pytest.raises(ConfigError, match=r"^defaults with environment variable CONVEYOR_QUEUES"
                                          r"__ADAPTER: \$.balancer.membership: "):
        load_config(environ={"CONVEYOR_QUEUES__ADAPTER": "redis"})
    with pytest.raises(ConfigError, match=r"^defaults with a command-line option "
                                          r"\(queues.adapter\): \$.balancer.membership: "):
        load_config(environ={}, overrides={"queues": {"adapter": "redis"}})


def test_a_bad_command_line_value_is_blamed_on_the_option() -> None:
    with pytest.raises(ConfigError, match=r"^a command-line option \(slots.count\): .*"
                                          r"\$.slots.count`$"):
        load_config(environ={"CONVEYOR_SLOTS__COUNT": "4"}, overrides={"slots": {"count": 0}})


@pytest.mark.parametrize(("name", "value", "at"), [
    ("CONVEYOR_BALANCER__QUEUES", '[0, "x"]', r"\$.balancer.queues\[1\]"),
    ("CONVEYOR_CELLS__SIZES", '{"a": 0}', r"\$.cells.sizes\[...\]"),
    ("CONVEYOR_TELEMETRY__HEADERS", '{"a": 1}', r"\$.telemetry.headers\[...\]"),
])
def test_a_bad_item_of_a_list_or_table_names_the_variable_that_set_it(
    tmp_path: Path, name: str, value: str, at: str
) -> None:
    path = write(tmp_path, "[worker]\nmax_batch = 5\n")
    for where in (None, path):  # neither "defaults" nor the file is at fault
        with pytest.raises(ConfigError, match=rf"^environment variable {name}: .* - at `{at}`$"):
            load_config(where, environ={name: value})


@pytest.mark.parametrize(("kafka", "says"), [
    # Settings the protocol does not use: plain text, or no login, without a word.
    ({"ssl_cafile": "/etc/ca.pem"}, "$.kafka.ssl_cafile: set, but "
     "$.kafka.security_protocol is 'PLAINTEXT' (no TLS), so it would not be used"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_username": "u",
      "ssl_certfile": "/etc/c.pem"}, "$.kafka.ssl_certfile: set, but"),
    ({"sasl_username": "u"}, "$.kafka.sasl_username: set, but $.kafka.security_protocol "
     "is 'PLAINTEXT' (no SASL), so no login would happen"),
    ({"security_protocol": "SSL", "sasl_username": "u"}, "is 'SSL' (no SASL)"),
])
def test_kafka_security_settings_the_protocol_would_not_use_are_refused(
    kafka: dict[str, str], says: str,
) -> None:
    environ = {"CONVEYOR_QUEUES__ADAPTER": "kafka",
               **{f"CONVEYOR_KAFKA__{k.upper()}": v for k, v in kafka.items()}}
    with pytest.raises(ConfigError) as caught:
        load_config(environ=environ)
    assert says in str(caught.value)


def test_kafka_security_settings_of_an_unused_kafka_section_are_no_error() -> None:
    config = load_config(environ={"CONVEYOR_KAFKA__SASL_USERNAME": "u"})  # memory adapter
    assert config.kafka.sasl_username == "u"


@pytest.mark.parametrize(("text", "field"), [
    ('[redis]\ntls_verify = "0"\n', "$.redis.tls_verify"),  # read as false: TLS unchecked
    ('[queues]\ntotal = "8"\n', "$.queues.total"),
    ('[worker]\ndrain_timeout_s = "30"\n', "$.worker.drain_timeout_s"),
])
def test_a_number_or_boolean_in_quotes_in_the_file_is_refused_naming_it(
        tmp_path: Path, text: str, field: str) -> None:
    """The final conversion is lax (environment values are text), so a file's quoted
    ``tls_verify = "0"`` read as false — verification off without a word. A file's
    value in quotes where a number or a boolean belongs is refused; the same text from
    the environment is still read as the field's type."""
    with pytest.raises(ConfigError, match=rf"{re.escape(field)}` \(in quotes, a TOML value "
                                          r"is text: write it without them\)"):
        load_config(write(tmp_path, text), environ={})
    section, name = field[2:].split(".")
    value = text.split("= ")[1].strip().strip('"')
    config = load_config(environ={f"CONVEYOR_{section.upper()}__{name.upper()}": value})
    assert str(getattr(getattr(config, section), name)).lower() in {value, "false", value + ".0"}


@pytest.mark.parametrize(("text", "field"), [
    ("[queues]\ntotal = 8.0\n", "$.queues.total"),
    ("[slots]\ncount = 16.0\n", "$.slots.count"),
    ("[http]\nport = 9464.0\n", "$.http.port"),  # int | None
    ('[balancer]\nkind = "static"\nqueues = [0, 1e0]\n', "$.balancer.queues[1]"),
    ("[cells.sizes]\nshop = 2.0\n", "$.cells.sizes.shop"),
])
def test_a_number_with_a_fraction_where_a_whole_number_belongs_is_refused_naming_it(
        tmp_path: Path, text: str, field: str) -> None:
    """The final conversion is lax (environment values are text), so ``total = 8.0``
    read as 8 without a word, while ``8.5`` was refused: a whole number is refused
    unless written as one, from the file and from the environment alike."""
    with pytest.raises(ConfigError, match=rf"^\S+: Expected a whole number, got 1?[0-9.e]+ - "
                                          rf"at `{re.escape(field)}`$"):
        load_config(write(tmp_path, text), environ={})
    assert load_config(write(tmp_path, text.replace(".0", "").replace("1e0", "1")),
                       environ={}) is not None


@pytest.mark.parametrize(("name", "value"), [
    ("CONVEYOR_QUEUES__TOTAL", "8.0"),
    ("CONVEYOR_QUEUES__TOTAL", "8e0"),
    ("CONVEYOR_QUEUES", '{"total": 8.0}'),
    ("CONVEYOR_HTTP__PORT", "9464.0"),
])
def test_a_whole_number_with_a_fraction_from_the_environment_is_refused_naming_it(
        name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"^environment variable {name}: Expected a whole "
                                          r"number, got .* - at `\$\.\w+\.\w+`$"):
        load_config(environ={name: value})


@pytest.mark.parametrize(("text", "message"), [
    ("[balancer]\nqueues = [0, 1]\n",  # the dynamic balancer: ignored
     r"\$.balancer.queues: only the static balancer owns named queues; with kind = "
     r"'dynamic' they would be ignored"),
    ('[balancer]\nkind = "static"\nqueues = [0, 1, 1]\n',
     r"\$.balancer.queues: queues \[1\] are named more than once"),
    ('[slots]\npath = "conveyor.examples.custom_slots:PacedSlotSupplier"\n',
     r"\$.slots.path: only a custom slot supplier is built from a path; with kind = "
     r"'fixed' it would be ignored"),
])
def test_a_setting_its_kind_would_ignore_is_refused(tmp_path: Path, text: str,
                                                     message: str) -> None:
    """A daemon that ignored a setting without a word ran otherwise than its operator
    wrote: ``queues`` under a balancer that splits queues itself, a supplier's ``path``
    under a kind that builds none."""
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text), environ={})
    fixed = text.replace("[0, 1, 1]", "[0, 1]").replace(
        "[balancer]\nqueues", '[balancer]\nkind = "static"\nqueues').replace(
        "[slots]\n", '[slots]\nkind = "custom"\n')
    load_config(write(tmp_path, fixed), environ={})  # as the message says: accepted
