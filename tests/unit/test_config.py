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
