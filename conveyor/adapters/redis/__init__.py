"""The Redis backend: one stream per queue, one consumer group per app.

:func:`from_config` builds the :class:`RedisAdapter`; ``backend`` holds Redis's whole
offer (:data:`~conveyor.adapters.redis.backend.BACKEND`, named ``"redis"`` by the
registry, :mod:`conveyor.backends`). The modules, each with one job:

* ``adapter`` — the queue-adapter port: publishing, receivers, the operator facets;
* ``receiver`` — one queue's consumer side: read, claim, fenced acknowledgement, trim;
* ``codec`` — the wire format: stream entries to messages and back, dead-letter entries;
* ``connections`` — clients (single server, cluster, sentinel), the key layout, error
  translation and retries;
* ``scripts`` — the Lua scripts the others run;
* ``coordination`` — leases and membership on the server (the ``redis`` balancer's store);
* ``letters``, ``groups`` — the operator's side: dead letters, consumer groups;
* ``eviction``, ``persistence``, ``idempotency``, ``rate`` — the eviction-policy guard,
  the persistence report, the idempotency store, the shared rate limit's token bucket;
* ``backend`` — what the registry hands out: the adapter and every store above.

Only ``adapter`` and ``backend`` know the adapter; the receiver takes what it needs as a
protocol.
"""

from conveyor.adapters.redis.adapter import RedisAdapter, from_config, wait_ready

__all__ = ["RedisAdapter", "from_config", "wait_ready"]
