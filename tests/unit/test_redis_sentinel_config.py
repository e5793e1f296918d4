"""``[redis] mode = "sentinel"``: what the config accepts, and the client it makes
(inspected before any connection; tests/contract and the failover tests run it)."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.adapters.redis.connections import SentinelClient, close, connect
from conveyor.adapters.redis.urls import sentinel_addresses, server_name
from conveyor.platform.config import load_config
from conveyor.platform.errors import ConfigError

SENTINELS = ["10.0.0.1:26379", "sentinel-2", "[::1]:26380"]


def sentinel_config(environ: dict[str, str] | None = None, **redis: Any) -> Any:
    return load_config(None, environ=environ or {}, overrides={"redis": {
        "mode": "sentinel", "url": "redis:///2", "sentinels": SENTINELS, **redis}})


@pytest.mark.parametrize(("redis", "message"), [
    ({"sentinels": []}, r'\$.redis.sentinels: mode = "sentinel" needs the sentinels'),
    ({"sentinels": ["h:0"]}, r"\$.redis.sentinels\[0\]: expected HOST\[:PORT\]"),
    ({"sentinels": ["h:1", "h:26379,h2:26379"]}, r"\$.redis.sentinels\[1\]: expected"),
    ({"sentinels": ["h:99999"]}, r"\$.redis.sentinels\[0\]: expected"),
    ({"sentinel_service": "my master"}, r"\$.redis.sentinel_service: the name"),
    ({"sentinel_service": ""}, r"\$.redis.sentinel_service: the name"),
    ({"sentinel_password_env": "NOT-A-NAME"}, r"\$.redis.sentinel_password_env: expected"),
])
def test_a_bad_sentinel_setting_is_a_config_error_naming_the_field(
    redis: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        sentinel_config(**redis)


def test_sentinels_without_sentinel_mode_are_refused() -> None:
    with pytest.raises(ConfigError, match=r'\$.redis.sentinels: only used with mode = '
                                          r'"sentinel", got mode = "standalone"'):
        load_config(None, environ={}, overrides={"redis": {"sentinels": SENTINELS}})


def test_sentinel_addresses_take_port_26379_by_default_and_ipv6_in_brackets() -> None:
    assert sentinel_addresses(SENTINELS) == [
        ("10.0.0.1", 26379), ("sentinel-2", 26379), ("::1", 26380)]


async def test_the_client_asks_the_sentinels_with_their_own_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATA_PW", "data-secret")  # read when connecting, as for one server
    monkeypatch.setenv("SENTINEL_PW", "sentinel-secret")
    config = sentinel_config(password_env="DATA_PW", sentinel_password_env="SENTINEL_PW",
                             sentinel_service="orders")
    client = connect(config.redis)
    try:
        assert isinstance(client, SentinelClient)
        pool: Any = client.connection_pool
        assert pool.service_name == "orders"
        data = pool.connection_kwargs
        # The data nodes: the URL's database and the data password; no host of the URL's.
        assert (data["db"], data["password"]) == (2, "data-secret")
        assert "host" not in data and "port" not in data
        assert data["retry"]._retries == 0  # Caller retries, redis-py does not
        assert pool.connection_class.__name__ == "_CPackedSentinelConnection"
        sentinels = client.sentinel_manager.sentinels  # type: ignore[union-attr]
        addresses = [(s.connection_pool.connection_kwargs["host"],
                      s.connection_pool.connection_kwargs["port"]) for s in sentinels]
        assert addresses == sentinel_addresses(SENTINELS)
        kwargs = sentinels[0].connection_pool.connection_kwargs
        assert kwargs["password"] == "sentinel-secret"
        assert kwargs["retry"]._retries == 0
        assert kwargs["socket_timeout"] == config.redis.socket_timeout_s
    finally:
        await close(client)


async def test_tls_reaches_the_data_nodes_and_the_sentinels() -> None:
    client = connect(sentinel_config(url="rediss:///0", tls_verify=False).redis)
    try:
        assert client.connection_pool.connection_class.__name__ == (
            "_CPackedSentinelSSLConnection")
        sentinel = client.sentinel_manager.sentinels[0]
        assert sentinel.connection_pool.connection_class.__name__ == "SSLConnection"
    finally:
        await close(client)


def test_logs_name_the_service_and_its_sentinels_not_the_url() -> None:
    config = sentinel_config(url="redis://u:pw@ignored:6379/0", sentinel_service="orders")
    assert server_name(config.redis) == f"orders (sentinels {','.join(SENTINELS)})"
