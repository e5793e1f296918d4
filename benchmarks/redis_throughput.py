"""Redis no-op throughput: 1 daemon and 2 daemon processes vs a raw redis-py loop.

    python benchmarks/redis_throughput.py [--redis-url URL] [--messages N] [--repeats R]

Prints the table and writes the JSON (msgs_per_s, cpu_us_per_msg, floor_msgs_per_s,
ratio, by_daemons) to stdout's last line. Without --redis-url a private redis-server
is started on a free port. The target is ratio >= 0.6.
"""

from __future__ import annotations

import argparse
import json

from conveyor.bench.redis_throughput import as_json, redis_throughput


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = redis_throughput(args.redis_url, args.messages, args.streams, args.repeats)
    for result in results.values():
        print(result.table(), end="\n\n")
    print(json.dumps(as_json(results)))


if __name__ == "__main__":
    main()
