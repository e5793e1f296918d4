"""What the operator commands print as tables: ``status``, ``groups list``, ``dlq list``.

Tables fit 80 columns by default: the columns an operator reads first, short headings,
numbers right-aligned, no vertical rules; ``--wide`` adds the rest for a wide terminal
(``--json``, printed by the commands themselves, gives everything). Each view takes what
the library read (:mod:`conveyor.platform.operations.status`,
:mod:`conveyor.platform.operations.groups`, :mod:`conveyor.platform.operations.dlq`) and
returns a rich renderable; :func:`print_table` prints one, plain when stdout is not a
terminal.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import click

from conveyor.platform.letters import StoredLetter
from conveyor.platform.terminal import visible

ERROR_WIDTH = 60
"""Characters of the error text the ``--wide`` table shows (``--json`` and ``show`` give
it all); the compact table cuts it to the terminal's width, one line per letter."""

STREAM_WIDTH = 120
"""Characters of a letter's stream the ``dlq list`` tables show: a stream key is the
producer's (a Kafka record key may be a megabyte); ``show`` and ``--json`` give it all."""

# -- the pieces ------------------------------------------------------------------------
def titled(title: str, table: Any | None, notes: Sequence[Any] = ()) -> Any:
    """A table under a title line, with notes under it: lines of the terminal's width,
    not wrapped to the table's. No table (nothing to list): the title alone."""
    from rich.console import Group
    from rich.text import Text

    shown = [Text(title, style="bold")]
    if table is not None and table.row_count:
        shown.append(table)
    shown += [n if isinstance(n, Text) else Text(n) for n in notes]
    return Group(*shown)


def print_table(renderable: Any, *, whole_rows: bool = False) -> None:
    """Print a rich table on stdout: styled on a terminal; plain, without the padding
    rich puts at the end of lines, for a pipe or a file (grep, diff, docs).

    ``whole_rows`` (``--wide``): at least as wide as its rows need, never cutting a
    heading or a cell to fit a narrower terminal (which then wraps the lines)."""
    from rich.console import Console

    console = Console()
    if whole_rows:
        fit_rows(console, renderable)
    if console.is_terminal:
        console.print(renderable)
        return
    with console.capture() as captured:
        console.print(renderable)
    click.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))


def fit_rows(console: Any, renderable: Any) -> None:
    """Widen ``console`` to what ``renderable`` needs to print every row whole."""
    from rich.measure import Measurement

    unbounded = console.options.update_width(10_000)
    needed = Measurement.get(console, unbounded, renderable).maximum
    console.width = max(console.width, needed)


def _table(*columns: Any) -> Any:
    from rich import box

    return _safe_table()(*columns, box=box.SIMPLE_HEAD, show_edge=False)


@functools.cache
def _safe_table() -> Any:
    """A rich ``Table`` whose text cells are shown as they are. Cells hold producers' and
    brokers' text (stream keys, error texts, group names): rich would read ``[/x]`` in
    one as markup (a ``MarkupError`` ended ``dlq list`` in a traceback) and ``:smile:``
    as an emoji, and print its escape sequences raw; each is a plain ``Text`` with its
    control characters escaped (:func:`~conveyor.platform.terminal.visible`)."""
    from rich.table import Table
    from rich.text import Text

    class SafeTable(Table):
        def add_row(self, *renderables: Any, **options: Any) -> None:
            super().add_row(*(Text(visible(r)) if isinstance(r, str) else r
                              for r in renderables), **options)

    return SafeTable


def _right(heading: str) -> Any:
    from rich.table import Column

    return Column(heading, justify="right")


def _whole(heading: str) -> Any:
    """A column whose values are never cut (ids that logs carry, names to type into
    --app): one line each while the table fits; a value too wide for the terminal folds
    over lines rather than taking the width of every other column (a 120-character app
    name left `status` showing the name cut and no lag)."""
    from rich.table import Column

    return Column(heading, overflow="fold", min_width=len(heading))


def _age(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.1f}s"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _plural(count: int | None, word: str) -> str:
    return f"{_num(count)} {word}(s)"


