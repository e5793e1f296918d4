"""The public API: what ``import conveyor`` offers, the error tree, docstrings, the version."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import pytest

import conveyor
import conveyor.testing
from conveyor.platform import config as config_module
from conveyor.platform import errors as errors_module
from conveyor.version import UNKNOWN, pyproject_version

PACKAGE_DIR = Path(conveyor.__file__).parent
REPO = PACKAGE_DIR.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# Classes the docs describe (how the lab was run, what a pool drives) but that users do
# not import: they stay behind their modules.
DESCRIBED_NOT_EXPORTED = {
    "EntryDecoder", "Evaluator", "QueueCache", "QueueReceiver", "ResourcePlacer",
    "ScaleDownController", "SimConfig",
    "Caller",  # the Redis adapters' retry runner (docs/redis.md, Cluster and Sentinel)
    # dead letters' error types (docs/writing-handlers.md)
    "HandlerCancelled", "HandlerBaseException",
    # what `conveyor sim balancer` runs and mirrors (docs/lab.md)
    "DaemonMetrics", "DynamicBalancer", "LeaseStore", "Membership",
    "Backend",  # what one broker offers (docs/development.md): a contributor's word
    "ConsumerGroups", "DeadLetters",  # the adapter port's facets (docs/development.md)
    # where a message's time goes (docs/performance.md): the agent's and chain's parts
    "ConsumerScope", "DeadLetterInterceptor", "DeliveryStats", "DirectCall", "Entry",
    "HandlerDuration", "Lane",
    "RecordDecoder",
    "StallTolerantTimeout",  # the pull's deadline (docs/performance.md), internal
    "Telemetry",  # what TestWorker(telemetry=) takes (docs/testing.md), by its module
}
# Sub-modules with a curated public API of their own, imported by name
# (``from conveyor.testing import TestWorker``): their ``__all__`` is exported too.
PUBLIC_SUBMODULES = [conveyor.testing]
# ``raise`` of a builtin exception Conveyor may still write: abstract-method stubs.
BUILTIN_RAISES_ALLOWED = {"NotImplementedError", "KeyboardInterrupt"}  # SIGTERM as Ctrl-C
# ... and where one module may: asyncio.timeout's contract, kept by its replacement.
BUILTIN_RAISES_ALLOWED_IN = {("conveyor/platform/deadlines.py", "TimeoutError"),
                             ("conveyor/__init__.py", "AttributeError")}  # PEP 562
# Packages whose code stands for a user's (the demo's poison handler raises ValueError).
USER_CODE = PACKAGE_DIR / "examples"


def all_modules() -> list[ModuleType]:
    names = [m.name for m in pkgutil.walk_packages(conveyor.__path__, "conveyor.")]
    return [conveyor, *(importlib.import_module(name) for name in sorted(names))]


def classes_defined_in_conveyor() -> dict[str, type]:
    return {
        f"{module.__name__}.{name}": obj
        for module in all_modules()
        for name, obj in vars(module).items()
        if isinstance(obj, type) and obj.__module__ == module.__name__
    }


def own_docstring(obj: object) -> str | None:
    """The docstring written on ``obj`` itself, not one ``help()`` would borrow from a base."""
    if isinstance(obj, type):
        doc = obj.__dict__.get("__doc__")
        return doc if isinstance(doc, str) else None
    return getattr(obj, "__doc__", None)


# -- what `import conveyor` offers --------------------------------------------------------
def test_every_name_in_all_exists_and_all_is_sorted() -> None:
    for module in (conveyor, *PUBLIC_SUBMODULES):
        missing = [name for name in module.__all__ if not hasattr(module, name)]
        assert missing == []
        assert module.__all__ == sorted(set(module.__all__))


def test_every_error_of_the_error_tree_is_exported() -> None:
    tree = [
        name for name, obj in vars(errors_module).items()
        if isinstance(obj, type) and issubclass(obj, BaseException)
    ]
    assert tree and sorted(set(tree) - set(conveyor.__all__)) == []


def test_every_class_the_docs_name_is_exported_unless_only_described() -> None:
    defined = {cls.__name__ for cls in classes_defined_in_conveyor().values()}
    named: set[str] = set()
    written_in_docs: set[str] = set()  # the user's own classes in the examples
    for doc in DOCS:
        text = doc.read_text()
        for code in re.findall(r"`([^`\n]+)`", text):
            named |= set(re.findall(r"\b[A-Z][A-Za-z]+\b", code))
        for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
            named |= set(re.findall(r"\bconveyor\.([A-Za-z_]+)\b", block))
            named |= set(re.findall(r"\b([A-Z][A-Za-z]+)\(", block))
            written_in_docs |= set(re.findall(r"^class ([A-Za-z]+)\b", block, flags=re.M))
    documented = (named & defined) - written_in_docs - DESCRIBED_NOT_EXPORTED
    exported = set(conveyor.__all__).union(*(m.__all__ for m in PUBLIC_SUBMODULES))
    assert sorted(documented - exported) == []


def test_every_public_name_has_a_docstring_of_its_own() -> None:
    undocumented = [
        f"{module.__name__}.{name}"
        for module in (conveyor, *PUBLIC_SUBMODULES) for name in module.__all__
        if (inspect.isclass(obj := getattr(module, name)) or inspect.isfunction(obj))
        and not own_docstring(obj)
    ]
    assert undocumented == []


def test_the_config_and_every_section_say_what_they_are() -> None:
    sections = [
        obj for obj in vars(config_module).values()
        if isinstance(obj, type) and issubclass(obj, msgspec.Struct)
        and obj.__module__ == config_module.__name__
    ]
    assert conveyor.Config in sections and len(sections) > 10
    assert [s.__name__ for s in sections if not own_docstring(s)] == []
    assert "msgspec" not in (inspect.getdoc(conveyor.Config) or "")


# -- one error tree -----------------------------------------------------------------------
def test_every_exception_class_in_conveyor_derives_from_conveyor_error() -> None:
    outside = [
        qualname for qualname, cls in classes_defined_in_conveyor().items()
        if issubclass(cls, BaseException) and not issubclass(cls, conveyor.ConveyorError)
    ]
    assert outside == []


def test_conveyor_raises_no_builtin_exception_of_its_own() -> None:
    """``raise ValueError(...)`` and friends: each should be one of Conveyor's errors."""
    found = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        if USER_CODE in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            name = raised.id if isinstance(raised, ast.Name) else ""
            builtin = getattr(builtins, name, None)
            where = str(path.relative_to(REPO))
            if (isinstance(builtin, type) and issubclass(builtin, BaseException)
                    and name not in BUILTIN_RAISES_ALLOWED
                    and (where, name) not in BUILTIN_RAISES_ALLOWED_IN):
                found.append(f"{where}:{node.lineno}: raise {name}")
    assert found == []


