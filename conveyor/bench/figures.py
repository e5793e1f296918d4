"""A throughput benchmark's figures: medians and spreads of its repeats, as a table or JSON.

Every repeat measures all figures (Conveyor and its floors, consuming and publishing) one
after another, so a ratio compares runs taken moments apart. ``ratio`` is the median
figure over the median floor (so ``ratio == msgs_per_s / floor_msgs_per_s`` in the JSON);
its spread is the lowest and highest ratio of a single repeat.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.bench.timing import PUBLISH_BATCH, PUBLISHERS

RATIOS = {"ratio": ("msgs_per_s", "floor_msgs_per_s"),
          "count_ratio": ("msgs_per_s", "count_floor_msgs_per_s"),
          # CPU per message of the counting loop over Conveyor's: the share of a core's
          # work per message that is the client's own, steadier on a loaded machine
          "count_cpu_ratio": ("count_floor_cpu_us_per_msg", "cpu_us_per_msg"),
          "metrics_ratio": ("metrics_msgs_per_s", "msgs_per_s"),
          # CPU per message off over on: the rate a CPU-bound worker keeps with /metrics
          # on, steadier than wall time on a loaded machine
          "metrics_cpu_ratio": ("cpu_us_per_msg", "metrics_cpu_us_per_msg"),
          "publish_ratio": ("publish_msgs_per_s", "publish_floor_msgs_per_s"),
          # against a second publish floor where the adapter has one (Kafka: send per
          # record, the producer batching as configured)
          "publish_send_ratio": ("publish_msgs_per_s", "publish_send_floor_msgs_per_s")}


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def text(self, fmt: str) -> str:
        if self.low == self.high:
            return format(self.median, fmt)
        return f"{self.median:{fmt}} ({self.low:{fmt}}..{self.high:{fmt}})"


def spreads(repeats: Sequence[Mapping[str, float]]) -> dict[str, Spread]:
    """Median and range of every figure the repeats share, with the ratios."""
    keys = [k for k in repeats[0] if all(k in r for r in repeats)]
    out = {k: Spread.of([r[k] for r in repeats]) for k in keys}
    for name, (num, den) in RATIOS.items():
        if num in out and den in out:
            per_run = [r[num] / r[den] for r in repeats]
            out[name] = Spread(out[num].median / out[den].median, min(per_run), max(per_run))
    return out


@dataclass(frozen=True)
class ThroughputResult:
    """One configuration's figures (``variant`` names what differs from the shipped file)."""

    adapter: str
    variant: str
    config: str
    messages: int
    streams: int
    queues: int
    slots: int
    figures: Mapping[str, Spread]
    repeats: int = 1
    daemons: int = 1
    """Daemons that consumed: 1 in this process, or that many ``conveyor worker`` processes."""
    floor: str = ""
    """What the awaiting consume floor is (``XREADGROUP COUNT 500 + XACK``, the no-op
    awaited per record)."""
    count_floor: str = ""
    """What the counting consume floor is (nothing awaited per record)."""
    publish_floor: str = ""
    publish_send_floor: str = ""
    """What the second publish floor is, where the adapter has one (Kafka: ``send`` per
    record); empty otherwise."""
    single_messages: int = 0
    """Messages of the single-``publish`` run (fewer than ``messages``: it is slower)."""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def median(self, name: str) -> float:
        return self.figures[name].median

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "adapter": self.adapter, "variant": self.variant, "config": self.config,
            "messages": self.messages, "streams": self.streams, "queues": self.queues,
            "slots": self.slots, "daemons": self.daemons, "repeats": self.repeats,
            "floor": self.floor, "count_floor": self.count_floor,
        }
        if self.publish_floor:
            out["publish_floor"] = self.publish_floor
            out["publish_single_messages"] = self.single_messages
        if self.publish_send_floor:
            out["publish_send_floor"] = self.publish_send_floor
        out.update({k: s.median for k, s in self.figures.items()})
        out["spread"] = {k: [s.low, s.high] for k, s in self.figures.items()}
        out.update(self.extra)
        return out

    def table(self) -> str:
        """Medians in columns, each row's min..max on a line under it (with repeats):
        80 columns at most."""
        f = self.figures
        lines = [
            f"{self.adapter}: {self.config}, variant: {self.variant}; median (min..max) of "
            f"{self.repeats} run(s)",
            f"{self.messages:,} messages over {self.streams:,} streams, {self.queues} queues, "
            f"{self.slots} slots",
            _line("consume", "msgs/s", "CPU us/msg", "start-up s"),
            *_rows("  conveyor" if self.daemons == 1 else f"  conveyor, {self.daemons} processes",
                   f, ""),
            *_rows("  raw loop, counting", f, "count_floor_"),
            *_rows("  raw loop, await each", f, "floor_"),
            *_ratio("  ratio (/ counting)", f.get("count_ratio")),
            *_ratio("  ratio (/ await each)", f["ratio"]),
            *_ratio("  CPU ratio (counting / conveyor)", f.get("count_cpu_ratio")),
        ]
        if "metrics_msgs_per_s" in f:
            lines += [*_rows("  conveyor, /metrics on", f, "metrics_"),
                      *_ratio("  ratio (/metrics on / off)", f["metrics_ratio"]),
                      *_ratio("  CPU ratio (off / on)", f["metrics_cpu_ratio"])]
        if "publish_msgs_per_s" in f:
            lines += [
                _line("publish", "msgs/s", "CPU us/msg"),
                *_rows(f"  publish_batch x{PUBLISH_BATCH}", f, "publish_"),
                *_rows(f"  publish x1 ({PUBLISHERS} tasks)", f, "publish_single_"),
                *_rows("  raw loop", f, "publish_floor_"),
                *_rows("  raw loop, send each", f, "publish_send_floor_"),
                *_ratio("  ratio (batch / raw)", f["publish_ratio"]),
                *_ratio("  ratio (batch / send)", f.get("publish_send_ratio")),
                *self._floor_lines(),
                f"raw publish loop: {self.publish_floor}",
                *([f"raw publish loop, send each: {self.publish_send_floor}"]
                  if self.publish_send_floor else []),
                f"publish x1 published {self.single_messages:,} messages",
            ]
        else:
            lines += self._floor_lines()
        return "\n".join(lines)

    def _floor_lines(self) -> list[str]:
        lines = [f"raw consume loop, await each: {self.floor}"]
        if self.count_floor:
            lines.insert(0, f"raw consume loop, counting: {self.count_floor}")
        return lines


