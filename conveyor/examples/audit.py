"""An app interceptor: one audit line per handler attempt, with its outcome and time.

Used in README's "Interceptors" section and tested in a daemon by
tests/integration/test_interceptors.py. ``audit=False`` on a handler leaves it out:
the option is declared by :class:`AuditOptions` and checked when the handler is
declared.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import conveyor


@dataclass(frozen=True)
class AuditOptions(conveyor.HandlerOptions):
    """``App.handler(..., audit=False)``: this handler is not audited."""

    enabled: bool = True
    keywords: ClassVar[frozenset[str]] = frozenset({"audit"})

    @classmethod
    def from_keywords(cls, where: str, given: Mapping[str, Any]) -> AuditOptions:
        enabled = given.get("audit", True)
        if not isinstance(enabled, bool):
            raise conveyor.HandlerDeclarationError(f"{where}: audit must be True or False")
        return cls(enabled)


class Audit(conveyor.Interceptor):
    options = AuditOptions

    def __init__(self, write: Callable[[str], None] = print) -> None:
        self.write = write

    def wrap(self, handler: conveyor.HandlerSpec, next: conveyor.Step) -> conveyor.Step:
        audit = handler.option(AuditOptions)
        if audit is not None and not audit.enabled:
            return next  # not in this handler's chain at all
        write = self.write

        async def audited(delivery: conveyor.Delivery) -> None:
            started = time.perf_counter()
            outcome = "ok"
            try:
                await next(delivery)
            except Exception as exc:
                outcome = type(exc).__name__
                raise  # retry and the dead-letter store see it as the handler's failure
            finally:
                ms = (time.perf_counter() - started) * 1000
                write(f"{handler.name} {delivery.message.id} attempt={delivery.attempt} "
                      f"{outcome} {ms:.1f}ms")

        return audited
