"""One backend per broker, chosen in one place (``conveyor.backends``), handed to the
platform as a value: the registry's names, how one config draws on several brokers, and
a hand-made backend used as given."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import msgspec
import pytest

from conveyor import App, MessageContext
from conveyor.adapters.memory import BACKEND as MEMORY
from conveyor.adapters.memory import MemoryAdapter, reset_broker
from conveyor.adapters.redis.coordination import RedisLeaseStore, RedisMembership
from conveyor.adapters.redis.idempotency import RedisIdempotencyStore
from conveyor.adapters.redis.rate import RedisTokenSource
from conveyor.backends import (
    backend,
    backend_names,
    coordination,
    for_config,
    idempotency_store,
    rate_bucket,
)
from conveyor.platform.backend import Backend
from conveyor.platform.config import AdapterName, Config, MembershipName, load_config
from conveyor.platform.errors import ConfigError
from conveyor.platform.operations.status import collect_status
from conveyor.workers.daemon import WorkerDaemon


def config(**sections: dict[str, Any]) -> Config:
    return load_config(None, environ={}, overrides=sections)


def test_every_adapter_and_membership_a_config_may_name_has_a_backend() -> None:
    assert backend_names() == sorted(typing.get_args(AdapterName))
    for name in typing.get_args(AdapterName):
        assert backend(name).name == name
    for name in typing.get_args(MembershipName):
        assert backend(name).coordination is not None


def test_an_unknown_adapter_is_one_line_naming_the_setting() -> None:
    with pytest.raises(ConfigError) as err:
        backend("nats")
    assert str(err.value) == ("unknown adapter 'nats' at $.queues.adapter "
                              "(choose one of ['kafka', 'memory', 'redis'])")


def test_an_unknown_membership_store_is_one_line_naming_the_setting() -> None:
    # The config's schema refuses it; a Config built in code reaches the registry.
    cfg = config()
    cfg = msgspec.structs.replace(
        cfg, balancer=msgspec.structs.replace(cfg.balancer, membership="kafka"))
    with pytest.raises(ConfigError) as err:
        coordination(cfg, "shop")
    assert str(err.value) == ("unknown membership store 'kafka' at $.balancer.membership "
                              "(choose one of ['memory', 'redis'])")


async def test_a_kafka_app_keeps_leases_idempotency_keys_and_its_bucket_in_redis() -> None:
    cfg = config(queues={"adapter": "kafka"}, balancer={"membership": "redis"},
                 slots={"rate": {"per_second": 10.0}})
    chosen = for_config(cfg)
    assert chosen.name == "kafka" and "kafka-group" in chosen.balancers
    assert chosen.coordination is not None and chosen.idempotency_store is not None
    membership, leases = chosen.coordination(cfg, "shop")  # connects lazily: no server
    assert isinstance(membership, RedisMembership) and isinstance(leases, RedisLeaseStore)
    await membership.close()
    await leases.close()
    store = chosen.idempotency_store(cfg, "shop")
    assert isinstance(store, RedisIdempotencyStore)
    await store.close()
    assert chosen.rate_bucket is not None
    bucket = chosen.rate_bucket(cfg, "shop", 10.0, 1)
    assert isinstance(bucket, RedisTokenSource)
    await bucket.close()


def test_the_embedded_broker_keeps_its_keys_in_process_and_has_no_shared_bucket() -> None:
    cfg = config(slots={"rate": {"per_second": 1.0, "store": "local"}})
    assert idempotency_store(cfg, "a") is idempotency_store(cfg, "b")  # one per broker
    with pytest.raises(ConfigError, match=r"^\$.slots.rate.store: 'local' keeps no shared"):
        rate_bucket(cfg, "a", 1.0, 1)


def test_a_balancer_kind_is_the_platforms_or_one_the_backend_brings() -> None:
    assert MEMORY.balancer("dynamic") is None and MEMORY.balancer("static") is None
    assert backend("kafka").balancer("kafka-group") is not None
    with pytest.raises(ConfigError, match=r"^\$.balancer.kind: 'kafka-group' is not offered "
                                          r"by the 'memory' adapter \(it offers none\)$"):
        MEMORY.balancer("kafka-group")


async def test_a_backend_handed_in_builds_the_daemon_and_feeds_status() -> None:
    reset_broker("handed-in")
    built: list[str] = []

    def adapter(cfg: Config) -> MemoryAdapter:
        built.append(cfg.memory.broker)
        return MemoryAdapter(cfg.memory.broker)

    mine = dataclasses.replace(MEMORY, name="mine", adapter=adapter)
    cfg = config(memory={"broker": "handed-in"}, queues={"total": 2})
    app = App("shop")

    @app.handler("orders")
    async def on_order(body: Any, ctx: MessageContext) -> None: ...

    daemon = WorkerDaemon(app, cfg, backend=mine)
    await daemon.start()
    try:
        report = await collect_status(cfg, "shop", mine)
    finally:
        await daemon.stop()
    assert built == ["handed-in", "handed-in"]  # the daemon's adapter, then status's
    assert [m.id for m in report.members] == [daemon.member.id]
    assert sorted(q for m in report.members for q in m.queues) == [0, 1]


def test_a_backend_is_a_value_the_platform_can_take_without_naming_a_broker() -> None:
    assert isinstance(MEMORY, Backend)
    with pytest.raises(dataclasses.FrozenInstanceError):
        MEMORY.name = "other"  # type: ignore[misc]
