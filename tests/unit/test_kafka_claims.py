"""Which claim holds a Kafka dead letter (conveyor/adapters/kafka/letters.py `_Ops`):
every replay reads the ops topic in the same order, so the rule must be a function of
the records alone. A claim takes a letter over only by naming the run that holds it (the
first to name it wins); claims written before that field existed go by age."""

from __future__ import annotations

from conveyor.adapters.kafka.letters import CLAIM_TTL_S, LetterOp, _Ops

TTL_MS = int(CLAIM_TTL_S * 1000)


def claim(run: str, at_ms: int, over: str = "", v: int = 2) -> LetterOp:
    return LetterOp("replaying", ["0:1"], 0, 10, run, at_ms, "m/1/1", over, v)


def holder(*ops: LetterOp) -> str:
    state = _Ops()
    for op in ops:
        state.apply(op)
    return state.replaying["0:1"].run


def test_the_first_claim_holds_however_much_later_another_comes() -> None:
    assert holder(claim("a", 0), claim("b", 10 * TTL_MS)) == "a"


def test_a_takeover_names_the_run_it_takes_over_and_the_first_such_wins() -> None:
    assert holder(claim("a", 0), claim("b", 5, over="a")) == "b"
    assert holder(claim("a", 0), claim("b", 5, over="a"), claim("c", 6, over="a")) == "b"
    assert holder(claim("a", 0), claim("b", 5, over="x")) == "a"


def test_claims_written_before_takeovers_were_named_go_by_age() -> None:
    assert holder(claim("a", 0, v=1), claim("b", TTL_MS - 1, v=1)) == "a"
    assert holder(claim("a", 0, v=1), claim("b", TTL_MS, v=1)) == "b"


def test_a_run_that_said_it_stopped_is_known_stopped_and_replayed_letters_are_removed() -> None:
    state = _Ops()
    for op in (claim("a", 0), LetterOp("stopped", [], run="a"),
               LetterOp("replayed", ["0:2"])):
        state.apply(op)
    assert state.stopped == {"a"} and "0:1" in state.replaying
    assert state.removed == {"0:2"}
