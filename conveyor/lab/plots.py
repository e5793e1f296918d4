"""PNG plots for the lab commands (Matplotlib, headless ``Agg`` backend)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.lab.balancer_sim import BalancerSimResult
    from conveyor.lab.placement_sim import PlacementStats
    from conveyor.lab.sim import Comparison

STATIC_COLOUR = "tab:blue"
DYNAMIC_COLOUR = "tab:red"


def _save(plt: Any, fig: Any, out: Path) -> None:
    """Write ``fig`` to ``out`` as a PNG, whatever the file's name, and close it.

    Rendered in memory, then written here: Matplotlib chose the format from the name
    (``plot.txt`` raised "Format 'txt' is not supported"), and, writing the file
    itself, lost the write's error (``/dev/full``, a full disk: no error, a cut file).
    An error writing is an :class:`OSError` for the caller."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=90)
    finally:
        plt.close(fig)
    out.write_bytes(buffer.getvalue())


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_comparison(cmp: Comparison, title: str, out: Path) -> None:
    """Four panels over time: message rate, workers, queue length, average waiting count;
    static (wide, pale blue) under dynamic (dashed red), their means as dotted lines."""
    plt = _pyplot()
    fig, axes = plt.subplots(4, 1, figsize=(13, 11), sharex=True)
    s, d = cmp.static, cmp.dynamic
    axes[0].plot(s.time_s, s.rate, color="tab:green", linewidth=0.8)
    axes[0].set_ylabel("messages / s")
    axes[0].set_title("Message rate")
    panels = (
        (axes[1], "Worker count", "workers", s.workers, d.workers),
        (
            axes[2],
            "Queue length (accepted, not started)",
            "messages",
            s.queue_length,
            d.queue_length,
        ),
        (axes[3], "Average waiting count per worker", "messages", s.avg_waiting, d.avg_waiting),
    )
    for ax, panel_title, unit, ys, yd in panels:
        # Where the two runs agree (burst's queue, every run's first seconds) the lines
        # coincide: static is drawn wide and pale underneath, dynamic thin and dashed on
        # top, so both stay visible.
        ax.plot(s.time_s, ys, color=STATIC_COLOUR, linewidth=2.6, alpha=0.45, label="static",
                zorder=2)
        ax.plot(d.time_s, yd, color=DYNAMIC_COLOUR, linewidth=0.9, linestyle=(0, (4, 2)),
                label="dynamic", zorder=3)
        ax.axhline(
            float(ys.mean()),
            color=STATIC_COLOUR,
            linestyle=":",
            linewidth=1.2,
            label=f"static mean {float(ys.mean()):.2f}",
        )
        ax.axhline(
            float(yd.mean()),
            color=DYNAMIC_COLOUR,
            linestyle=":",
            linewidth=1.2,
            label=f"dynamic mean {float(yd.mean()):.2f}",
        )
        ax.set_title(panel_title)
        ax.set_ylabel(unit)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].grid(alpha=0.3)
    axes[3].set_xlabel("time (s)")
    fig.suptitle(title)
    fig.tight_layout()
    _save(plt, fig, out)


def plot_filter(
    raw: Sequence[float],
    filtered: Sequence[float],
    title: str,
    out: Path,
    extra: dict[str, Sequence[float]] | None = None,
) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(11, 4.5))
    ax.plot(raw, color="tab:blue", linewidth=0.6, alpha=0.7, label="raw i(n)")
    for name, series in (extra or {}).items():
        ax.plot(series, color="black", linewidth=1.0, linestyle="--", label=name)
    ax.plot(filtered, color="tab:orange", linewidth=1.4, label="CDM-KF o(n)")
    ax.set_xlabel("sample n")
    ax.set_ylabel("CPU %")
    ax.set_title(title)
    ax.legend(loc="lower left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(plt, fig, out)


def plot_placement(
    stats: Sequence[PlacementStats], balls_per_bin: int, out: Path, trials: int
) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharex=True)
    colours = {"random": "tab:gray", "k2": "tab:blue", "ksqrt": "tab:red", "jsq": "tab:green"}
    labels = {"random": "random", "k2": "K=2", "ksqrt": "K=ceil(sqrt n)", "jsq": "JSQ (K=n)"}
    for stale, style in ((False, "-"), (True, "--")):
        for strategy, colour in colours.items():
            rows = [s for s in stats if s.strategy == strategy and s.stale == stale]
            ns = [r.n for r in rows]
            tag = "stale" if stale else "fresh"
            axes[0].plot(
                ns,
                [r.max_load for r in rows],
                style,
                color=colour,
                marker=".",
                label=f"{labels[strategy]}, {tag}",
            )
            axes[1].plot(ns, [r.spread for r in rows], style, color=colour, marker=".")
    for ax, name in ((axes[0], "maximum load"), (axes[1], "spread (max - min)")):
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_xlabel("daemons n")
        ax.set_ylabel(f"{name}, balls")
        ax.set_title(f"{name}, {balls_per_bin}·n balls (mean load {balls_per_bin})", fontsize=10)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"power-of-K placement, mean of {trials} trials per point")
    fig.tight_layout()
    _save(plt, fig, out)


def plot_balancer(result: BalancerSimResult, out: Path) -> None:
    """Three panels over (virtual) time: the store's operations and bytes per second, and
    the queues not held by exactly one live daemon; the scenario's events marked."""
    plt = _pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(12, 8.5), sharex=True)
    ops, nbytes = result.timeline["total"], result.timeline["bytes"]
    axes[0].plot([t for t, _ in ops], [n for _, n in ops], color=DYNAMIC_COLOUR, linewidth=1)
    axes[0].set_ylabel("store ops / s")
    axes[0].set_title("Store operations (all daemons; 1 s bins)")
    axes[0].set_ylim(bottom=0)
    axes[1].plot([t for t, _ in nbytes], [n for _, n in nbytes], color="tab:purple",
                 linewidth=1)
    axes[1].set_ylabel("bytes / s")
    axes[1].set_yscale("log")
    axes[1].set_title("Store traffic, requests and replies (1 s bins)")
    unsettled = result.timeline["unsettled"]
    axes[2].step([t for t, _ in unsettled], [n for _, n in unsettled], where="post",
                 color=STATIC_COLOUR, linewidth=1)
    axes[2].set_ylabel("queues")
    axes[2].set_title("Queues not held by exactly one live daemon")
    axes[2].set_xlabel("time, s (virtual)")
    axes[2].set_yscale("symlog", linthresh=1.0)
    for ax in axes:
        for t, label in result.markers:
            ax.axvline(t, color="gray", linestyle=":", linewidth=0.8)
            ax.annotate(label, (t, 1.0), xycoords=("data", "axes fraction"), fontsize=8,
                        rotation=90, va="top", ha="right", color="gray")
        ax.grid(alpha=0.3)
    cfg = result.config
    fig.suptitle(f"dynamic balancer: {cfg.daemons} daemons x {cfg.queues} queues "
                 f"(seed {cfg.seed})")
    fig.tight_layout()
    _save(plt, fig, out)
