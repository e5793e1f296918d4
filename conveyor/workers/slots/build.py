"""The slot supplier a ``[slots]`` config section describes, user-written ones included."""

from __future__ import annotations

from typing import Any

from conveyor.adapters.redis.rate import RedisTokenSource
from conveyor.platform.errors import ConfigError
from conveyor.platform.importing import load_attr
from conveyor.platform.slots import SlotSupplier
from conveyor.workers.slots.fixed import FixedSlotSupplier
from conveyor.workers.slots.rate import Gcra, RateLimitedSlotSupplier, TokenSource
from conveyor.workers.slots.resource import ResourceBasedSlotSupplier
from conveyor.workers.slots.wrappers import GuardedSlotSupplier, PauseableSlotSupplier


def supplier_from_config(config: Any, *, redis: Any = None, app: str = "") -> SlotSupplier:
    """The slot supplier a ``[slots]`` config section describes.

    ``custom`` suppliers are user code: they are wrapped in a
    :class:`~conveyor.workers.slots.wrappers.GuardedSlotSupplier` so their exceptions are
    contained. ``[slots.rate]`` wraps any kind in a
    :class:`~conveyor.workers.slots.rate.RateLimitedSlotSupplier` (with ``store =
    "redis"`` its bucket is at ``redis.url``, keyed by ``app``), and ``pauseable = true``
    wraps the result in a :class:`~conveyor.workers.slots.wrappers.PauseableSlotSupplier`.
    """
    supplier: SlotSupplier
    if config.kind == "fixed":
        supplier = FixedSlotSupplier(config.count)
    elif config.kind == "resource-based":
        supplier = ResourceBasedSlotSupplier.from_config(config.resource)
    elif config.kind == "custom":
        supplier = GuardedSlotSupplier(
            load_custom_supplier(config.path, getattr(config, "options", {}) or {})
        )
    else:
        raise ConfigError(f"unknown slot supplier kind {config.kind!r} at $.slots.kind")
    rate = getattr(config, "rate", None)
    if rate is not None and rate.per_second is not None:
        supplier = rate_limited(supplier, rate, redis, app)
    if getattr(config, "pauseable", False):
        supplier = PauseableSlotSupplier(supplier)
    return supplier


def rate_limited(supplier: SlotSupplier, rate: Any, redis: Any, app: str) -> SlotSupplier:
    """``supplier`` wrapped in the rate limit of ``rate`` (``[slots.rate]``)."""
    source: TokenSource
    if rate.store == "redis":
        if redis is None or not app:
            raise ConfigError('$.slots.rate.store: "redis" needs the [redis] section and '
                              "the app's name")
        source = RedisTokenSource(redis, app, rate.per_second, rate.burst)
    else:
        source = Gcra(rate.per_second, rate.burst)
    return RateLimitedSlotSupplier(supplier, source, per_second=rate.per_second)


def load_custom_supplier(path: str, options: dict[str, Any]) -> SlotSupplier:
    """Build a user-written supplier from ``"package.module:Factory"`` and its options."""
    factory = load_attr(path, "$.slots.path", form='"package.module:Factory"')
    try:
        supplier = factory(**options)
    except Exception as exc:
        raise ConfigError(f"$.slots.options: {path}(**options) failed: {exc!r}") from None
    if not isinstance(supplier, SlotSupplier):
        raise ConfigError(
            f"$.slots.path: {path} built {type(supplier).__name__}, not a SlotSupplier "
            "(subclass conveyor.SlotSupplier)"
        )
    return supplier
