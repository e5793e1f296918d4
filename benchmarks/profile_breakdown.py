"""Where a consumer's CPU goes, per message, from a py-spy profile of a benchmark run.

py-spy is not a dependency of Conveyor; install it where you like, then::

    py-spy record -r 1000 -f raw -o /tmp/redis.txt -- \\
        .venv/bin/conveyor bench throughput --adapter redis --daemons 1 --repeats 3
    .venv/bin/python benchmarks/profile_breakdown.py /tmp/redis.txt

Only samples taken inside the daemon's agents are counted (pulling, running,
acknowledging); publishing and the raw floor loops are left out. Each sample goes to the
bucket of the innermost frame that belongs to one (so a handler's own time is
"handler", the decoder's "decode", and time in redis-py or aiokafka called from the
agent is "broker client"). Prints each bucket's share of the consumer's samples.
"""

from __future__ import annotations

import collections
import re
import sys

ROOTS = ("PullingAgent._runner", "PullingAgent._pull_loop", "PullingAgent._ack_loop",
         "PullingAgent._flush_acks")

# (bucket, pattern on "function (file)"), first match from the innermost frame outwards.
BUCKETS = [
    ("handler (the no-op)", r"noop|first_delivery_app"),
    ("decode: entry/record -> Message", r"EntryDecoder|RecordDecoder|decode_entry|"
     r"record_to_message|decode_record|RedisReceiver\._read|MemoryReceiver\._take"),
    ("decode: body -> handler argument", r"_body_decoder"),
    ("delivery chain (dead letter, decode, retry)", r"conveyor/platform/delivery/"),
    ("slots (reserve, release)", r"conveyor/platform/slots\.py|workers/slots/(fixed|wrappers)\.py"),
    ("acknowledge (adapter side)", r"acknowledge|RedisReceiver\._ack|_trim|"
     r"KafkaReceiver\.acknowledge|kafka/offsets\.py"),
    ("pull, adapter side (receiver's own code)",
     r"Receiver\.get_messages|adapters/(kafka|redis)/receiver\.py|adapters/memory\.py"),
    ("agent: cache, lanes, acks bookkeeping", r"conveyor/platform/(agent|queue_cache)\.py"),
    ("broker client (redis-py / aiokafka)", r"(site-packages/|\()(redis|aiokafka|hiredis)/"),
    ("event loop and sockets", r"asyncio/|selectors\.py|socket"),
]


def breakdown(path: str) -> tuple[int, collections.Counter[str]]:
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    with open(path, encoding="utf-8") as lines:
        rows = [line.rstrip().rpartition(" ") for line in lines]
    for stack, _, n in rows:
        frames = stack.split(";")
        if not any(root in frame for frame in frames for root in ROOTS):
            continue
        samples = int(n)
        total += samples
        for frame in reversed(frames):
            bucket = next((name for name, pattern in BUCKETS if re.search(pattern, frame)), None)
            if bucket is not None:
                counts[bucket] += samples
                break
        else:
            counts["other"] += samples
    return total, counts


def main() -> None:
    for path in sys.argv[1:]:
        total, counts = breakdown(path)
        print(f"{path}: {total} samples in the agents")
        for name, n in counts.most_common():
            print(f"  {100 * n / max(total, 1):5.1f} %  {name}")


if __name__ == "__main__":
    main()
