"""Load an :class:`App` from ``module:attr`` or ``path/to/file.py:attr``."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from conveyor.platform.app import App
from conveyor.platform.errors import ConveyorError
from conveyor.platform.importing import load_attr


def load_app(target: str) -> App:
    """Import ``target`` and return the App it names (``attr`` defaults to ``app``)."""
    return load_attr(target, "app path", expect=App, default_attr="app",
                     form="MODULE:ATTR or FILE.py:ATTR", error=ConveyorError,
                     importer=_import)


def _import(module_part: str) -> ModuleType:
    """Import a module by name (from the working directory too) or a ``.py`` file."""
    if not module_part.endswith(".py"):
        if "" not in sys.path:
            sys.path.insert(0, "")
        return importlib.import_module(module_part)
    path = Path(module_part).resolve()
    if not path.is_file():
        raise ConveyorError(f"app path: no such file {path}")
    name = _module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # no half-imported module for a later retry
        raise
    return module


def _module_name(path: Path) -> str:
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
        f"app path: neither {path.stem!r} nor {name!r} can name the module of {path} "
        f"without replacing {clash}; rename the file"
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
