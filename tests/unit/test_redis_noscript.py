"""Which script calls of a publishing round are sent again after NOSCRIPT
(conveyor.adapters.redis.adapter._unknown_script_tails): only a queue's last chunks,
all refused, so that sending them again keeps the queue's order."""

from __future__ import annotations

import redis.exceptions as rex

from conveyor.adapters.redis.adapter import _QueueSend, _unknown_script_tails
from conveyor.adapters.redis.codec import PUBLISH_CHUNK
from conveyor.adapters.redis.keys import Keys
from conveyor.platform.ids import StreamId
from conveyor.platform.message import Message

STORED = [b"1-0 1", 0]


def send(queue: int, chunks: int) -> _QueueSend:
    messages = [Message(f"m{queue}-{i}", StreamId("n", "k"), b"{}")
                for i in range(PUBLISH_CHUNK * (chunks - 1) + 1)]
    out = _QueueSend(queue, messages, Keys("t"), 1000)
    assert len(out.calls) == chunks
    return out


def noscript() -> rex.NoScriptError:
    return rex.NoScriptError("No matching script. Please use EVAL.")


def test_only_a_queues_refused_tail_is_sent_again() -> None:
    sends = [send(0, 3), send(1, 3), send(2, 1), send(3, 2)]
    replies = [
        STORED, noscript(), noscript(),   # queue 0: its last two refused: again
        noscript(), STORED, noscript(),   # queue 1: a chunk stored after a refused one
        noscript(),                       # queue 2: its only chunk: again
        STORED, STORED,                   # queue 3: all stored
    ]
    assert _unknown_script_tails(sends, replies) == [1, 2, 6]


def test_a_round_the_server_ran_none_of_is_sent_again_whole() -> None:
    sends = [send(0, 2), send(1, 1)]
    assert _unknown_script_tails(sends, [noscript()] * 3 + [1]) == [0, 1, 2]  # + WAIT's


def test_other_errors_are_not_sent_again() -> None:
    sends = [send(0, 2)]
    assert _unknown_script_tails(sends, [STORED, rex.ResponseError("OOM")]) == []
