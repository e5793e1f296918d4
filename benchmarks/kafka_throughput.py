"""Kafka throughput and I/O-bound concurrency, with the floors measured in the same run.

    python benchmarks/kafka_throughput.py [--bootstrap HOST:PORT] [--messages N]

Without --bootstrap a private tansu broker (memory storage) is started. Prints the
table, then the JSON line; see conveyor/bench/kafka_throughput.py for what is timed.
"""

from __future__ import annotations

import argparse
import json

from conveyor.bench.kafka_throughput import kafka_throughput


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--io-messages", type=int, default=20_000)
    args = parser.parse_args()
    report = kafka_throughput(args.messages, args.streams, args.repeats, args.bootstrap,
                              args.io_messages)
    print(report.table())
    print(json.dumps(report.as_dict()))


if __name__ == "__main__":
    main()
