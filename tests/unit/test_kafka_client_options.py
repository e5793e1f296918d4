"""SASL and SSL options pass from ``[kafka]`` to aiokafka; secrets come only from env.

Each case builds the options the adapter gives every client, then hands them to
aiokafka's own client constructor, which rejects combinations it cannot use (PLAIN
without a password, SSL without a context). No broker is needed for that.
"""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
from aiokafka.client import AIOKafkaClient

from conveyor.adapters.kafka import KafkaAdapter
from conveyor.adapters.kafka.connection import client_options
from conveyor.backends import command_adapter, for_commands, for_config
from conveyor.platform.config import KafkaConfig, load_config
from conveyor.platform.errors import ConfigError
from tests.conftest import server_missing

PASSWORD = "s3cret-Pa55word"  # test values, checked never to be printed
KEY_PASSWORD = "k3y-Pa55"


def kafka_section(**fields: Any) -> KafkaConfig:
    """The [kafka] section as the config loader builds it (validation included)."""
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "kafka"}, "kafka": {"bootstrap": "b1:9093,b2:9093", **fields},
    })
    return config.kafka


async def accepted_by_aiokafka(opts: dict[str, Any]) -> AIOKafkaClient:
    return AIOKafkaClient(**opts)  # raises ValueError on an unusable combination


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A self-signed certificate and its key, encrypted with KEY_PASSWORD."""
    out = tmp_path_factory.mktemp("certs")
    cert, key = out / "client.pem", out / "client.key"
    try:
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-days", "1", "-subj",
             "/CN=conveyor-test", "-keyout", str(key), "-out", str(cert),
             "-passout", f"pass:{KEY_PASSWORD}"],
            check=True, capture_output=True, timeout=60,
        )
    except (OSError, subprocess.CalledProcessError):
        server_missing("openssl")
    return {"cert": cert, "key": key}


async def test_a_commands_clients_wait_command_timeout_ms_and_a_daemons_aiokafkas_40_s(
) -> None:
    """The default read, not waited for: a command's requests wait 10 s for an answer,
    as a Redis call is retried for ``[redis] retry_max_s``; a daemon's keep aiokafka's
    own 40 s (a JoinGroup is answered only once every member has re-joined)."""
    config = load_config(None, environ={}, overrides={"queues": {"adapter": "kafka"}})
    assert config.kafka.command_timeout_ms == 10_000 == config.redis.retry_max_s * 1000
    command = command_adapter(config)
    daemon = for_config(config).adapter(config)
    assert isinstance(command, KafkaAdapter) and isinstance(daemon, KafkaAdapter)
    assert command.cluster.options["request_timeout_ms"] == 10_000
    assert for_commands(config).adapter(config).cluster.options == command.cluster.options
    assert (await accepted_by_aiokafka(command.cluster.options))._request_timeout_ms == 10_000
    assert (await accepted_by_aiokafka(daemon.cluster.options))._request_timeout_ms == 40_000


async def test_plaintext_passes_no_credentials() -> None:
    opts = client_options(kafka_section())
    assert opts == {"bootstrap_servers": "b1:9093,b2:9093", "client_id": "conveyor",
                    "security_protocol": "PLAINTEXT"}
    await accepted_by_aiokafka(opts)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_sasl_takes_the_password_from_the_variable_the_config_names(
    monkeypatch: pytest.MonkeyPatch, mechanism: str
) -> None:
    monkeypatch.setenv("MY_KAFKA_SECRET", PASSWORD)
    cfg = kafka_section(security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                        sasl_username="svc", sasl_password_env="MY_KAFKA_SECRET")
    opts = client_options(cfg)
    assert opts["sasl_mechanism"] == mechanism
    assert opts["sasl_plain_username"] == "svc"
    assert opts["sasl_plain_password"] == PASSWORD
    assert "ssl_context" not in opts
    assert PASSWORD not in repr(cfg), "the config holds the variable's name, not the secret"
    await accepted_by_aiokafka(opts)


def test_a_missing_password_variable_is_named_and_nothing_secret_is_printed(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MY_KAFKA_SECRET", raising=False)
    monkeypatch.setenv("CONVEYOR_KAFKA_PASSWORD", PASSWORD)  # the default name: not used
    cfg = kafka_section(security_protocol="SASL_SSL", sasl_username="svc",
                        sasl_password_env="MY_KAFKA_SECRET")
    with pytest.raises(ConfigError, match="'MY_KAFKA_SECRET'") as err:
        client_options(cfg)
    assert PASSWORD not in str(err.value)
    with pytest.raises(ConfigError, match="MY_KAFKA_SECRET"):
        KafkaAdapter(cfg, 1)  # the adapter checks at construction, before any connection


def test_a_missing_sasl_username_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR_KAFKA_PASSWORD", PASSWORD)
    with pytest.raises(ConfigError, match=r"\$\.kafka\.sasl_username is empty") as err:
        client_options(kafka_section(security_protocol="SASL_PLAINTEXT"))
    assert PASSWORD not in str(err.value)


async def test_ssl_builds_a_context_from_the_files_and_the_env_key_password(
    monkeypatch: pytest.MonkeyPatch, certs: dict[str, Path]
) -> None:
    monkeypatch.setenv("MY_KEY_PASSWORD", KEY_PASSWORD)
    cfg = kafka_section(security_protocol="SSL", ssl_cafile=str(certs["cert"]),
                        ssl_certfile=str(certs["cert"]), ssl_keyfile=str(certs["key"]),
                        ssl_key_password_env="MY_KEY_PASSWORD")
    opts = client_options(cfg)
    context = opts["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert len(context.get_ca_certs()) == 1  # ssl_cafile was loaded
    assert "sasl_plain_password" not in opts
    await accepted_by_aiokafka(opts)


async def test_sasl_ssl_passes_both(
    monkeypatch: pytest.MonkeyPatch, certs: dict[str, Path]
) -> None:
    monkeypatch.setenv("CONVEYOR_KAFKA_PASSWORD", PASSWORD)
    cfg = kafka_section(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                        sasl_username="svc", ssl_cafile=str(certs["cert"]))
    opts = client_options(cfg)
    assert isinstance(opts["ssl_context"], ssl.SSLContext)
    assert (opts["sasl_mechanism"], opts["sasl_plain_password"]) == ("SCRAM-SHA-512", PASSWORD)
    await accepted_by_aiokafka(opts)


def test_a_wrong_key_password_is_a_config_error_without_the_secrets(
    monkeypatch: pytest.MonkeyPatch, certs: dict[str, Path]
) -> None:
    wrong = "not-the-key-Pa55"
    monkeypatch.setenv("MY_KEY_PASSWORD", wrong)
    monkeypatch.setenv("CONVEYOR_KAFKA_PASSWORD", PASSWORD)
    cfg = kafka_section(security_protocol="SASL_SSL", sasl_username="svc",
                        ssl_certfile=str(certs["cert"]), ssl_keyfile=str(certs["key"]),
                        ssl_key_password_env="MY_KEY_PASSWORD")
    with pytest.raises(ConfigError, match="ssl_keyfile=") as err:
        client_options(cfg)
    message = str(err.value)
    assert wrong not in message and PASSWORD not in message and KEY_PASSWORD not in message
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_a_key_password_variable_that_is_not_set_is_named(
    monkeypatch: pytest.MonkeyPatch, certs: dict[str, Path]
) -> None:
    monkeypatch.delenv("MY_KEY_PASSWORD", raising=False)
    cfg = kafka_section(security_protocol="SSL", ssl_certfile=str(certs["cert"]),
                        ssl_keyfile=str(certs["key"]), ssl_key_password_env="MY_KEY_PASSWORD")
    with pytest.raises(ConfigError, match="'MY_KEY_PASSWORD' is not set"):
        client_options(cfg)
