"""The slot supplier a ``[slots]`` config section describes, user-written ones included."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conveyor.platform.errors import ConfigError, InvalidArgumentError
from conveyor.platform.importing import load_attr
from conveyor.platform.slots import SlotSupplier, TokenSource, require_supplier
from conveyor.workers.slots.fixed import FixedSlotSupplier
from conveyor.workers.slots.rate import Gcra, RateLimitedSlotSupplier
from conveyor.workers.slots.resource import ResourceBasedSlotSupplier
from conveyor.workers.slots.wrappers import GuardedSlotSupplier, PauseableSlotSupplier

SharedBucket = Callable[[float, int], TokenSource]
"""``(per_second, burst) -> bucket`` shared by the app's daemons, in the store ``[slots.rate]
store`` names (its backend's rate bucket, bound to the config and the app)."""


def supplier_from_config(config: Any, *, shared_bucket: SharedBucket | None = None
                         ) -> SlotSupplier:
    """The slot supplier a ``[slots]`` config section describes.

    ``custom`` suppliers are user code: they are wrapped in a
    :class:`~conveyor.workers.slots.wrappers.GuardedSlotSupplier` so their exceptions are
    contained. ``[slots.rate]`` wraps any kind in a
    :class:`~conveyor.workers.slots.rate.RateLimitedSlotSupplier` (with a ``store``
    other than ``"local"`` its bucket is ``shared_bucket``'s), and ``pauseable = true``
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
        supplier = rate_limited(supplier, rate, shared_bucket)
    if getattr(config, "pauseable", False):
        supplier = PauseableSlotSupplier(supplier)
    return supplier


def rate_limited(supplier: SlotSupplier, rate: Any,
                 shared_bucket: SharedBucket | None = None) -> SlotSupplier:
    """``supplier`` wrapped in the rate limit of ``rate`` (``[slots.rate]``)."""
    source: TokenSource
    if rate.store == "local":
        source = Gcra(rate.per_second, rate.burst)
    elif shared_bucket is None:
        raise ConfigError(f"$.slots.rate.store: {rate.store!r} needs the app's shared bucket "
                          "(a daemon built from the config has one)")
    else:
        source = shared_bucket(rate.per_second, rate.burst)
    return RateLimitedSlotSupplier(supplier, source, per_second=rate.per_second)


def load_custom_supplier(path: str, options: dict[str, Any]) -> SlotSupplier:
    """Build a user-written supplier from ``"package.module:Factory"`` and its options."""
    factory = load_attr(path, "$.slots.path", form='"package.module:Factory"')
    if not callable(factory):  # not the options' fault, as its call's TypeError said
        raise ConfigError(f"$.slots.path: {path} is {type(factory).__name__}, not a factory "
                          "to call (a SlotSupplier subclass, or a function that returns one)")
    try:
        supplier = factory(**options)
    except Exception as exc:
        raise ConfigError(f"$.slots.options: {path}(**options) failed: {exc!r}") from None
    if not isinstance(supplier, SlotSupplier):
        raise ConfigError(
            f"$.slots.path: {path} built {type(supplier).__name__}, not a SlotSupplier "
            "(subclass conveyor.SlotSupplier)"
        )
    try:
        return require_supplier(supplier, f"$.slots.path: {path}")
    except InvalidArgumentError as exc:  # its __init__ skipped the base class's
        raise ConfigError(str(exc)) from None
