"""Names that reach a broker's key space are whole-string matches: no trailing newline."""

from __future__ import annotations

import pytest

from conveyor.adapters.redis.keys import Keys, check_name
from conveyor.platform.app import App
from conveyor.platform.errors import ConfigError, HandlerDeclarationError

BAD = ["conveyor\n", "a\nb", "", "a:b", "a*", "a b", "é", "x" * 129, "\nconveyor"]
GOOD = ["conveyor", "shop-1", "a.b_c", "x" * 128]


@pytest.mark.parametrize("name", BAD)
def test_a_redis_prefix_or_app_name_that_is_not_a_whole_name_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=r"\$.redis.prefix"):
        Keys(name)
    with pytest.raises(ConfigError, match="app name"):
        check_name(name, "app name")
    with pytest.raises(HandlerDeclarationError, match="app name"):
        App(name)


@pytest.mark.parametrize("name", GOOD)
def test_plain_names_are_accepted_everywhere(name: str) -> None:
    assert Keys(name).queue(3) == f"{name}:q:3"
    assert check_name(name, "app name") == name
    assert App(name).name == name
