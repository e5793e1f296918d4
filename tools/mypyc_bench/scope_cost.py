"""Instructions a message of a consumer span's scope, ``ConsumerScope``'s ``enter`` and
``leave`` in a loop that does nothing else (callgrind).

``parent``: each message carries its own ``traceparent`` whose flags say "not
sampled" (the producer dropped the trace); ``new``: no header, and a sampler of 0, so
that each message starts a new trace the ratio drops; ``least``: the least a dropped
parent's context can take, each header's ``RemoteSpan`` in a new ``Context`` set and
reset on the context variable, nothing else. ``kept`` and ``keptnew``: a sampler of 1,
each message with a sampled ``traceparent`` or without one, so that each makes a lean
span, ended and encoded (its posts, in the recorder's thread, are not counted: they
discard). The messages and their headers are built before collection is toggled on,
so under

    valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file=X \\
        python scope_cost.py parent|new|least|kept|keptnew N

X's total is the loop alone; the slope between two N is the cost a message.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from consume_cost import CG  # callgrind's toggle (set up on import)
from opentelemetry.context import Context
from trace_paths import scope  # the consumer span of an ``orders`` handler

from conveyor.platform import trace_context
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.message import Message
from conveyor.platform.sampling import RemoteSpan


def main(mode: str, n: int) -> None:
    consumer = scope(0.0 if mode == "new" else 1.0 if mode.startswith("kept") else 0.1, True)
    flags = "03" if mode == "kept" else "02"
    headers: list[dict[str, str]] = [
        {"traceparent":
         f"00-{random.getrandbits(128):032x}-{random.getrandbits(64):016x}-{flags}"}
        if mode not in ("new", "keptnew") else {} for _ in range(n)]
    messages = [Message(f"{1764000000000 + i}-0", StreamId("orders", f"k{i}"), b"{}",
                        headers=h, token=SequenceToken(i % 1000, 1764000000000 + i))
                for i, h in enumerate(headers)]
    enter, leave = consumer.enter, consumer.leave
    if mode == "least":
        variable, key = trace_context.variable, trace_context.SPAN_KEY
        assert variable is not None
        set_, reset = variable.set, variable.reset
        parents = [h["traceparent"] for h in headers]
        CG.cg_toggle()  # type: ignore[attr-defined]
        for header in parents:
            reset(set_(Context({key: RemoteSpan(header)})))
        CG.cg_toggle()  # type: ignore[attr-defined]
        return
    CG.cg_toggle()  # type: ignore[attr-defined]
    for msg in messages:
        leave(enter(msg))
    CG.cg_toggle()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
