"""Handler options: typed, frozen values, each owned by the interceptor that reads it.

``App.handler(namespace, **options)`` takes loose keywords (``retry_attempts=5``,
``stateless=True``, ``cell_key="header:tenant"`` ...). Each :class:`HandlerOptions`
type below claims the keywords it understands and turns them into one frozen value,
validated once, when the handler is declared — never when the first message arrives.
A keyword no option type claims is a :class:`HandlerDeclarationError`.

Option type      keywords                                   read by
---------------  -----------------------------------------  ----------------------------
RetryPolicy      retry_attempts, retry_delay_s,             the retry interceptor, and
                 retry_max_delay_s, retry_multiplier,       the decode step (the
                 retry_jitter_s, max_deliveries             delivery limit)
PoolOptions      stateless, max_workers, scale_down         the stateless-pool interceptor
CellOptions      cell_key, cell_size, cell_sizes,           the cell interceptor
                 cell_job_timeout_s
IdempotencyOptions idempotent, idempotency_window_s,        the idempotency interceptor
                 idempotency_claim_s
BatchOptions     batch_size, batch_wait_ms                  the agent's batcher and the
                                                            batch step (delivery/batch.py)

User interceptors may declare option types of their own (``Interceptor.options``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from conveyor.platform.backoff import Backoff
from conveyor.platform.errors import HandlerDeclarationError
from conveyor.platform.message import ATTEMPT_MAX

OptionT = TypeVar("OptionT", bound="HandlerOptions")


class HandlerOptions:
    """Base of option types. Subclasses are frozen dataclasses that name their keywords.

    ``keywords`` are the ``App.handler`` keywords the type claims; :meth:`from_keywords`
    builds the value from those that were given (all of them validated, with ``where``
    naming the handler in errors), or returns ``None`` when the handler does not use the
    feature at all.
    """

    __slots__ = ()
    keywords: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def from_keywords(cls: type[OptionT], where: str, given: Mapping[str, Any]) -> OptionT | None:
        raise NotImplementedError


def _bad(where: str, message: str) -> HandlerDeclarationError:
    return HandlerDeclarationError(f"{where}: {message}")


def _is_int(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def is_number(value: Any, low: float) -> bool:
    """Whether ``value`` is an int or a float (not a bool), finite — an int past any
    float (``10**400``) is not one: ``math.isfinite`` raises on it — and ``>= low``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value) and value >= low
    except OverflowError:
        return False


@dataclass(frozen=True, slots=True)
class RetryPolicy(HandlerOptions):
    """How a failing handler is retried before its message is dead-lettered.

    ``attempts`` counts every call, the first included. Waits grow exponentially from
    ``initial_delay_s`` by ``multiplier`` up to ``max_delay_s``, plus up to ``jitter_s``
    of random jitter. Every handler has one (the defaults when no ``retry_*`` keyword
    is given); ``attempts=1`` means no retry.

    ``max_deliveries`` bounds what retries cannot see: deliveries of a message that never
    finished because its worker died or stalled its event loop past the lease while
    handling it (a crash, an OOM kill, ``os._exit``, a blocking call). A message the
    broker has delivered more than this many times is not run again: it becomes a dead
    letter with reason ``DeliveryLimit`` and its stream flows on. A delivery is counted
    each time a worker takes the message from the queue, so a message held (not yet
    started) by a worker that crashed because of another message is counted too.

    Both counts are at most :data:`~conveyor.platform.message.ATTEMPT_MAX` (2**31-1):
    the wire's ``cv-attempt`` holds no more (a dead letter's message with a larger
    attempt read back as undecodable).
    """

    attempts: int = 3
    initial_delay_s: float = 0.05
    multiplier: float = 2.0
    max_delay_s: float = 5.0
    jitter_s: float = 0.0
    max_deliveries: int = 5

    keywords: ClassVar[frozenset[str]] = frozenset({
        "retry_attempts", "retry_delay_s", "retry_max_delay_s", "retry_multiplier",
        "retry_jitter_s", "max_deliveries",
    })

    def __post_init__(self) -> None:
        self.validate("RetryPolicy")

    @classmethod
    def from_keywords(cls, where: str, given: Mapping[str, Any]) -> RetryPolicy:
        defaults = cls()
        try:
            return cls(
                attempts=given.get("retry_attempts", defaults.attempts),
                initial_delay_s=given.get("retry_delay_s", defaults.initial_delay_s),
                multiplier=given.get("retry_multiplier", defaults.multiplier),
                max_delay_s=given.get("retry_max_delay_s", defaults.max_delay_s),
                jitter_s=given.get("retry_jitter_s", defaults.jitter_s),
                max_deliveries=given.get("max_deliveries", defaults.max_deliveries),
            )
        except HandlerDeclarationError as exc:
            raise _bad(where, str(exc).partition(": ")[2]) from None

    def validate(self, where: str) -> None:
        """Type and range checks, naming the ``App.handler`` keyword at fault."""
        for keyword, count in (("retry_attempts", self.attempts),
                               ("max_deliveries", self.max_deliveries)):
            if not (_is_int(count, 1) and count <= ATTEMPT_MAX):
                raise _bad(where, f"{keyword} must be an int from 1 to {ATTEMPT_MAX} (what "
                                  "the wire's cv-attempt and a delivery count hold), got "
                                  f"{count!r}")
        for keyword, value, low in (
            ("retry_delay_s", self.initial_delay_s, 0.0),
            ("retry_max_delay_s", self.max_delay_s, 0.0),
            ("retry_jitter_s", self.jitter_s, 0.0),
            ("retry_multiplier", self.multiplier, 1.0),
        ):
            if not is_number(value, low):
                raise _bad(where, f"{keyword} must be a finite number >= {low:g}, got {value!r}")

    def backoff_s(self, retry: int) -> float:
        """The wait before retry ``retry`` (1, 2, ...), jitter included."""
        delay = self.delay_before(retry)
        return delay + random.uniform(0, self.jitter_s) if self.jitter_s else delay

    def delay_before(self, retry: int) -> float:
        """The wait before retry ``retry`` (1, 2, ...), jitter not included: the retry
        step adds up to ``jitter_s`` after the cap, as the README promises users."""
        return Backoff(self.initial_delay_s, self.multiplier, self.max_delay_s).delay(retry)


