"""How the outcomes of a publish's sends become the one error its caller sees."""

from __future__ import annotations

import pytest

from conveyor.platform.errors import (
    BrokerError,
    InvalidArgumentError,
    PartialPublishError,
    PublishUncertain,
)
from conveyor.platform.ids import SequenceToken
from conveyor.platform.partial_publish import publish_failure

IDS = ["a", "b", "c", "d"]
REFUSED = BrokerError("refused")


def test_nothing_stored_and_nothing_in_doubt_raises_the_sends_own_error() -> None:
    assert publish_failure("p", IDS, {}, [(["a", "b"], REFUSED), (["c", "d"], REFUSED)]) \
        is REFUSED


def test_one_send_that_held_the_whole_publish_keeps_its_error() -> None:
    unsure = PublishUncertain("cut", tuple(IDS))
    assert publish_failure("p", IDS, {}, [(IDS, unsure)]) is unsure


def test_only_doubt_from_several_sends_is_one_publish_uncertain_with_every_id() -> None:
    error = publish_failure("p", IDS, {}, [(["a", "b"], PublishUncertain("cut")),
                                           (["c", "d"], PublishUncertain("cut"))])
    assert type(error) is PublishUncertain
    assert error.message_ids == tuple(IDS)


def test_some_stored_names_each_message_and_hands_back_the_items_to_publish_again() -> None:
    token = SequenceToken(0, 1, 0)
    inner = PartialPublishError("inner", ["c", "d"], {"c": token}, {"d": REFUSED})
    error = publish_failure("publish_batch", IDS, {"a": token},
                            [(["b"], PublishUncertain("cut")), (["c", "d"], inner)])
    assert isinstance(error, PartialPublishError)
    assert error.ids == tuple(IDS)
    assert error.published == {"a": token, "c": token}
    assert error.failed == {"d": REFUSED}
    assert error.uncertain == ("b",)
    assert str(error).startswith("publish_batch: 2 of the 4 messages were stored, 1 were not")
    assert error.not_published(["A", "B", "C", "D"]) == ["D"]
    with pytest.raises(InvalidArgumentError):
        error.not_published(["A"])