LABEL_WIDTH = 24
CELL_WIDTHS = (24, 16, 14)
"""Label and cells of the table: 78 columns, room for a range of 8-digit rates."""


def _line(label: str, *cells: str) -> str:
    text = f"{label:{LABEL_WIDTH}}" + "".join(
        f"{c:>{w}}" for c, w in zip(cells, CELL_WIDTHS, strict=False))
    return text.rstrip()


FIGURES = (("msgs_per_s", ",.0f"), ("cpu_us_per_msg", ".2f"), ("startup_s", ".2f"))


def _rows(label: str, f: Mapping[str, Spread], prefix: str) -> list[str]:
    """The medians; then the ranges, when the repeats differ; nothing for figures the
    run did not measure."""
    found = [(f.get(prefix + key), fmt) for key, fmt in FIGURES]
    if all(s is None for s, _ in found):  # a floor this run did not measure
        return []
    lines = [_line(label, *(format(s.median, fmt) if s else "" for s, fmt in found))]
    if any(s is not None and s.low != s.high for s, _ in found):
        lines.append(_line("    min..max", *(
            f"{s.low:{fmt}}..{s.high:{fmt}}" if s else "" for s, fmt in found)))
    return lines


def _ratio(label: str, ratio: Spread | None) -> list[str]:
    """The ratio's line; none for a ratio the run did not measure."""
    return [] if ratio is None else [_line(label, ratio.text(".3f"))]
