"""Load an :class:`App` from ``module:attr`` or ``path/to/file.py:attr``."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from pathlib import Path

from conveyor.platform.app import App
from conveyor.platform.errors import ConveyorError


def load_app(target: str) -> App:
    """Import ``target`` and return the App it names (``attr`` defaults to ``app``)."""
    module_part, _, attr = target.partition(":")
    attr = attr or "app"
    if not module_part:
        raise ConveyorError(f"app path {target!r}: expected MODULE:ATTR or FILE.py:ATTR")
    try:
        if module_part.endswith(".py"):
            path = Path(module_part).resolve()
            if not path.is_file():
                raise ConveyorError(f"app path {target!r}: no such file {path}")
            name = _module_name(target, path)
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]  # no half-imported module for a later retry
                raise
        else:
            if "" not in sys.path:
                sys.path.insert(0, "")
            module = importlib.import_module(module_part)
    except ConveyorError:
        raise
    except ImportError as exc:
        raise ConveyorError(f"app path {target!r}: cannot import: {exc}") from None
    except Exception as exc:  # user code: any failure at import is a bad APP_PATH
        raise ConveyorError(
            f"app path {target!r}: importing it failed{_where(exc)}: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        where = getattr(module, "__file__", None) or "a built-in module"
        raise ConveyorError(
            f"app path {target!r}: {attr!r} is {type(app).__name__}, not a conveyor.App "
            f"(module {module.__name__!r} came from {where})"
        )
    return app


def _module_name(target: str, path: Path) -> str:
    """The name ``path`` is imported under: its stem, unless that names another module.

    A file is registered in ``sys.modules`` under its module name, so ``redis.py`` imported
    as ``redis`` would replace the redis client (and ``queue.py`` the standard library's
    ``queue``) for everything imported after it. Such a file is imported as
    ``<stem>_app`` instead; the name is the same in every process.
    """
    for name in (path.stem, f"{path.stem}_app"):
        clash = _shadowed(name, path)
        if clash is None:
            return name
    raise ConveyorError(
        f"app path {target!r}: neither {path.stem!r} nor {name!r} can name this file's "
        f"module without replacing {clash}; rename the file"
    )


def _shadowed(name: str, path: Path) -> str | None:
    """What importing ``path`` as the module ``name`` would replace, if anything."""
    current = sys.modules.get(name)
    if current is not None:
        origin = getattr(current, "__file__", None)
        if origin is not None and Path(origin).resolve() == path:
            return None  # the same file, loaded before: load it again
        return f"the module already loaded from {origin or 'the interpreter'}"
    if name in sys.stdlib_module_names:
        return "the standard library's module"
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a dotted stem whose parent is no package
        return None
    if spec is None or (spec.origin is not None and Path(spec.origin).resolve() == path):
        return None
    return f"the installed module at {spec.origin or 'a namespace package'}"


def _where(exc: BaseException) -> str:
    """`` at FILE:LINE`` of the innermost frame of the user's code that raised ``exc``."""
    if isinstance(exc, SyntaxError):
        return ""  # its message already names the file and line
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if not f.filename.startswith("<frozen ")]
    return f" at {user[-1].filename}:{user[-1].lineno}" if user else ""