def test_a_bad_value_is_a_conveyor_error_and_still_a_value_error() -> None:
    with pytest.raises(conveyor.InvalidArgumentError) as caught:
        conveyor.HashRingQueueMapper(0)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, conveyor.ConveyorError)


# -- the version ----------------------------------------------------------------------------
def test_the_version_is_the_installed_distributions() -> None:
    assert conveyor.__version__ == metadata.version("conveyor")
    with (REPO / "pyproject.toml").open("rb") as fh:
        assert conveyor.__version__ == tomllib.load(fh)["project"]["version"]


def test_the_version_falls_back_to_pyproject_then_to_unknown(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "conveyor"\nversion = "9.8.7"\n')
    assert pyproject_version(pyproject) == "9.8.7"
    assert pyproject_version(tmp_path / "missing.toml") == UNKNOWN
    pyproject.write_text("[project]\nname = 'conveyor'\n")
    assert pyproject_version(pyproject) == UNKNOWN


def test_conveyor_version_prints_the_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "--version"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    assert out.stdout == f"conveyor {conveyor.__version__}\n"


@pytest.mark.parametrize("config", ["configs/redis.toml", {}, {"queues": {"total": 4}}])
def test_a_config_that_is_no_config_object_is_refused_naming_what_to_pass(
    config: object,
) -> None:
    # A path or a dict given where load_config's result goes: "AttributeError: 'str'
    # object has no attribute 'queues'", and WorkerDaemon(app, {}) ran on the defaults
    # (the embedded adapter) as though no config had been given.
    app = conveyor.App("shop")
    calls = {
        "Client.from_config": lambda: conveyor.Client.from_config(config),  # type: ignore[arg-type]
        "SyncClient": lambda: conveyor.SyncClient(config),  # type: ignore[arg-type]
        "WorkerDaemon": lambda: conveyor.WorkerDaemon(app, config),  # type: ignore[arg-type]
    }
    for where, call in calls.items():
        with pytest.raises(conveyor.InvalidArgumentError) as refused:
            call()
        assert str(refused.value) == (
            f"{where}(config): expected a conveyor.Config (from conveyor.load_config(path)), "
            f"got {type(config).__name__} {config!r}"), where


@pytest.mark.parametrize("path", [5, b"configs/redis.toml", {"queues": {}}])
def test_load_config_of_no_path_is_refused_naming_what_to_pass(path: object) -> None:
    # load_config(5) raised "TypeError: expected str, bytes or os.PathLike object, not
    # int" from pathlib, and bytes were read as a path.
    with pytest.raises(conveyor.InvalidArgumentError) as refused:
        conveyor.load_config(path)  # type: ignore[arg-type]
    assert str(refused.value) == (
        "load_config: expected the path of a TOML file (str or pathlib.Path) or None, got "
        f"{type(path).__name__} {path!r}")


@pytest.mark.parametrize(("arguments", "says"), [
    ({"path": ""}, "load_config: the path is empty: give the path of a TOML file, or None "
     "for the defaults"),  # was "cannot read config file : Is a directory" (the cwd)
    ({"environ": [("CONVEYOR_QUEUES__TOTAL", "4")]},  # was AttributeError: no 'items'
     "load_config: environ: expected a mapping of variable names to values, both str "
     "(os.environ, or a dict), got list [('CONVEYOR_QUEUES__TOTAL', '4')]"),
    ({"environ": {"CONVEYOR_QUEUES__TOTAL": 4}},  # was AttributeError: no 'encode'
     "load_config: environ: expected a mapping of variable names to values, both str "
     "(os.environ, or a dict), got 'CONVEYOR_QUEUES__TOTAL': 4"),
    ({"environ": {}, "overrides": [("queues", {"total": 4})]},  # was AttributeError
     "load_config: overrides: expected a mapping of section names to mappings of "
     "settings ({'queues': {'total': 4}}), got list [('queues', {'total': 4})]"),
    ({"environ": {}, "overrides": {"queues": 4}},  # was "'int' object is not iterable"
     "load_config: overrides: expected a mapping of section names to mappings of "
     "settings ({'queues': {'total': 4}}), got 'queues': 4"),
])
def test_load_config_of_arguments_of_the_wrong_shape_is_refused_naming_them(
    arguments: dict[str, Any], says: str,
) -> None:
    with pytest.raises(conveyor.InvalidArgumentError) as refused:
        conveyor.load_config(**arguments)
    assert str(refused.value) == says


def test_a_daemon_of_no_app_is_refused_naming_what_to_pass() -> None:
    with pytest.raises(conveyor.InvalidArgumentError) as refused:
        conveyor.WorkerDaemon("shop:app")  # type: ignore[arg-type]
    assert str(refused.value) == "WorkerDaemon(app): expected a conveyor.App, got str 'shop:app'"


# -- what an import loads -------------------------------------------------------------------
def _loaded_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\n"
         "print(*sorted(m for m in sys.modules if m.split('.')[0] == 'conveyor'))"],
        capture_output=True, text=True, timeout=60, check=True)
    return set(out.stdout.split())