MIN_INSPECTION_PERIOD_S = 0.01
"""A shorter period would wake the collector so often that it spins the event loop."""


@dataclass(frozen=True, slots=True)
class ScaleDownPolicy:
    """Settings of the PID scale-down loop of a stateless-worker pool.

    ``dead_zone_cycles`` defaults to 2. The reference article adds the dead zone ("a
    significant change to the control signal before adjusting the output") but gives
    no value. Its simulation, the one the default gains were tuned in, adds the 0.1 s
    time step per negative inspection and removes when the sum exceeds 1.0, i.e. on the
    11th consecutive negative inspection (5.5 s); ``dead_zone_cycles=11`` reproduces it.
    We ship 2 (1 s) on measured merits (docs/lab.md, "Dead zone: ours vs the
    reference's"): up to 27 % fewer workers than 11 on the simulated patterns (5 % on
    constant load, none on spikes) at no queueing cost, for 1.7-3.1x the worker
    creations; 2 is also the smallest value that does not act on a single sample.

    ``backoff_s`` defaults to one inspection period (0.5 s): the reference simulation's
    back-off is ``5 * (int)0.5 = 0`` ms, i.e. at most one removal per inspection. With
    the dead zone of 2 the defaults allow at most one removal per second (after a removal
    the dead-zone counter starts again from zero). The controller that uses these
    settings is :class:`conveyor.workers.pools.scaledown.ScaleDownController`.
    """

    kp: float = 0.433
    ki: float = 0.468
    kd: float = 0.480
    inspection_period_s: float = 0.5
    dead_zone_cycles: int = 2
    backoff_s: float = 0.5
    idle_keepalive_s: float = 5.0
    """A worker idle this long is removed even when the loop never saw load (0: never).

    The PID loop acts on load it *sees* at inspections; a spike handled between two
    inspections leaves its workers idle with the signal at 0, for ever. Like Celery's
    autoscaler keep-alive and Orleans' idle collection, the pool then removes its
    longest-idle worker once it has been idle ``idle_keepalive_s``, at most one per
    ``backoff_s``, down to none."""

    def __post_init__(self) -> None:
        for name in ("kp", "ki", "kd", "backoff_s", "idle_keepalive_s"):
            value = getattr(self, name)
            if not is_number(value, 0.0):
                raise HandlerDeclarationError(
                    f"ScaleDownPolicy.{name} must be finite and >= 0, got {value!r}"
                )
        if not is_number(self.inspection_period_s, MIN_INSPECTION_PERIOD_S):
            raise HandlerDeclarationError(
                f"ScaleDownPolicy.inspection_period_s must be >= {MIN_INSPECTION_PERIOD_S}, "
                f"got {self.inspection_period_s!r}"
            )
        if self.kp == self.ki == self.kd == 0 and self.idle_keepalive_s == 0:
            raise HandlerDeclarationError(
                "ScaleDownPolicy: kp, ki and kd are all 0 and idle_keepalive_s is 0, so no "
                "worker would ever be removed; give a gain, a keep-alive, or scale_down=False"
            )
        if not _is_int(self.dead_zone_cycles, 1):
            raise HandlerDeclarationError(
                f"ScaleDownPolicy.dead_zone_cycles must be an int >= 1, "
                f"got {self.dead_zone_cycles!r}"
            )


