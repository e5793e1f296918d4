"""Loading ``"package.module:attr"`` strings a user writes: apps, user-written slot suppliers.

One function, :func:`load_attr`, so that every such string fails the same way: one
line, naming the setting it came from (``what``), the string, and what went wrong —
a module that cannot be imported, an import that raised (with the file and line of the
user's code), or an attribute that is missing or of the wrong type.
"""

from __future__ import annotations

import importlib
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar, overload

from conveyor.platform.errors import ConfigError, ConveyorError, error_text

T = TypeVar("T")

_MISSING = object()


@overload
def load_attr(target: str, what: str, *, expect: type[T], default_attr: str = "",
              form: str = ..., error: type[ConveyorError] = ...,
              importer: Callable[[str], ModuleType] = ...) -> T: ...
@overload
def load_attr(target: str, what: str, *, expect: None = None, default_attr: str = "",
              form: str = ..., error: type[ConveyorError] = ...,
              importer: Callable[[str], ModuleType] = ...) -> Any: ...
def load_attr(
    target: str,
    what: str,
    *,
    expect: type[Any] | None = None,
    default_attr: str = "",
    form: str = '"package.module:attr"',
    error: type[ConveyorError] = ConfigError,
    importer: Callable[[str], ModuleType] = importlib.import_module,
) -> Any:
    """Import the module of ``target`` (``"module:attr"``) and return its attribute.

    ``what`` names where ``target`` came from (``"$.slots.path"``); every error is an
    ``error`` whose message starts with it. ``default_attr`` is the attribute when
    ``target`` names none; ``form`` is the shape the error quotes for a malformed
    ``target``; ``expect`` checks the attribute's type (a missing one is ``None``).
    ``importer`` imports the module part (the app loader's also takes ``FILE.py``);
    a :class:`ConveyorError` it raises passes unchanged.
    """
    module_name, _, attr = target.partition(":")
    attr = attr or default_attr
    # A module named from "." is relative to no package here (importlib raises a
    # TypeError about its own arguments); a file (./shop.py) is the importer's.
    relative = module_name.startswith(".") and not module_name.endswith(".py")
    if not module_name or not attr or relative:
        raise error(f"{what}: expected {form}, got {target!r}")
    try:
        module = importer(module_name)
    except ConveyorError as exc:
        frame = _raised_by_module(exc)
        if frame is None:  # the importer's own refusal ("no such file"): as it is
            raise
        # The module's code called Conveyor wrongly while imported (a handler declared
        # with a misspelled option): its error, named where the module did it.
        raise error(f"{what}: importing {target!r} failed at {frame.filename}:"
                    f"{frame.lineno}: {error_text(exc)}") from None
    except ImportError as exc:
        if _not_found(exc, module_name):
            raise error(f"{what}: cannot load {target!r} (cannot import: {exc})") from None
        # The module was found and its own code failed to import something (a
        # dependency not installed, a name its imports lack): say where, as for any
        # other error its import raised.
        raise error(
            f"{what}: importing {target!r} failed{_where(exc)}: {error_text(exc)}"
        ) from None
    except KeyboardInterrupt:  # Ctrl-C during a slow import: the command is interrupted
        raise
    except BaseException as exc:  # the module's own code raised (an Exception, or not:
        # pytest.skip(), a CancelledError) or called sys.exit() while being imported: a
        # worker would stop with a traceback, or with no word of why
        raise error(
            f"{what}: importing {target!r} failed{_where(exc)}: {error_text(exc)}"
        ) from None
    try:  # a module's __getattr__ (a lazy attribute) runs user code too
        found = getattr(module, attr, _MISSING)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise error(f"{what}: reading {attr!r} of {target!r} failed{_where(exc)}: "
                    f"{error_text(exc)}") from None
    if found is _MISSING:
        raise error(f"{what}: cannot load {target!r}: module {module.__name__!r} "
                    f"(from {_origin(module)}) has no attribute {attr!r}")
    if expect is None:
        return found
    if not isinstance(found, expect):
        public = f"{expect.__module__.partition('.')[0]}.{expect.__qualname__}"
        raise error(
            f"{what}: in {target!r}, {attr!r} is {type(found).__name__}, not a {public} "
            f"(module {module.__name__!r} came from {_origin(module)})"
        )
    return found


def _not_found(exc: ImportError, module_name: str) -> bool:
    """Whether ``exc`` says that ``module_name`` itself (or a package above it) is not
    there, rather than that its code imported something missing."""
    if not isinstance(exc, ModuleNotFoundError) or exc.name is None:
        return False
    return module_name == exc.name or module_name.startswith(exc.name + ".")


def _origin(module: ModuleType) -> str:
    return getattr(module, "__file__", None) or "a built-in module"


_OURS = (str(Path(__file__).resolve().parents[1]) + os.sep,  # the conveyor package
         str(Path(importlib.__file__).resolve().parent) + os.sep)


def _raised_by_module(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of the imported module's code (or of what it imported) that
    led to ``exc``, skipping Conveyor's and importlib's own; None when ``exc`` came from
    the importer itself (its frame and what it called, with no module code run)."""
    frames = traceback.extract_tb(exc.__traceback__)[2:]  # past load_attr and the importer
    theirs = [f for f in frames if not f.filename.startswith("<")
              and not str(Path(f.filename).resolve()).startswith(_OURS)]
    return theirs[-1] if theirs else None


def _where(exc: BaseException) -> str:
    """`` at FILE:LINE`` of the innermost frame of the user's code that raised ``exc``."""
    if isinstance(exc, SyntaxError):
        return ""  # its message already names the file and line
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if not f.filename.startswith("<frozen ")]
    return f" at {user[-1].filename}:{user[-1].lineno}" if user else ""