def test_import_conveyor_loads_a_name_when_it_is_first_asked_for() -> None:
    # Every CLI command and worker process paid ~0.3 s for the whole package (client,
    # daemon, the OTel SDK, prometheus) at `import conveyor`; names load as asked now.
    assert _loaded_after("import conveyor") == {"conveyor"}
    producer = _loaded_after("from conveyor import App, Client")
    assert "conveyor.platform.app" in producer and "conveyor.client" in producer
    assert not {m for m in producer if m == "conveyor.cli"
                or m.startswith(("conveyor.workers.daemon", "conveyor.cli."))}
    assert set(dir(conveyor)) >= set(conveyor.__all__)
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
        conveyor.NoSuchName  # noqa: B018


def test_the_cli_loads_only_the_command_it_runs() -> None:
    from conveyor.cli import main

    commands = {f"conveyor.cli.{name}" for name in main.list_commands(None)}  # type: ignore[arg-type]
    assert len(commands) >= 15
    assert not _loaded_after("import conveyor.cli") & commands
    assert _loaded_after("import sys\nfrom conveyor.cli import main\n"
                         "sys.argv = ['conveyor', 'dlq', '--help']\n"
                         "try:\n    main()\nexcept SystemExit:\n    pass"
                         ) & commands == {"conveyor.cli.dlq"}
