from pathlib import Path

import pytest

from conveyor.platform.config import load_config
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
        "CONVEYOR_REDIS__PREFIX": "[x]",
    })
    assert config.kafka.topic == "123"
    assert config.memory.broker == "true"
    assert config.redis.prefix == "[x]"


def test_environment_scalars_are_read_as_the_fields_type() -> None:
    config = load_config(environ={
        "CONVEYOR_REDIS__TLS_VERIFY": "false",
        "CONVEYOR_WORKER__DRAIN_TIMEOUT_S": "2.5",
        "CONVEYOR_CELLS__DEFAULT_SIZE": "6",
        "CONVEYOR_BALANCER__QUEUES": "[0, 3]",
        "CONVEYOR_TELEMETRY__HEADERS": '{"api-key": "k"}',
    })
    assert config.redis.tls_verify is False
    assert config.worker.drain_timeout_s == 2.5
    assert config.cells.default_size == 6
    assert config.balancer.queues == [0, 3]
    assert config.telemetry.headers == {"api-key": "k"}
    with pytest.raises(ConfigError, match="CONVEYOR_BALANCER__QUEUES: expected JSON"):
        load_config(environ={"CONVEYOR_BALANCER__QUEUES": "0,3"})


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
    from conveyor.workers.supervisor import env_for_overrides

    overrides = {"slots": {"count": 4}, "worker": {"drain_timeout_s": 2.5},
                 "kafka": {"topic": "orders"}, "redis": {"tls_verify": False},
                 "balancer": {"queues": [0, 1], "kind": "static"}}
    config = load_config(environ=env_for_overrides(overrides))
    assert load_config(environ={}, overrides=overrides) == config
    assert config.kafka.topic == "orders" and config.slots.count == 4
