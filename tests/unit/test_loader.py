"""``FILE.py:attr`` never replaces another module, whatever the file is called."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.loader import load_app
from conveyor.platform.errors import ConveyorError

APP = """\
import conveyor

app = conveyor.App("shadow")


@app.handler("orders")
async def on_order(order: dict) -> None: ...
"""


@pytest.fixture
def clean_modules() -> Iterator[None]:
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:  # the app files this module's tests loaded
        if "." not in name and (name.endswith("_app") or name == "shop_orders"):
            del sys.modules[name]


@pytest.mark.parametrize("stem", ["redis", "json", "msgspec", "click", "queue"])
def test_an_app_file_named_like_a_dependency_loads_without_shadowing_it(
    tmp_path: Path, clean_modules: None, stem: str
) -> None:
    real = importlib.import_module(stem)
    path = tmp_path / f"{stem}.py"
    path.write_text(APP)
    app = load_app(f"{path}:app")
    assert app.name == "shadow"
    assert sys.modules[stem] is real, f"{stem}.py replaced the real {stem}"
    assert sys.modules[f"{stem}_app"].__file__ == str(path)
    assert app.handlers[0].name == f"{stem}_app.on_order", "the same in every process"
    assert load_app(f"{path}:app").name == "shadow", "loading it again works"


def test_an_app_file_with_a_free_name_keeps_it(tmp_path: Path, clean_modules: None) -> None:
    path = tmp_path / "shop_orders.py"
    path.write_text(APP)
    app = load_app(f"{path}:app")
    assert app.handlers[0].name == "shop_orders.on_order"
    assert sys.modules["shop_orders"].__file__ == str(path)


def test_a_module_without_the_app_says_the_attribute_is_missing_and_where_it_looked() -> None:
    with pytest.raises(ConveyorError, match=r"cannot load 'redis:app': module 'redis' "
                                            r"\(from .*redis/__init__.py\) has no attribute "
                                            r"'app'$"):
        load_app("redis:app")


def test_an_attribute_that_is_not_an_app_names_its_type() -> None:
    with pytest.raises(ConveyorError, match=r"'Redis' is \w+, not a conveyor.App "
                                            r"\(module 'redis' came from .*redis/__init__.py\)"):
        load_app("redis:Redis")
