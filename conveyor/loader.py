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
            spec = importlib.util.spec_from_file_location(path.stem, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[path.stem]  # no half-imported module for a later retry
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
        raise ConveyorError(
            f"app path {target!r}: {attr!r} is {type(app).__name__}, not a conveyor.App"
        )
    return app


def _where(exc: BaseException) -> str:
    """`` at FILE:LINE`` of the innermost frame of the user's code that raised ``exc``."""
    if isinstance(exc, SyntaxError):
        return ""  # its message already names the file and line
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if not f.filename.startswith("<frozen ")]
    return f" at {user[-1].filename}:{user[-1].lineno}" if user else ""
