"""OpenTelemetry's current context, read and written without the API's layers.

The API's ``attach``, ``detach``, ``get_current`` and ``trace.get_current_span`` reach
the one context variable through two or three Python functions each; on the hot path
(a consumer span's scope per message, a producer span per published message) these are
the same operations on the same variable, without the calls. Where the API is not as
expected here — another runtime context, the span's key moved — each name is the API's
own function, so the behaviour is the API's either way (checked at import).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar, Token

from opentelemetry import trace
from opentelemetry.context import _RUNTIME_CONTEXT, Context, attach, detach, get_current
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.trace import INVALID_SPAN, Span, set_span_in_context
from opentelemetry.trace import propagation as trace_propagation

get_context: Callable[[], Context] = get_current
set_context: Callable[[Context], Token[Context]] = attach
reset_context: Callable[[Token[Context]], None] = detach
variable: ContextVar[Context] | None = None
"""The API's context variable, where it is one (the default runtime context)."""
if isinstance(_RUNTIME_CONTEXT, ContextVarsRuntimeContext):  # the API's default
    _found = getattr(_RUNTIME_CONTEXT, "_current_context", None)
    if isinstance(_found, ContextVar):
        variable = _found
        get_context, set_context, reset_context = _found.get, _found.set, _found.reset

SPAN_KEY: str = getattr(trace_propagation, "_SPAN_KEY", "")
"""The key :func:`set_span_in_context` stores the span under (private to the API,
checked below: where it is missing, the API's functions are called)."""


def _span_in_context(span: Span) -> Context:
    """What ``set_span_in_context(span)`` returns, a call and a lookup less (and no copy
    of an empty context: the agent's runners run in one)."""
    current = get_context()
    if not current:
        return Context({SPAN_KEY: span})
    values = current.copy()
    values[SPAN_KEY] = span
    return Context(values)


def _current_span() -> Span:
    """What ``trace.get_current_span()`` returns, three calls less."""
    return get_context().get(SPAN_KEY, INVALID_SPAN)  # type: ignore[return-value]


_CHECKED = bool(SPAN_KEY) and trace.get_current_span(
    _span_in_context(INVALID_SPAN)) is INVALID_SPAN
in_context: Callable[[Span], Context] = (
    _span_in_context if _CHECKED else set_span_in_context)
"""``set_span_in_context(span)`` (the API's own, where its key is not where it was)."""
current_span: Callable[[], Span] = _current_span if _CHECKED else trace.get_current_span
"""``trace.get_current_span()``."""
