"""A Redis URL is checked before any connection: one-line ConfigErrors, secrets masked."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from conveyor.adapters.redis.connections import connect
from conveyor.adapters.redis.urls import check_url
from conveyor.cli import main
from conveyor.platform.config import load_config
from conveyor.platform.errors import ConfigError

SECRET = "s3cret-pw"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (f"redis://u:{SECRET}@h:6379/0?nope=1", "unknown option 'nope'"),
        (f"redis://h:6379/0?password={SECRET}&ssl=true", "unknown option 'ssl'"),
        ("redis://h/0?socket_timeout=1", "set 'socket_timeout' as [redis] socket_timeout_s"),
        ("redis://h/0?retry_on_timeout=true", "as [redis] retry_max_s"),
        ("rediss://h/0?ssl_cert_reqs=none", "as [redis] tls_verify"),
        ("redis://h?db=zero", "the db option is a database number"),
        ("redis://h:6379/zero", "the path is a database number"),
        # SELECT takes a 32-bit number: past it the server's refusal, met only once
        # running, was "value is not an integer or out of range" (exit 1).
        ("redis://h:6379/99999999999999999999", "database 99999999999999999999 is more "
                                                "than any Redis server numbers"),
        ("redis://h?db=2147483648", "database 2147483648 is more than any Redis server"),
        # Digits of other scripts: str.isdigit took them, int() read an Arabic-Indic 3
        # as database 3, and a superscript two failed as a ValueError traceback.
        ("redis://h:6379/%D9%A3", "the path is a database number"),
        ("redis://h?db=%C2%B2", "the db option is a database number"),
        ("redis://h/0?health_check_interval=%C2%B2", "health_check_interval is whole seconds"),
        (f"redis://u:{SECRET}@h:99999/0", "not a valid URL"),
        (f"redis://u:{SECRET}@h:port/0", "not a valid URL"),
        ("http://h:6379/0", "expected redis:// or rediss://"),
        ("unix:///tmp/redis.sock", "expected redis:// or rediss://"),
        # Values redis-py passes on, for the server or the connection to fail on later.
        ("redis://h/0?health_check_interval=-5", "health_check_interval is whole seconds"),
        ("redis://h/0?health_check_interval=1.5", "health_check_interval is whole seconds"),
        ("redis://h/0?client_name=my%20app", "client_name is printable ASCII"),
        ("redis://h/0?client_name=a%0Ab", "client_name is printable ASCII"),
        ("redis://h/0?socket_keepalive=off", "socket_keepalive is true or false"),  # on!
        ("redis://h/0?socket_keepalive=", "socket_keepalive is true or false"),
        # A setting given twice: redis-py would keep one without a word.
        ("redis://h:6379/1?db=2", "the database is given twice, as the path (/1) and as "
                                  "?db=; give it once"),
        ("redis://h/0?db=", "the database is given twice"),
        ("redis://h?db=1&db=2", "option 'db' is given more than once, give it once"),
        ("redis://h/0?client_name=a&client_name=b", "option 'client_name' is given more"),
        (f"redis://h/0?password={SECRET}&password=x", "option 'password' is given more"),
        (f"redis://u:{SECRET}@h/0?password={SECRET}", "the password is given twice, "
                                                      "before the host and as ?password="),
        ("redis://u@h/0?username=v", "the username is given twice"),
        # Read by redis-py as another server, without a word: localhost:6379 for port 0;
        # for a '/', '?' or '#' in a password, the host before it (here localhost:99).
        ("redis://h:0/0", "port 0 is no server's port"),
        ("redis://h:6380/0#primary", "a '#' ends a URL, and redis-py drops what follows"),
        (f"redis://:99#{SECRET}@h:6380/0", "a '/', '?' or '#' in the password ends the "
                                           "host part before its '@'"),
        (f"redis://u:99/{SECRET}@h:6380/0", "write them percent-encoded (%2F, %3F, %23)"),
        (f"redis://u:99?{SECRET}@h:6380/0", "got redis://***@h:6380/0"),
        (f"redis://u:{SECRET}/x@h:6380/0", "got redis://***@h:6380/0"),
    ],
)
def test_a_bad_url_is_a_config_error_naming_the_field_without_the_password(
    url: str, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        check_url(url)
    text = str(caught.value)
    assert text.startswith("$.redis.url: ") and message in text
    assert SECRET not in text and "\n" not in text


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/0",
    "rediss://user@h:6380/2?client_name=shop&health_check_interval=10",
    "redis://h/0?client_name=shop.v2-a_b&health_check_interval=0",
    f"redis://:{SECRET}@h/0?socket_keepalive=true&username=u",
    "redis://h",
    "redis://h/?db=3",
    "redis://h/0?socket_keepalive=False", "redis://h/0?socket_keepalive=1",
    f"redis://u@h/0?password={SECRET}",
    "redis://h/0?client_name=shop@eu",
    f"redis://u:{SECRET}%23%2F%3F@h:6380/0",
])
def test_urls_with_known_options_pass(url: str) -> None:
    check_url(url)


def test_connect_checks_the_url_before_any_connection() -> None:
    # A config built in code skips loading; the adapter checks the URL all the same.
    redis = msgspec.structs.replace(load_config(environ={}).redis,
                                    url=f"redis://u:{SECRET}@127.0.0.1:1/0?nope=1")
    with pytest.raises(ConfigError, match=r"\$.redis.url: unknown option 'nope' in "
                                          r"redis://u:\*\*\*@127.0.0.1:1/0\?nope=1"):
        connect(redis)


def test_a_bad_url_in_a_config_file_fails_at_load_naming_the_file_and_the_field(
    tmp_path: Path,
) -> None:
    file = tmp_path / "redis.toml"
    file.write_text(f'[queues]\nadapter = "redis"\n[balancer]\nmembership = "redis"\n'
                    f'[redis]\nurl = "htp://u:{SECRET}@x"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(file, environ={})
    assert str(caught.value) == (f"{file}: $.redis.url: expected redis:// or rediss://, "
                                 "got htp://u:***@x")
    with pytest.raises(ConfigError, match=r"^environment variable CONVEYOR_REDIS__URL: "
                                          r"\$.redis.url: the path is a database number"):
        load_config(environ={"CONVEYOR_REDIS__URL": "redis://h/zero",
                             "CONVEYOR_QUEUES__ADAPTER": "redis",
                             "CONVEYOR_BALANCER__MEMBERSHIP": "redis"})


def test_the_cli_refuses_a_database_given_twice_as_a_bad_config(tmp_path: Path) -> None:
    file = tmp_path / "redis.toml"
    file.write_text('[queues]\nadapter = "redis"\n[balancer]\nmembership = "redis"\n'
                    '[redis]\nurl = "redis://127.0.0.1:1/1?db=2"\n')
    result = CliRunner().invoke(main, ["status", "--config", str(file)], env={})
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"conveyor: error: config: {file}: $.redis.url: the database is given twice, as "
        "the path (/1) and as ?db=; give it once (redis://127.0.0.1:1/1?db=2)\n")


def test_the_cli_refuses_a_20_digit_database_as_a_bad_config_naming_the_url(
    tmp_path: Path,
) -> None:
    file = tmp_path / "redis.toml"
    file.write_text('[queues]\nadapter = "redis"\n[balancer]\nmembership = "redis"\n'
                    '[redis]\nurl = "redis://127.0.0.1:1/99999999999999999999"\n')
    result = CliRunner().invoke(main, ["worker", "tests.apps.drain_app:app", "--config",
                                       str(file)], env={})
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(f"conveyor: error: config: {file}: $.redis.url: database "
                           "99999999999999999999 is more than any Redis server numbers"), line


def test_redis_membership_checks_the_url_too() -> None:
    with pytest.raises(ConfigError, match=r"\$.redis.url: expected redis://"):
        load_config(environ={"CONVEYOR_REDIS__URL": "unix:///tmp/r.sock",
                             "CONVEYOR_QUEUES__ADAPTER": "kafka",
                             "CONVEYOR_BALANCER__MEMBERSHIP": "redis"})


@pytest.mark.parametrize("adapter", ["memory", "kafka"])
def test_an_unused_redis_url_is_no_error(adapter: str) -> None:
    # A shell's CONVEYOR_REDIS__URL (say, a unix socket for another tool) must not stop
    # a kafka or embedded config from loading: nothing connects to it.
    config = load_config(environ={"CONVEYOR_REDIS__URL": "unix:///tmp/r.sock",
                                  "CONVEYOR_QUEUES__ADAPTER": adapter})
    assert config.redis.url == "unix:///tmp/r.sock"


@pytest.mark.parametrize("url", ["redis://h:7000/1", "redis://h:7000?db=2"])
def test_a_cluster_url_naming_a_database_other_than_0_is_refused(url: str) -> None:
    check_url(url)  # fine for one server
    with pytest.raises(ConfigError, match=r"^\$.redis.url: a Redis Cluster has database 0 only"):
        check_url(url, cluster=True)


@pytest.mark.parametrize("url", ["redis://h:7000/0", "redis://h:7000", "redis://h:7000/"])
def test_a_cluster_url_on_database_0_passes(url: str) -> None:
    check_url(url, cluster=True)


@pytest.mark.parametrize(("url", "tls", "says"), [
    # The scheme alone turns TLS on: with redis:// the files were ignored, the
    # connection plain text, and nothing said so.
    ("redis://h/0", {"TLS_CA_FILE": "/etc/ca.pem"}, "$.redis.tls_ca_file: set, but "
     "$.redis.url is not rediss:// (TLS), so it would not be used and the connection "
     "would be plain text; use rediss://, or remove it"),
    ("redis://h/0", {"TLS_CERT_FILE": "/etc/c.pem"}, "$.redis.tls_cert_file: set, but"),
    ("rediss://h/0", {"TLS_KEY_FILE": "/etc/k.pem"}, "$.redis.tls_key_file: the key of a "
     "client certificate, but $.redis.tls_cert_file is empty; set both, or neither"),
])
def test_tls_files_that_would_not_be_used_are_a_config_error(
    url: str, tls: dict[str, str], says: str,
) -> None:
    environ = {"CONVEYOR_QUEUES__ADAPTER": "redis", "CONVEYOR_BALANCER__MEMBERSHIP": "redis",
               "CONVEYOR_REDIS__URL": url,
               **{f"CONVEYOR_REDIS__{name}": value for name, value in tls.items()}}
    with pytest.raises(ConfigError) as caught:
        load_config(environ=environ)
    assert says in str(caught.value)


def test_tls_files_with_rediss_pass() -> None:
    config = load_config(environ={
        "CONVEYOR_QUEUES__ADAPTER": "redis", "CONVEYOR_BALANCER__MEMBERSHIP": "redis",
        "CONVEYOR_REDIS__URL": "rediss://h/0", "CONVEYOR_REDIS__TLS_CA_FILE": "/etc/ca.pem",
        "CONVEYOR_REDIS__TLS_CERT_FILE": "/etc/c.pem"})
    assert config.redis.tls_cert_file == "/etc/c.pem"