@dataclass(frozen=True, slots=True)
class PoolOptions(HandlerOptions):
    """``stateless=True``: the handler's calls run on a stateless-worker pool.

    ``max_workers`` None means the CPU count; ``scale_down`` None means the pool only
    grows (the PID scale-down is off and costs nothing).
    """

    max_workers: int | None = None
    scale_down: ScaleDownPolicy | None = None

    keywords: ClassVar[frozenset[str]] = frozenset({"stateless", "max_workers", "scale_down"})

    @classmethod
    def from_keywords(cls, where: str, given: Mapping[str, Any]) -> PoolOptions | None:
        stateless = given.get("stateless", False)
        if not isinstance(stateless, bool):
            raise _bad(where, f"stateless must be True or False, got {stateless!r}")
        if not stateless:
            if {"max_workers", "scale_down"} & set(given):
                raise _bad(
                    where, "max_workers and scale_down apply to stateless=True handlers only"
                )
            return None
        max_workers = given.get("max_workers")
        if max_workers is not None and not _is_int(max_workers, 1):
            raise _bad(where, f"max_workers must be an int >= 1, got {max_workers!r}")
        scale_down = given.get("scale_down", False)
        if scale_down is True:
            scale_down = ScaleDownPolicy()
        elif scale_down is False or scale_down is None:
            scale_down = None
        elif not isinstance(scale_down, ScaleDownPolicy):
            raise _bad(
                where, f"scale_down must be True, False or a ScaleDownPolicy, got {scale_down!r}"
            )
        return cls(max_workers, scale_down)


DEFAULT_CELL_SIZE = 4


@dataclass(frozen=True, slots=True)
class CellOptions(HandlerOptions):
    """``cell_key=``: the handler's calls run in per-tenant cells.

    ``source`` is ``"header"`` or ``"body"`` and ``name`` the header or body field that
    names a message's cell. ``sizes`` may be overridden by the ``[cells]`` config.
    """

    source: str
    name: str
    size: int = DEFAULT_CELL_SIZE
    sizes: Mapping[str, int] = field(default_factory=dict)
    job_timeout_s: float | None = None

    keywords: ClassVar[frozenset[str]] = frozenset({
        "cell_key", "cell_size", "cell_sizes", "cell_job_timeout_s",
    })

    @classmethod
    def from_keywords(cls, where: str, given: Mapping[str, Any]) -> CellOptions | None:
        if "cell_key" not in given:
            extra = cls.keywords & set(given)
            if extra:
                raise _bad(where, f"{sorted(extra)} need cell_key='header:NAME' or 'body:NAME'")
            return None
        key = given["cell_key"]
        source, sep, name = key.partition(":") if isinstance(key, str) else ("", "", "")
        if not sep or source not in ("header", "body") or not name:
            raise _bad(where, f"cell_key must be 'header:NAME' or 'body:NAME', got {key!r}")
        size = given.get("cell_size", DEFAULT_CELL_SIZE)
        if not _is_int(size, 1):
            raise _bad(where, f"cell_size must be an int >= 1, got {size!r}")
        sizes = given.get("cell_sizes", {})
        if not isinstance(sizes, dict) or not all(
            isinstance(k, str) and _is_int(v, 1) for k, v in sizes.items()
        ):
            raise _bad(where, f"cell_sizes must map cell names to ints >= 1, got {sizes!r}")
        timeout = given.get("cell_job_timeout_s")
        if timeout is not None and not (is_number(timeout, 0.0) and timeout > 0):
            raise _bad(where, f"cell_job_timeout_s must be a number > 0 or None, got {timeout!r}")
        return cls(source, name, size, dict(sizes), timeout)


DAY_S = 86_400.0
DEFAULT_CLAIM_S = 30.0


