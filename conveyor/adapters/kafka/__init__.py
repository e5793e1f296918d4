"""The Kafka backend: one topic, partition ``i`` is queue ``i``.

:func:`from_config` builds the :class:`KafkaAdapter`; ``backend`` holds Kafka's whole
offer (:data:`~conveyor.adapters.kafka.backend.BACKEND`, named ``"kafka"`` by the
registry, :mod:`conveyor.backends`). The modules, each with one job:

* ``adapter`` — the queue-adapter port: publishing, receivers, the operator facets;
* ``receiver`` — one partition's consumer side: fetch, the commit watermark;
* ``codec`` — the wire format: records to messages, headers, dead-letter records;
* ``cluster`` — the topic and the connections the others share (``KafkaCluster``);
* ``connection`` — client options, error translation, outage back-off, ``admin()``;
* ``offsets``, ``handoff`` — done offsets above the watermark, and the hand-off records
  that carry them (and the delivery counts) to the next owner;
* ``letters``, ``groups``, ``rewind``, ``members`` — the operator's side: dead letters,
  consumer groups, moving positions, who runs an app;
* ``group_balancer`` — the ``kafka-group`` balancer (Kafka's group protocol);
* ``aiokafka_internals`` — everything taken from aiokafka beyond its public API;
* ``backend`` — what the registry hands out: the adapter and the balancer kind.

Only ``adapter``, ``group_balancer`` and ``backend`` know the adapter; the rest take the
cluster.
"""

from conveyor.adapters.kafka.adapter import KafkaAdapter, from_config

__all__ = ["KafkaAdapter", "from_config"]
