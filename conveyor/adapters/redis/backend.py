"""Redis's offer to Conveyor (:data:`BACKEND`): the adapter, membership and leases on the
server (``[balancer] membership = "redis"``), the idempotency store, and the rate bucket
of ``[slots.rate] store = "redis"``: every one at ``[redis] url``."""

from __future__ import annotations

from conveyor.adapters.redis.adapter import from_config
from conveyor.adapters.redis.coordination import redis_coordination
from conveyor.adapters.redis.idempotency import RedisIdempotencyStore
from conveyor.adapters.redis.rate import RedisTokenSource
from conveyor.adapters.redis.urls import server_name
from conveyor.platform.backend import Backend
from conveyor.platform.config import Config
from conveyor.platform.delivery.idempotency import IdempotencyStore
from conveyor.platform.slots import TokenSource


def idempotency_store(config: Config, group: str) -> IdempotencyStore:
    return RedisIdempotencyStore(config.redis, group)


def rate_bucket(config: Config, group: str, per_second: float, burst: int) -> TokenSource:
    return RedisTokenSource(config.redis, group, per_second, burst)


def describe(config: Config) -> str:
    return f"redis {server_name(config.redis)}"


BACKEND = Backend("redis", from_config, coordination=redis_coordination,
                  idempotency_store=idempotency_store, rate_bucket=rate_bucket,
                  describe=describe)