@dataclass(frozen=True, slots=True)
class IdempotencyOptions(HandlerOptions):
    """``idempotent=True``: a message id this handler completed within ``window_s`` is
    acknowledged without running the handler again, and two deliveries of one id never
    run at once (a claim held ``claim_s`` at a time, renewed while the handler runs).
    See :mod:`conveyor.platform.delivery.idempotency`.
    """

    window_s: float = DAY_S
    claim_s: float = DEFAULT_CLAIM_S

    keywords: ClassVar[frozenset[str]] = frozenset({
        "idempotent", "idempotency_window_s", "idempotency_claim_s",
    })

    @classmethod
    def from_keywords(cls, where: str, given: Mapping[str, Any]) -> IdempotencyOptions | None:
        on = given.get("idempotent", False)
        if not isinstance(on, bool):
            raise _bad(where, f"idempotent must be True or False, got {on!r}")
        if not on:
            extra = cls.keywords & set(given) - {"idempotent"}
            if extra:
                raise _bad(where, f"{sorted(extra)} apply to idempotent=True handlers only")
            return None
        values = []
        for name, default, low, high in (
            ("idempotency_window_s", DAY_S, 1.0, 365 * DAY_S),
            ("idempotency_claim_s", DEFAULT_CLAIM_S, 0.1, DAY_S),
        ):
            value = given.get(name, default)
            if not (is_number(value, low) and value <= high):
                raise _bad(where, f"{name} must be a number in [{low:g}, {high:g}], got {value!r}")
            values.append(float(value))
        return cls(values[0], values[1])


DEFAULT_BATCH_WAIT_MS = 50.0


@dataclass(frozen=True, slots=True)
class BatchOptions(HandlerOptions):
    """``batch_size=N``: the handler takes ``list[T]`` and is called with up to ``size``
    messages at once, handed over when the batch is full or ``wait_ms`` after its first
    message arrived. See :mod:`conveyor.platform.batcher` (order, slots) and
    :mod:`conveyor.platform.delivery.batch` (decoding, retry, bisection).
    """

    size: int
    wait_ms: float = DEFAULT_BATCH_WAIT_MS

    keywords: ClassVar[frozenset[str]] = frozenset({"batch_size", "batch_wait_ms"})

    @classmethod
    def from_keywords(cls, where: str, given: Mapping[str, Any]) -> BatchOptions | None:
        if "batch_size" not in given:
            if "batch_wait_ms" in given:
                raise _bad(where, "batch_wait_ms applies to batch handlers only (batch_size=N)")
            return None
        size = given["batch_size"]
        if not (_is_int(size, 1) and size <= MAX_BATCH_SIZE):
            raise _bad(where, f"batch_size must be an int in [1, {MAX_BATCH_SIZE}], got {size!r}")
        wait_ms = given.get("batch_wait_ms", DEFAULT_BATCH_WAIT_MS)
        if not (is_number(wait_ms, 0.0) and wait_ms <= 60_000):
            raise _bad(where, f"batch_wait_ms must be a number in [0, 60000], got {wait_ms!r}")
        return cls(size, float(wait_ms))


MAX_BATCH_SIZE = 100_000

BUILTIN_OPTIONS: tuple[type[HandlerOptions], ...] = (
    RetryPolicy, PoolOptions, CellOptions, IdempotencyOptions, BatchOptions,
)


def parse_options(
    where: str, given: Mapping[str, Any], types: tuple[type[HandlerOptions], ...]
) -> dict[type[HandlerOptions], HandlerOptions]:
    """Each option type's value from the keywords ``given`` (unknown keywords refused).

    A type absent from the result is not used by the handler; ``RetryPolicy`` is always
    present (the defaults when no ``retry_*`` keyword was given).
    """
    known = frozenset().union(*(t.keywords for t in types))
    unknown = set(given) - known
    if unknown:
        raise _bad(where, f"unknown option(s) {sorted(unknown)} (known: {sorted(known)})")
    values: dict[type[HandlerOptions], HandlerOptions] = {}
    for option_type in types:
        value = option_type.from_keywords(where, {
            k: v for k, v in given.items() if k in option_type.keywords
        })
        if value is not None:
            values[option_type] = value
    if PoolOptions in values and CellOptions in values:
        raise _bad(where, "a handler is either stateless=True or has cells (cell_key), not both")
    if BatchOptions in values:
        refused = [k for t, k in ((PoolOptions, "stateless=True"), (CellOptions, "cell_key"),
                                  (IdempotencyOptions, "idempotent=True")) if t in values]
        if refused:
            raise _bad(where, f"batch handlers (batch_size) cannot use {', '.join(refused)}: "
                              "a batch runs as one call, on the agent's slot")
    return values
