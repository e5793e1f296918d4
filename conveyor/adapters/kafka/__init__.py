"""The Kafka backend: one topic, partition ``i`` is queue ``i``.

:func:`from_config` builds the :class:`KafkaAdapter` (``conveyor.adapters.kafka:from_config``
is how the adapter table names it).
"""

from conveyor.adapters.kafka.adapter import KafkaAdapter, from_config

__all__ = ["KafkaAdapter", "from_config"]
