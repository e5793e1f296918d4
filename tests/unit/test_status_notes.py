"""``conveyor status --app``'s notes under the daemons table: what in a daemon's
heartbeat needs a look (draining, not ready, loop stalls, calls held by the rate limit)
is said in a line of its own, in the default 80-column view."""

from __future__ import annotations

from rich.console import Console

from conveyor.cli.render import status_view
from conveyor.platform.operations.status import MemberStatus, StatusReport


def rendered(*members: MemberStatus, wide: bool = False) -> list[str]:
    console = Console(width=200 if wide else 80, record=True, color_system=None)
    with console.capture() as out:
        console.print(status_view(StatusReport("shop", list(members), at=1.0), {}, wide))
    return [line.rstrip() for line in out.get().splitlines()]


def member(name: str, **stats: float) -> MemberStatus:
    return MemberStatus(name, "host-1", 42, {"handled": 10.0, "ready": 1.0, **stats},
                        queues=[0, 1], version="9.9.9")


def test_a_healthy_daemon_gets_no_note() -> None:
    lines = rendered(member("shop-a", **{"loop.stalls": 0.0, "rate.waiting": 0.0}))
    assert not [line for line in lines if line.startswith("shop-a:")]


def test_draining_not_ready_stalls_and_rate_waits_are_each_a_line() -> None:
    lines = rendered(
        member("shop-a", draining=1.0, ready=0.0),
        member("shop-b", ready=0.0, **{"loop.stalls": 3.0}),
        member("shop-c", **{"rate.waiting": 7.0, "rate.limit_per_s": 1500.0}),
    )
    notes = {line.split(":", 1)[0]: line for line in lines
             if line.startswith(("shop-a:", "shop-b:", "shop-c:"))}
    assert "draining" in notes["shop-a"] and "not ready" not in notes["shop-a"]
    assert [line for line in lines if line.startswith("shop-b: not ready")]
    assert [line for line in lines
            if line.startswith("shop-b: 3 loop stall(s): a handler blocked the event loop")]
    assert notes["shop-c"] == ("shop-c: 7 call(s) waiting for the rate limit (1,500/s)")
    assert all(len(line) <= 80 for line in lines)


def test_wide_shows_version_p95_and_stalls() -> None:
    lines = rendered(member("shop-a", **{"latency.p95_s": 0.0123, "loop.stalls": 2.0}),
                     wide=True)
    [row] = [line for line in lines if line.split()[:1] == ["shop-a"]]
    assert row.split()[-4:] == ["9.9.9", "12.3ms", "2", "-"]


def test_messages_the_broker_deleted_unhandled_are_a_line_per_queue() -> None:
    lines = rendered(member("shop-a", **{"queue.3.lost": 1200.0, "queue.1.lost": 0.0}))
    assert [line for line in lines if line.startswith("shop-a:")] == [
        "shop-a: queue 3: 1,200 message(s) deleted by the broker before being handled",
    ]
