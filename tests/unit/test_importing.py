"""``"package.module:attr"`` strings load one way, and fail in one line naming the setting."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from conveyor.platform.errors import ConfigError, ConveyorError
from conveyor.platform.importing import load_attr


@pytest.fixture
def package_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("kit_raises", "kit_missing_dep", "kit_exits", "kit_base", "kit_lazy",
                 "kit_declares", "kit_bad_name"):
        sys.modules.pop(name, None)


def test_the_attribute_is_returned() -> None:
    assert load_attr("json:dumps", "$.x") is json.dumps


def test_the_type_is_checked_when_asked() -> None:
    assert load_attr("json:JSONDecoder", "$.x", expect=type) is json.JSONDecoder
    with pytest.raises(ConfigError, match=r"^\$\.x: in 'json:dumps', 'dumps' is function, "
                                          r"not a builtins\.type \(module 'json' came from "):
        load_attr("json:dumps", "$.x", expect=type)


def test_a_missing_attribute_names_the_module_and_where_it_came_from() -> None:
    with pytest.raises(ConfigError, match=r"^\$\.x: cannot load 'json:nope': module 'json' "
                                          r"\(from .*json/__init__\.py\) has no attribute 'nope'$"):
        load_attr("json:nope", "$.x")


@pytest.mark.parametrize("target", ["json", ":dumps", "json:", "", ".json:dumps", "..:dumps",
                                    "./shop:app"])
def test_a_malformed_target_quotes_the_expected_form(target: str) -> None:
    with pytest.raises(ConfigError, match=r'^\$\.slots\.path: expected "package\.module:Factory", '
                                          rf"got {target!r}$"):
        load_attr(target, "$.slots.path", form='"package.module:Factory"')


def test_a_default_attribute_fills_in_a_bare_module() -> None:
    assert load_attr("json", "$.x", default_attr="dumps") is json.dumps


def test_a_module_that_cannot_be_imported_is_one_line_of_the_chosen_error() -> None:
    with pytest.raises(ConveyorError, match=r"^app path: cannot load 'no_such_mod:app' "
                                            r"\(cannot import: No module named 'no_such_mod'\)$"):
        load_attr("no_such_mod:app", "app path", error=ConveyorError)


def test_a_module_whose_import_raises_names_the_line(package_dir: Path) -> None:
    (package_dir / "kit_raises.py").write_text("x = 1\nraise RuntimeError('no db')\n")
    with pytest.raises(ConfigError) as caught:
        load_attr("kit_raises:x", "$.x")
    message = str(caught.value)
    assert message.startswith("$.x: importing 'kit_raises:x' failed at ")
    assert message.endswith("kit_raises.py:2: RuntimeError: no db")
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_an_attribute_whose_lookup_raises_names_the_line(package_dir: Path) -> None:
    # A module __getattr__ (a lazily built app) runs user code after the import: its
    # error was a traceback.
    (package_dir / "kit_lazy.py").write_text(
        "def __getattr__(name):\n    raise RuntimeError('no db')\n")
    with pytest.raises(ConfigError) as caught:
        load_attr("kit_lazy:app", "$.x")
    message = str(caught.value)
    assert message.startswith("$.x: reading 'app' of 'kit_lazy:app' failed at ")
    assert message.endswith("kit_lazy.py:2: RuntimeError: no db")
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_module_that_calls_sys_exit_while_imported_is_an_error_too(
    package_dir: Path,
) -> None:
    """A worker would otherwise end with the module's exit code and not a word."""
    (package_dir / "kit_exits.py").write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(ConfigError) as caught:
        load_attr("kit_exits:x", "$.x")
    assert str(caught.value).endswith("kit_exits.py:2: SystemExit: 3")


def test_a_module_raising_a_base_exception_while_imported_is_an_error_too(
    package_dir: Path,
) -> None:
    """Not an Exception (pytest.skip() at module level raises one of these, as does a
    CancelledError): still the module's own failure, not a traceback."""
    (package_dir / "kit_base.py").write_text(
        "class Skipped(BaseException):\n    pass\n\nraise Skipped('needs a GPU')\n")
    with pytest.raises(ConfigError) as caught:
        load_attr("kit_base:x", "$.x")
    assert str(caught.value).startswith("$.x: importing 'kit_base:x' failed at ")
    assert str(caught.value).endswith("kit_base.py:4: Skipped: needs a GPU")


def test_ctrl_c_while_a_module_is_imported_still_interrupts(package_dir: Path) -> None:
    (package_dir / "kit_base.py").write_text("raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        load_attr("kit_base:x", "$.x")


def test_a_missing_dependency_of_the_module_is_named_with_the_line_importing_it(
    package_dir: Path,
) -> None:
    """The module is there; its own import of another failed: that is the module's
    error, named where it is (an app's edit importing a package not installed, which
    `--reload` reports), not 'cannot load' as if the module itself were missing."""
    (package_dir / "kit_missing_dep.py").write_text("x = 1\nimport kit_not_installed\n")
    with pytest.raises(ConfigError) as caught:
        load_attr("kit_missing_dep:F", "$.x")
    message = str(caught.value)
    assert message.startswith("$.x: importing 'kit_missing_dep:F' failed at ")
    assert message.endswith("kit_missing_dep.py:2: ModuleNotFoundError: "
                            "No module named 'kit_not_installed'")


def test_a_name_the_module_imports_that_is_not_there_is_named_with_its_line(
    package_dir: Path,
) -> None:
    (package_dir / "kit_bad_name.py").write_text("from json import no_such_name\n")
    with pytest.raises(ConfigError) as caught:
        load_attr("kit_bad_name:F", "$.x")
    assert str(caught.value).startswith("$.x: importing 'kit_bad_name:F' failed at ")
    assert "kit_bad_name.py:1: ImportError: cannot import name 'no_such_name'" in str(
        caught.value)


def test_a_missing_package_above_the_module_is_cannot_import() -> None:
    with pytest.raises(ConfigError, match=r"^\$\.x: cannot load 'no_such_pkg\.mod:F' "
                                          r"\(cannot import: No module named 'no_such_pkg'\)$"):
        load_attr("no_such_pkg.mod:F", "$.x")


def test_a_conveyor_error_the_module_raises_while_imported_names_its_line(
    package_dir: Path,
) -> None:
    """A handler declared with a misspelled option raises HandlerDeclarationError as the
    module is imported: it was passed on bare, with no file or line (and `--reload`
    promises both for an edit that breaks the app)."""
    (package_dir / "kit_declares.py").write_text(
        "import conveyor\n\napp = conveyor.App('k')\n\n\n"
        "@app.handler('orders', retry_atempts=2)\nasync def h(body: dict) -> None:\n"
        "    pass\n")
    with pytest.raises(ConveyorError) as caught:
        load_attr("kit_declares:app", "app path", error=ConveyorError)
    message = str(caught.value)
    assert message.startswith("app path: importing 'kit_declares:app' failed at "), message
    assert "kit_declares.py:6: HandlerDeclarationError: handler for 'orders': unknown " \
           "option(s) ['retry_atempts']" in message, message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_an_importer_may_refuse_with_its_own_conveyor_error() -> None:
    def refuse(name: str) -> ModuleType:
        raise ConveyorError(f"app path: no such file {name}")

    with pytest.raises(ConveyorError, match=r"^app path: no such file x\.py$"):
        load_attr("x.py:app", "app path", importer=refuse)
