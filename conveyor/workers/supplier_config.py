"""The slot supplier a ``[slots]`` config section describes, user-written ones included."""

from __future__ import annotations

from typing import Any

from conveyor.platform.errors import ConfigError
from conveyor.platform.importing import load_attr
from conveyor.platform.slots import SlotSupplier
from conveyor.workers.fixed_slots import FixedSlotSupplier
from conveyor.workers.resource_slots import ResourceBasedSlotSupplier
from conveyor.workers.slot_wrappers import GuardedSlotSupplier, PauseableSlotSupplier


def supplier_from_config(config: Any) -> SlotSupplier:
    """The slot supplier a ``[slots]`` config section describes.

    ``custom`` suppliers are user code: they are wrapped in a
    :class:`~conveyor.workers.slot_wrappers.GuardedSlotSupplier` so their exceptions are
    contained. ``pauseable = true`` wraps any kind in a
    :class:`~conveyor.workers.slot_wrappers.PauseableSlotSupplier`.
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
    if getattr(config, "pauseable", False):
        supplier = PauseableSlotSupplier(supplier)
    return supplier


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
