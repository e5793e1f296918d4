"""Instructions a message of ``Client.publish_batch`` (500 a call, the bench's items) on
the memory adapter, telemetry off or on (``exporter = "otlp"`` to ``$SINK``, a sampler
of ``$RATIO``, default 0.1), callgrind's collection toggled around the publishing loop
(the calling thread's: the span recorder's posts are not counted):

    SINK=http://127.0.0.1:PORT valgrind --tool=callgrind --collect-atstart=no \\
        --callgrind-out-file=X python publish_cost.py off|on N

The slope between two N is the cost a message.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from consume_cost import CG  # callgrind's toggle (set up on import)

from conveyor.client import Client, Publish
from conveyor.platform.config import load_config


async def main(mode: str, n: int) -> None:
    over: dict[str, dict[str, object]] = {"queues": {"adapter": "memory"}}
    if mode == "on":
        over["telemetry"] = {"exporter": "otlp",
                             "sample_ratio": float(os.environ.get("RATIO", "0.1")),
                             "endpoint": os.environ["SINK"]}
    cfg = load_config(None, environ={}, overrides=over)
    items = [Publish("bench", f"s{i % 1000}", {"i": i, "pad": "x" * 32}) for i in range(n)]
    async with Client.from_config(cfg) as client:
        await client.publish_batch(items[:500])
        CG.cg_toggle()  # type: ignore[attr-defined]
        for j in range(0, n, 500):
            await client.publish_batch(items[j:j + 500])
        CG.cg_toggle()  # type: ignore[attr-defined]


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
