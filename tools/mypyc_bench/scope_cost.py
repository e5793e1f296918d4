"""Instructions a message of a consumer span's scope on a dropped trace, ``ConsumerScope``'s
``enter`` and ``leave`` in a loop that does nothing else (callgrind).

``parent``: each message carries its own ``traceparent`` whose flags say "not
sampled" (the producer dropped the trace); ``new``: no header, and a sampler of 0, so
that each message starts a new trace the ratio drops; ``least``: the least a dropped
parent's context can take, each header's ``RemoteSpan`` in a new ``Context`` set and
reset on the context variable, nothing else. The messages and their headers
are built before collection is toggled on, so under

    valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file=X \\
        python scope_cost.py parent|new|least N

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

from conveyor.platform.delivery import tracing
from conveyor.platform.ids import StreamId
from conveyor.platform.message import Message
from conveyor.platform.sampling import RemoteSpan


def main(mode: str, n: int) -> None:
    consumer = scope(0.0 if mode == "new" else 0.1, True)
    headers: list[dict[str, str]] = [
        {"traceparent": f"00-{random.getrandbits(128):032x}-{random.getrandbits(64):016x}-02"}
        if mode != "new" else {} for _ in range(n)]
    messages = [Message(f"m-{i}", StreamId("orders", f"k{i}"), b"{}", headers=h)
                for i, h in enumerate(headers)]
    enter, leave = consumer.enter, consumer.leave
    if mode == "least":
        variable, key = tracing._variable, tracing._SPAN_KEY
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
