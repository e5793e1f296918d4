"""The Redis backend: one stream per queue, one consumer group per app.

:func:`from_config` builds the :class:`RedisAdapter` (the adapter table names it
``conveyor.adapters.redis:from_config``). The modules, each with one job:

* ``adapter`` — the queue-adapter port: publishing, receivers, the operator facets;
* ``receiver`` — one queue's consumer side: read, claim, fenced acknowledgement, trim;
* ``codec`` — the wire format: stream entries to messages and back, dead-letter entries;
* ``connections`` — clients (single server, cluster, sentinel), the key layout, error
  translation and retries;
* ``scripts`` — the Lua scripts the others run;
* ``coordination`` — leases and membership on the server (the ``redis`` balancer's store);
* ``letters``, ``groups`` — the operator's side: dead letters, consumer groups;
* ``eviction``, ``idempotency``, ``rate`` — the eviction-policy guard, the idempotency
  store, the shared rate limit's token bucket.

Only ``adapter`` knows the adapter; the receiver takes what it needs as a protocol.
"""

from conveyor.adapters.redis.adapter import RedisAdapter, from_config, wait_ready

__all__ = ["RedisAdapter", "from_config", "wait_ready"]
