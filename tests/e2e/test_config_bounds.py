"""Bad config values, as TOML and as CONVEYOR_* variables, through the real CLI.

Each one exits 2 with one line on stderr naming the field's path (or the variable), and
no traceback. A config error is found before anything connects, so each run is quick.
``conveyor worker`` reads the TOML cases, ``conveyor status`` the environment ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONVEYOR = str(Path(sys.executable).parent / "conveyor")
APP = "tests/apps/drain_app.py:app"
SECRET = "s3cret-pw"

# field path, the bad value as TOML, the same as an environment variable's text
BOUNDS = [
    ("$.queues.total", "1000000", "1000000"),
    ("$.balancer.rebalance_interval_s", "1e-300", "1e-300"),
    ("$.balancer.lease_ttl_s", "inf", "inf"),
    ("$.telemetry.metrics_interval_s", "nan", "nan"),
    ("$.worker.drain_timeout_s", "-1.0", "-1"),
    ("$.kafka.topic", '""', ""),
    ("$.kafka.topic", '"a\\nb"', "a\nb"),
    ("$.kafka.topic", '"../x"', "../x"),
    ("$.kafka.topic", f'"{"t" * 240}"', "t" * 240),
    ("$.redis.prefix", '"conveyor\\n"', "conveyor\n"),
    ("$.kafka.bootstrap", '"host:port"', "host:port"),
]


def conveyor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    return subprocess.run([CONVEYOR, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**clean, **(env or {})}, timeout=60)


def assert_one_line_naming(result: subprocess.CompletedProcess[str], name: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert name in result.stderr, result.stderr


@pytest.mark.parametrize(("path", "toml", "env"), BOUNDS)
def test_a_bad_value_in_a_file_stops_the_worker_naming_the_field(
    tmp_path: Path, path: str, toml: str, env: str
) -> None:
    section, _, field = path[2:].rpartition(".")
    config = tmp_path / "bad.toml"
    config.write_text(f"[{section}]\n{field} = {toml}\n")
    assert_one_line_naming(conveyor("worker", APP, "--config", str(config)), path)


@pytest.mark.parametrize(("path", "toml", "env"), BOUNDS)
def test_a_bad_value_in_the_environment_stops_status_naming_the_field(
    path: str, toml: str, env: str
) -> None:
    variable = "CONVEYOR_" + path[2:].upper().replace(".", "__")
    assert_one_line_naming(conveyor("status", "--app", "shop", env={variable: env}), path)


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"CONVEYOR_BALANCER__QUEUES": "[" * 60_000 + "]" * 60_000},
         "CONVEYOR_BALANCER__QUEUES: JSON nested too deeply"),
        ({"CONVEYOR_WORKER": '{"drain_timeout_s": '}, "CONVEYOR_WORKER: expected JSON"),
        ({"CONVEYOR_WORKER": "5"}, "CONVEYOR_WORKER: $.worker is a section"),
        ({"CONVEYOR_WORKER": '{"drain_timeout_s": -1}'}, "$.worker.drain_timeout_s"),
        ({"CONVEYOR_BALANCER": '{"weights": {"cpu_usage": 0, "memory_usage": 0, '
                               '"available_memory": 0}}'}, "$.balancer.weights"),
    ],
)
def test_a_bad_variable_is_named_in_one_line(env: dict[str, str], name: str) -> None:
    assert_one_line_naming(conveyor("worker", APP, env=env), name)


def test_a_redis_url_with_an_unknown_option_is_named_without_its_password(
    tmp_path: Path,
) -> None:
    config = tmp_path / "redis.toml"
    config.write_text('[queues]\nadapter = "redis"\n[balancer]\nmembership = "redis"\n'
                      f'[redis]\nurl = "redis://u:{SECRET}@127.0.0.1:1/0?nope=1"\n')
    for args in (["worker", APP], ["status", "--app", "shop"]):
        result = conveyor(*args, "--config", str(config))
        assert_one_line_naming(result, "$.redis.url: unknown option 'nope'")
        assert SECRET not in result.stderr
