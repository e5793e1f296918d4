"""A rate limiter's bucket in Redis, shared by every daemon of an app (``[slots.rate]
store = "redis"``; see :mod:`conveyor.workers.slots.rate` for the algorithm).

The bucket is one key, ``PREFIX:app:APP:rate`` (next to the app's leases), holding the
GCRA's theoretical arrival time in microseconds of the *server's* clock (``TIME``), so
daemons on machines whose clocks disagree still share one rate. One script call grants
up to ``want`` tokens; the key expires once the bucket is full again, so an idle app
leaves nothing behind.
"""

from __future__ import annotations

from redis.asyncio import Redis

from conveyor.adapters.redis.connections import close, connect
from conveyor.adapters.redis.errors import Caller
from conveyor.adapters.redis.keys import Keys
from conveyor.platform.config import RedisConfig
from conveyor.platform.errors import InvalidArgumentError

# KEYS[1] the bucket; ARGV interval_us, tolerance_us, want. Returns {granted, wait_us}.
GCRA_TAKE = """
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now) or now
if tat < now then tat = now end
local room = tolerance - (tat - now)
local granted = 0
if room >= 0 then
  granted = math.min(want, math.floor(room / interval) + 1)
end
if granted > 0 then
  tat = tat + granted * interval
  local ttl_ms = math.ceil((tat - now) / 1000) + 1000
  redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', ttl_ms)
  return {granted, 0}
end
return {0, math.ceil(tat - tolerance - now)}
"""


def rate_key(prefix: str, app: str) -> str:
    return f"{Keys(prefix).app(app)}:rate"


class RedisTokenSource:
    """Tokens from the app's bucket in Redis; one script call per :meth:`take`."""

    def __init__(self, redis_cfg: RedisConfig, app: str, per_second: float, burst: int) -> None:
        if per_second <= 0 or burst < 1:
            raise InvalidArgumentError("per_second must be > 0 and burst >= 1")
        self.key = rate_key(redis_cfg.prefix, app)
        self._redis: Redis = connect(redis_cfg)
        self._caller = Caller(redis_cfg, self._redis)
        self._script = self._redis.register_script(GCRA_TAKE)
        interval_us = 1_000_000 / per_second
        self._args = (interval_us, (burst - 1) * interval_us)

    async def take(self, want: int) -> tuple[int, float]:
        granted, wait_us = await self._caller.once(
            "granting rate-limit tokens",
            lambda: self._script(keys=[self.key], args=[*self._args, want]),
        )
        return int(granted), int(wait_us) / 1_000_000

    async def close(self) -> None:
        await close(self._redis)