def utc_time(ms: int) -> str:
    """A time in milliseconds since the epoch, in UTC to the second."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


# -- status and groups -------------------------------------------------------------------
def status_view(report: Any, rates: dict[int, float], wide: bool = False) -> Any:
    """The three tables of ``conveyor status --app``: daemons, queues, groups."""
    from rich.console import Group

    from conveyor.platform.operations.groups import queue_ranges

    title = (f"app {report.group}: {_plural(len(report.members), 'daemon')}, "
             f"{_plural(report.dead_letters, 'dead letter')} stored, "
             f"lag {report.total_lag:,}")
    settings = [f"{name} {value}" for name, value in (
        ("maxmemory-policy", report.eviction_policy), ("persistence", report.persistence),
    ) if value is not None]
    if settings:  # a line of its own: on the first one it would wrap at 80 columns
        title += "\nredis: " + ", ".join(settings)
    members = _table(_whole("daemon"), "queues", _right("slots"), _right("handled"),
                     _right("dead"), _right("skipped"))
    if wide:
        for heading in ("host", "pid", "version", "p95", "stalls", "pools / cells (workers)"):
            members.add_column(heading, justify="right" if heading in ("p95", "stalls")
                               else "left")
    notes: list[Any] = []
    for m in report.members:
        st = m.stats
        row = [m.id, queue_ranges(m.queues) or "-",
               f"{_num(st.get('slots.in_use'))}/{_num(st.get('slots.available'))}",
               _num(st.get("handled")), _num(st.get("dead_lettered")), _num(st.get("skipped"))]
        if wide:
            hosted = ", ".join(
                f"{k.split('.', 1)[1].rsplit('.', 1)[0]}={v:.0f}" for k, v in sorted(st.items())
                if k.startswith(("pool.", "cell.")) and k.endswith(".workers")
            )
            p95 = st.get("latency.p95_s")
            row += [m.host, str(m.pid) if m.pid else "-", m.version or "-",
                    "-" if p95 is None else f"{p95 * 1000:,.1f}ms",
                    _num(st.get("loop.stalls")), hosted or "-"]
        members.add_row(*row)
        notes += _member_warnings(m.id, st)
    if report.members:
        notes.insert(0, "slots: in use/available; dead: dead-lettered")
    queues = _table(_right("queue"), _whole("owner"), _right("lag"), _right("cache"),
                    _right("acks/s"))
    for q in report.queues:
        rate = rates.get(q.queue)
        queues.add_row(str(q.queue), q.owner or "-", f"{q.lag:,}", _num(q.cache_fill),
                       "-" if rate is None else f"{rate:,.0f}")
    queues.add_row("total", "", f"{report.total_lag:,}", "", "")
    groups = groups_view(report.groups, report.retention_follows_groups, report.at)
    return Group(titled(title, members, notes), "", queues, "", groups)


def _member_warnings(member: str, st: dict[str, float]) -> list[Any]:
    """Lines under the daemons table for what needs a look: a daemon draining or not
    ready, messages the broker deleted unhandled, loop stalls, calls waiting on the rate
    limit, the dead-letter store."""
    from rich.text import Text

    from conveyor.platform.operations.status import lost_line, records_lost

    out = []
    if st.get("draining"):
        out.append(Text(f"{member}: draining (stopping: its queues go to the others)"))
    elif st.get("ready") == 0:
        out.append(Text(f"{member}: not ready (taking its queues, or failed: /readyz "
                        "says why)", style="yellow"))
    out += [Text(lost_line(member, queue, count), style="red")
            for queue, count in records_lost(st)]
    if st.get("loop.stalls"):
        out.append(Text(f"{member}: {st['loop.stalls']:.0f} loop stall(s): a handler blocked "
                        "the event loop (its log names the handler and message)",
                        style="yellow"))
    if st.get("rate.waiting"):
        out.append(Text(f"{member}: {st['rate.waiting']:.0f} call(s) waiting for the rate "
                        f"limit ({st.get('rate.limit_per_s', 0):,.0f}/s)"))
    if st.get("dead_letters.down_s") is not None:
        out.append(Text(f"{member}: the dead-letter store has failed for "
                        f"{_age(st['dead_letters.down_s'])}; "
                        f"{st.get('dead_letters.waiting', 0):.0f} message(s) wait "
                        "unacknowledged", style="red"))
    if st.get("dead_letters_evicted"):
        out.append(Text(f"{member}: {st['dead_letters_evicted']:.0f} dead letter(s) evicted "
                        "by [dead_letters] max_entries"))
    return out


def groups_view(groups: list[Any], retention_follows_groups: bool, now: float) -> Any:
    """Every app's group: lag, last read, members, and whom trimming waits for.

    "last read" (Redis) and "members" (Kafka) are shown where the backend tells them."""
    from conveyor.platform.operations.groups import queue_ranges

    read = any(g.idle_s is not None for g in groups)
    members = any(g.members is not None for g in groups)
    table = _table(_whole("group"), "queues", _right("lag"))
    if read:
        table.add_column("last read", justify="right")
    if members:
        table.add_column("members", justify="right")
    table.add_column("holds retention")
    for g in groups:
        held = "-"
        if g.holds_retention:
            held = queue_ranges(g.holds_retention)
            if g.oldest_needed_ms is not None:
                held += f" (oldest {_age(now - g.oldest_needed_ms / 1000)})"
        row = [g.group, queue_ranges(g.queues), f"{g.lag:,}"]
        if read:
            row.append("-" if g.idle_s is None else f"{_age(g.idle_s)} ago")
        if members:
            row.append(_num(g.members))
        table.add_row(*row, held)
    holders = [g.group for g in groups if g.holds_retention]
    if not retention_follows_groups:
        note = "retention goes by time or size here: no group holds it back"
    elif holders:
        note = f"trimming waits for: {', '.join(holders)}"
    else:
        note = "no group holds retention back"
    title = (f"{_plural(len(groups), 'consumer group')} on these queues (every app)"
             if groups else "no consumer group on these queues")
    return titled(title, table, [note] if groups else [])


def apps_view(report: Any) -> Any:
    """``conveyor status`` without ``--app``: every app found on the queues."""
    from conveyor.platform.operations.groups import queue_ranges

    table = _table(_whole("app"), _right("daemons"), "queues", _right("lag"),
                   _right("last read"), _right("dead letters"))
    for a in report.apps:
        table.add_row(a.app, _num(a.daemons), queue_ranges(a.queues), f"{a.lag:,}",
                      "-" if a.idle_s is None else f"{_age(a.idle_s)} ago",
                      _num(a.dead_letters))
    if not report.apps:
        return titled("no app on these queues yet (no consumer group on any of them)", None)
    return titled(f"{_plural(len(report.apps), 'app')} on these queues", table,
                  ["`conveyor status --app NAME`: one app's daemons and queues"])


# -- dead letters ------------------------------------------------------------------------
def letters_view(found: list[StoredLetter], group: str, total: int, wide: bool,
                 width: int, *, more: bool = False, filtered: bool = False,
                 shows_more: str = "--limit") -> Any:
    """One line per letter. Compact: id, stream, time (to the minute) and "Type: error"
    cut to what ``width`` leaves it; ``wide``: handler, error type and text apart,
    attempts, the time to the second and the letter it replays. ``more``: the limit
    left letters out, and ``shows_more`` is the option that shows them; ``filtered``:
    ``found`` is what the filters kept of ``total``."""
    from rich import box
    from rich.table import Column

    columns: list[Column | str]
    if wide:
        columns = [Column("id", no_wrap=True), "stream", "handler", "error type", "error",
                   Column("attempts", justify="right"),
                   Column("failed at (UTC)", no_wrap=True), "replay of"]
    else:
        columns = [Column("id", no_wrap=True), Column("stream", overflow="fold"),
                   Column("failed (UTC)", no_wrap=True),
                   Column("error", no_wrap=True, overflow="ellipsis")]
        # What the other columns take (each padded by 1 a side, 1 between two), so that
        # the error gets the rest and the row stays one line; a long stream folds
        # (STREAM_WIDTH at most).
        others = (max((len(s.id) for s in found), default=2)
                  + min(max((len(str(s.letter.message.stream)) for s in found), default=6), 24)
                  + len("failed (UTC)") + 2 * 4 + 3)
        error_width = max(width - others, 16)
    table = _safe_table()(*columns, box=box.SIMPLE_HEAD, show_edge=False)
    for stored in found:
        letter = stored.letter
        if wide:
            table.add_row(stored.id, _cut(str(letter.message.stream), STREAM_WIDTH),
                          letter.handler or "-",
                          letter.error_type or "-", _cut(letter.error, ERROR_WIDTH),
                          str(letter.attempts),
                          utc_time(letter.failed_at_ms), stored.replay_of or "-")
        else:
            error = " ".join(letter.reason.split())
            table.add_row(stored.id, _cut(str(letter.message.stream), STREAM_WIDTH),
                          utc_time(letter.failed_at_ms)[5:16], _cut(error, error_width))
    notes = [] if wide or not found else [
        "`dlq show ID` or --json: a letter in full; --wide: more columns"]
    kept = "match --handler/--namespace/--error-type"
    if more:
        notes.insert(0, f"showing the first {len(found)} that {kept}; {shows_more} shows more"
                     if filtered else f"showing {len(found)} of {total}; {shows_more} shows more")
    elif filtered:
        notes.insert(0, f"{len(found)} of {total} {kept}")
    return titled(f"app {group}: {total} dead letter(s)", table, notes)
