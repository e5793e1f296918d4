"""The console's charts from its own polls: a daemon's rate is taken between its
heartbeats and held in between, so polls faster than heartbeats draw a steady line."""

from __future__ import annotations

from conveyor.console.poller import Sample, rates


def sample(at: float, beat: float, handled: int, dead: int = 0, lag: int = 0,
           daemon: str = "d1") -> Sample:
    return Sample(at, {daemon: (beat, handled, dead)}, {0: lag})


def test_a_rate_between_heartbeats_is_held_while_polls_see_the_same_heartbeat() -> None:
    # Polled every 0.5 s; the daemon heartbeats every 1.5 s, handling 100/s.
    polls = [sample(t * 0.5, (t // 3) * 1.5, int((t // 3) * 150), lag=600 - 25 * t)
             for t in range(10)]
    points = rates(polls)
    assert len(points) == 9
    assert [p["handled_per_s"] for p in points[:2]] == [0, 0]  # one heartbeat: no rate yet
    assert all(p["handled_per_s"] == 100 for p in points[2:])
    assert points[-1]["lag"] == {"0": 375}


def test_a_restarted_daemon_never_draws_a_negative_rate() -> None:
    polls = [sample(0, 0, 500, dead=5), sample(1, 1, 600, dead=6),
             sample(2, 2, 10, dead=0, daemon="d1")]  # restarted: counts from zero
    points = rates(polls)
    assert points[0]["handled_per_s"] == 100 and points[0]["dead_per_s"] == 1
    assert points[1]["handled_per_s"] == 0 and points[1]["dead_per_s"] == 0


def test_rates_are_summed_over_the_daemons_of_the_app() -> None:
    polls = [Sample(0, {"a": (0, 0, 0), "b": (0, 0, 0)}, {}),
             Sample(1, {"a": (1, 30, 1), "b": (1, 20, 0)}, {})]
    (point,) = rates(polls)
    assert (point["handled_per_s"], point["dead_per_s"]) == (50, 1)
