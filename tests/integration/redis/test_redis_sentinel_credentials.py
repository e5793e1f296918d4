"""Credentials under ``[redis] mode = "sentinel"``: the sentinels' own password
(``sentinel_password_env``) and the data nodes' (``password_env``), against sentinels and
data nodes that each require theirs (``redis_sentinel_with_passwords``).

A password either side refuses is the config's mistake, not an outage: a config error
naming the field that holds it (exit 2, one line, at once, the password never shown).
The sentinels' refusal read "the sentinels named no primary" and was retried for
``retry_max_s`` as an outage, then exited 1.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.integration.redis.conftest import REPO, write_config
from tests.servers import SENTINEL_SERVICE, RedisSentinelServers
from tests.servers.sentinel import DATA_PASSWORD, SENTINEL_PASSWORD

pytestmark = [pytest.mark.redis, pytest.mark.redis_sentinel]

RETRY_MAX_S = 15.0
"""Long enough that an error retried as an outage shows in the time taken."""

COMMANDS = [["publish", "items", "k", "{}"], ["status"], ["worker", "tests.apps.recorder:app"]]

WRONG = "not-the-password"


def conveyor(cfg: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conveyor.cli", *args, "--config", str(cfg)],
                          cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def sentinel_config(path: Path, servers: RedisSentinelServers, *,
                    sentinels: list[str] | None = None, **fields: str) -> Path:
    """``fields``: more of ``[redis]`` (``sentinel_password_env = ""``, say)."""
    return write_config(path, "redis:///0", redis={
        "mode": "sentinel", "sentinels": servers.addresses if sentinels is None else sentinels,
        "sentinel_service": SENTINEL_SERVICE, "retry_max_s": RETRY_MAX_S,
        "password_env": "SHOP_REDIS_PASSWORD",
        "sentinel_password_env": "SHOP_SENTINEL_PASSWORD", **fields})


def assert_config_error(result: subprocess.CompletedProcess[str], took_s: float,
                        start: str) -> str:
    """Exit 2, one line starting ``start``, no password, before any retry gave up."""
    assert result.returncode == 2, result.stderr
    [error] = result.stderr.splitlines()
    assert error.startswith(start), error
    for secret in (WRONG, DATA_PASSWORD, SENTINEL_PASSWORD):
        assert secret not in result.stdout + result.stderr
    assert took_s < RETRY_MAX_S, f"took {took_s:.1f}s: retried as an outage"
    return error


SENTINELS_REFUSED = ("conveyor: error: config: $.redis.sentinel_password_env: the sentinels "
                     "refused the credentials (")
SENTINELS_HINT = ("give the sentinels' own password (their requirepass) in the variable "
                  "sentinel_password_env names, and their user, if any, in the one "
                  "sentinel_username_env names; the data nodes' are username_env / "
                  "password_env")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_wrong_sentinel_password_is_a_config_error_on_its_field(
        redis_sentinel_with_passwords: RedisSentinelServers, tmp_path: Path,
        command: list[str]) -> None:
    servers = redis_sentinel_with_passwords
    cfg = sentinel_config(tmp_path / "c.toml", servers)
    started = time.monotonic()
    result = conveyor(cfg, *command, env={"SHOP_SENTINEL_PASSWORD": WRONG,
                                          "SHOP_REDIS_PASSWORD": DATA_PASSWORD})
    error = assert_config_error(result, time.monotonic() - started, SENTINELS_REFUSED)
    assert (f"({', '.join(servers.addresses)}: invalid username-password pair or user is "
            "disabled; the password in SHOP_SENTINEL_PASSWORD (sentinel_password_env) was "
            "sent, while ") in error, error
    assert error.endswith(SENTINELS_HINT), error


@pytest.mark.parametrize(("fields", "env", "sent"), [
    ({"sentinel_password_env": ""}, {},
     "no password was sent: sentinel_password_env is empty"),
    ({}, {"SHOP_SENTINEL_PASSWORD": ""},
     "no password was sent: SHOP_SENTINEL_PASSWORD (sentinel_password_env) is unset or "
     "empty"),
    ({"sentinel_username_env": "SHOP_SENTINEL_USER"},
     {"SHOP_SENTINEL_PASSWORD": WRONG, "SHOP_SENTINEL_USER": "default"},
     "the password in SHOP_SENTINEL_PASSWORD (sentinel_password_env) was sent, the user in "
     "SHOP_SENTINEL_USER (sentinel_username_env) was sent"),
], ids=["no-field", "variable-empty", "with-a-user"])
def test_what_was_sent_to_sentinels_that_refused_is_said(
        redis_sentinel_with_passwords: RedisSentinelServers, tmp_path: Path,
        fields: dict[str, str], env: dict[str, str], sent: str) -> None:
    """The common slip: the data nodes' password given, the sentinels' forgotten."""
    cfg = sentinel_config(tmp_path / "c.toml", redis_sentinel_with_passwords, **fields)
    started = time.monotonic()
    result = conveyor(cfg, "status", env={**env, "SHOP_REDIS_PASSWORD": DATA_PASSWORD})
    error = assert_config_error(result, time.monotonic() - started, SENTINELS_REFUSED)
    assert f"; {sent}, while " in error, error
    assert error.endswith(SENTINELS_HINT), error


def test_a_wrong_primary_password_is_a_config_error_on_the_url(
        redis_sentinel_with_passwords: RedisSentinelServers, tmp_path: Path) -> None:
    """The sentinels let us in and name the primary; the primary refuses: the data
    nodes' credentials (url, username_env / password_env), not the sentinels'."""
    cfg = sentinel_config(tmp_path / "c.toml", redis_sentinel_with_passwords)
    started = time.monotonic()
    result = conveyor(cfg, "status", env={"SHOP_SENTINEL_PASSWORD": SENTINEL_PASSWORD,
                                          "SHOP_REDIS_PASSWORD": WRONG})
    error = assert_config_error(
        result, time.monotonic() - started,
        "conveyor: error: config: $.redis.url: the server refused the credentials (")
    assert "sentinel" not in error, error


def test_the_right_passwords_reach_the_primary(
        redis_sentinel_with_passwords: RedisSentinelServers, tmp_path: Path) -> None:
    servers = redis_sentinel_with_passwords
    cfg = sentinel_config(tmp_path / "c.toml", servers)
    env = {"SHOP_SENTINEL_PASSWORD": SENTINEL_PASSWORD, "SHOP_REDIS_PASSWORD": DATA_PASSWORD}
    published = conveyor(cfg, "publish", "items", "right-passwords", "{}", env=env)
    assert published.returncode == 0, published.stderr
    primary = servers.node(servers.primary()[1]).admin()
    streams = [key for key in primary.scan_iter("t:*") if primary.type(key) == "stream"]
    entries = [fields for key in streams for _, fields in primary.xrange(key)]
    assert any("right-passwords" in fields.values() for fields in entries), entries


def test_sentinels_that_refuse_are_a_config_error_though_another_is_down(
        redis_sentinel_with_passwords: RedisSentinelServers, tmp_path: Path) -> None:
    """One sentinel out of reach does not make the others' refusal an outage."""
    servers = redis_sentinel_with_passwords
    down = f"127.0.0.1:{free_port()}"
    cfg = sentinel_config(tmp_path / "c.toml", servers,
                          sentinels=[down, *servers.addresses])
    started = time.monotonic()
    result = conveyor(cfg, "status", env={"SHOP_SENTINEL_PASSWORD": WRONG,
                                          "SHOP_REDIS_PASSWORD": DATA_PASSWORD})
    error = assert_config_error(result, time.monotonic() - started, SENTINELS_REFUSED)
    assert (f"({', '.join(servers.addresses)}: invalid username-password pair") in error, error
    assert down not in error, error
