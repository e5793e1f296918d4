"""Claims and completion marks of ``idempotent=True`` handlers in Redis (see
:mod:`conveyor.platform.delivery.idempotency`).

One key per handler and message id, ``PREFIX:app:APP:once:HANDLER:ID`` (next to the
app's leases, so ``groups delete`` removes them with the app): ``c:OWNER`` while a
delivery holds the claim (expiring after ``claim_s``), ``d`` once completed (expiring
after ``window_s``). Claim, renew and release are one script each, so a claim is
granted, extended or given back only by comparing what is there.
"""

from __future__ import annotations

from redis.asyncio import Redis

from conveyor.adapters.redis.connections import close, connect
from conveyor.adapters.redis.errors import Caller
from conveyor.adapters.redis.keys import Keys
from conveyor.platform.config import RedisConfig
from conveyor.platform.delivery.idempotency import Claim

# KEYS[1]; ARGV owner, claim_ms. Returns {0} claimed, {1} done, {2, pttl} busy.
CLAIM = """
local v = redis.call('GET', KEYS[1])
if not v or v == 'c:' .. ARGV[1] then
  redis.call('SET', KEYS[1], 'c:' .. ARGV[1], 'PX', ARGV[2])
  return {0, 0}
end
if v == 'd' then return {1, 0} end
return {2, redis.call('PTTL', KEYS[1])}
"""
RENEW = """
if redis.call('GET', KEYS[1]) == 'c:' .. ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
RELEASE = """
if redis.call('GET', KEYS[1]) == 'c:' .. ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
_STATES = (Claim.CLAIMED, Claim.DONE, Claim.BUSY)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class RedisIdempotencyStore:
    """The app's claims and marks at ``[redis] url``."""

    def __init__(self, redis_cfg: RedisConfig, app: str) -> None:
        self.prefix = f"{Keys(redis_cfg.prefix).app(app)}:once:"
        self._redis: Redis = connect(redis_cfg)
        self._caller = Caller(redis_cfg, self._redis)
        self._claim = self._redis.register_script(CLAIM)
        self._renew = self._redis.register_script(RENEW)
        self._release = self._redis.register_script(RELEASE)

    async def claim(self, key: str, owner: str, claim_s: float) -> tuple[Claim, float]:
        state, pttl = await self._caller.once("claiming a message id", lambda: self._claim(
            keys=[self.prefix + key], args=[owner, _ms(claim_s)]))
        return _STATES[int(state)], max(int(pttl), 0) / 1000

    async def renew(self, key: str, owner: str, claim_s: float) -> bool:
        renewed = await self._caller.once("renewing a claim", lambda: self._renew(
            keys=[self.prefix + key], args=[owner, _ms(claim_s)]))
        return bool(renewed)

    async def complete(self, key: str, window_s: float) -> None:
        await self._caller.once("marking a message id done", lambda: self._redis.set(
            self.prefix + key, "d", px=_ms(window_s)))

    async def release(self, key: str, owner: str) -> None:
        await self._caller.once("releasing a claim", lambda: self._release(
            keys=[self.prefix + key], args=[owner]))

    async def close(self) -> None:
        await close(self._redis)
