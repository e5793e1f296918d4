"""The package's rooms and the direction of their imports, read from the source with ``ast``.

``platform/`` is the broker-agnostic core: it imports nothing from ``workers/``,
``adapters/``, the backend registry (``conveyor.backends``), the client above it, nor the
package root, which re-exports them, and it names none of them in a string either (a
``"module:attr"`` looked up at run time is an import the rules could not see).
``adapters/`` sit under the registry, which alone names them to the rooms above: the
workers never import an adapter. And no module of ``conveyor`` imports another that
imports it back at run time, directly or round a longer cycle. Imports inside functions
count (they run); imports under ``if TYPE_CHECKING:`` do not, except that ``platform/``
may not even name the other rooms there. Docstrings may name any module (a reader's
cross-reference is not a lookup).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import conveyor

PACKAGE_DIR = Path(conveyor.__file__).parent
REGISTRY = "conveyor.backends"
FOREIGN_TO_PLATFORM = ("conveyor.workers", "conveyor.adapters", REGISTRY, "conveyor.client")


@dataclass(frozen=True)
class Import:
    module: str  # the conveyor module that imports
    target: str  # the conveyor module imported
    line: int
    type_only: bool

    def __str__(self) -> str:
        kind = " (type-only)" if self.type_only else ""
        return f"{self.module}:{self.line} imports {self.target}{kind}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(module: str, source: str, is_package: bool, known: set[str]) -> list[Import]:
    """Every import of a ``conveyor`` module in ``source``, wherever it sits.

    ``from conveyor.a import b`` names module ``conveyor.a.b`` when that is a module of
    ``known``, else ``conveyor.a``; relative imports are resolved against ``module``.
    """
    found: list[Import] = []

    def add(target: str, line: int, type_only: bool) -> None:
        if target == "conveyor" or target.startswith("conveyor."):
            found.append(Import(module, target, line, type_only))

    def visit(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_only)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno, type_only)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, *([node.module] if node.module else [])])
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                add(submodule if submodule in known else base, node.lineno, type_only)
        for child in ast.iter_child_nodes(node):
            visit(child, type_only)

    visit(ast.parse(source), False)
    return found


def all_imports() -> list[Import]:
    paths = sorted(PACKAGE_DIR.rglob("*.py"))
    known = {module_name(p) for p in paths}
    return [
        imp
        for p in paths
        for imp in imports_of(module_name(p), p.read_text(), p.name == "__init__.py", known)
    ]


def import_cycles(imports: list[Import]) -> list[list[str]]:
    """Run-time import cycles among ``imports``; a graph with any cycle yields at least one."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if not imp.type_only and imp.target != imp.module:
            graph.setdefault(imp.module, set()).add(imp.target)
    cycles: list[list[str]] = []
    done: set[str] = set()

    def walk(node: str, path: list[str], on_path: set[str]) -> None:
        for target in sorted(graph.get(node, ())):
            if target in on_path:
                cycles.append([*path[path.index(target):], target])
            elif target not in done:
                on_path.add(target)
                walk(target, [*path, target], on_path)
                on_path.discard(target)
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            walk(start, [start], {start})
    return cycles


# -- the checker itself ---------------------------------------------------------------
def test_lazy_imports_count_and_type_checking_imports_are_marked_type_only() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from conveyor.platform import ids\n"
        "from . import mapper\n"
        "if TYPE_CHECKING:\n"
        "    from conveyor.workers.pools.pool import StatelessWorkerPool\n"
        "else:\n"
        "    import conveyor.platform.balancing.pid\n"
        "def later() -> None:\n"
        "    from conveyor.adapters import redis\n"
    )
    known = {
        "conveyor.platform.ids", "conveyor.platform.mapper", "conveyor.adapters.redis",
        "conveyor.platform.balancing.pid", "conveyor.workers.pools.pool",
    }
    found = imports_of("conveyor.platform.x", source, False, known)
    assert [(i.target, i.type_only) for i in found] == [
        ("conveyor.platform.ids", False),
        ("conveyor.platform.mapper", False),
        ("conveyor.workers.pools.pool", True),
        ("conveyor.platform.balancing.pid", False),
        ("conveyor.adapters.redis", False),
    ]


def test_a_cycle_is_found_however_long_and_type_only_edges_break_none() -> None:
    def imp(a: str, b: str, type_only: bool = False) -> Import:
        return Import(a, b, 1, type_only)

    assert import_cycles([imp("a", "b"), imp("b", "c"), imp("c", "a")]) == [["a", "b", "c", "a"]]
    assert import_cycles([imp("a", "b"), imp("b", "a", type_only=True)]) == []


# -- the rules ------------------------------------------------------------------------
def test_platform_imports_nothing_from_workers_adapters_or_the_package_root() -> None:
    imports = all_imports()
    assert any(i.module.startswith("conveyor.platform.") for i in imports)  # it looked
    wrong = sorted({
        str(i)
        for i in imports
        if i.module.startswith("conveyor.platform")
        and (i.target == "conveyor" or i.target.startswith(FOREIGN_TO_PLATFORM))
    })
    assert wrong == [], "platform/ is the core: move the word it needs into platform/:\n" + (
        "\n".join(wrong)
    )


def strings_naming(source: str, rooms: tuple[str, ...]) -> list[tuple[int, str]]:
    """The string constants of ``source`` that name a module of ``rooms`` (``"a.b:c"``,
    ``"a.b"``), with their lines. Docstrings are left out — a string that is a statement
    of its own (a module's, class's or function's, or one under an attribute) does
    nothing when it runs."""
    tree = ast.parse(source)
    docstrings = {
        id(node.value) for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in docstrings and any(room in node.value for room in rooms)
    ]


def test_a_string_naming_a_room_is_found_and_a_docstring_is_not() -> None:
    source = (
        '"""Says conveyor.adapters.redis for the reader."""\n'
        'TABLE = {"redis": "conveyor.adapters.redis:from_config"}\n'
        '"""The table (conveyor.adapters.redis is in it)."""\n'
        "def f() -> None:\n"
        '    """Also conveyor.workers.daemon."""\n'
        '    load(f"conveyor.workers.{name}")\n'
    )
    found = strings_naming(source, FOREIGN_TO_PLATFORM)
    assert found == [(2, "conveyor.adapters.redis:from_config"), (6, "conveyor.workers.")]


def test_platform_names_no_other_room_even_in_a_string() -> None:
    # Which broker is used is chosen in one visible place (conveyor.backends), from
    # which platform/ is handed a Backend: a table of "module:attr" strings in platform/
    # would be a dependency the import rules above cannot see.
    wrong = sorted(
        f"{path.relative_to(PACKAGE_DIR.parent)}:{line}: {text!r}"
        for path in sorted((PACKAGE_DIR / "platform").rglob("*.py"))
        for line, text in strings_naming(path.read_text(), FOREIGN_TO_PLATFORM)
    )
    assert wrong == [], "hand platform/ what it needs (a Backend), do not name it:\n" + (
        "\n".join(wrong))


def test_only_the_registry_imports_an_adapter_for_the_rooms_above() -> None:
    # The workers, the CLI, the console and the rest reach a broker through
    # conveyor.backends; adapters import neither the registry nor the workers.
    # (The testing kit, the benchmarks — `conveyor bench` among them —, the examples and
    # deploy's renderer name the memory, Redis or Kafka adapter on purpose: they are
    # about that broker.)
    imports = all_imports()
    above = ("conveyor.workers", "conveyor.cli", "conveyor.console", "conveyor.client")
    about_a_broker = ("conveyor.cli.bench",)
    wrong = sorted({
        str(i) for i in imports
        if (i.module.startswith(above) and i.module not in about_a_broker
            and i.target.startswith("conveyor.adapters"))
        or (i.module.startswith("conveyor.adapters")
            and i.target.startswith((REGISTRY, "conveyor.workers", "conveyor.client")))
    })
    assert any(i.module == REGISTRY and i.target.startswith("conveyor.adapters")
               for i in imports)  # it looked
    assert wrong == [], "ask conveyor.backends for the broker's part:\n" + "\n".join(wrong)


def test_the_registry_sits_on_platform_and_the_adapters_alone() -> None:
    wrong = sorted(
        str(i) for i in all_imports()
        if i.module == REGISTRY
        and not i.target.startswith(("conveyor.platform", "conveyor.adapters"))
    )
    assert wrong == [], "\n".join(wrong)


def test_no_two_modules_of_conveyor_import_each_other_at_run_time() -> None:
    cycles = [" -> ".join(c) for c in import_cycles(all_imports())]
    assert cycles == [], (
        "move the word both modules need into the module they both depend on, "
        "or import it under TYPE_CHECKING if it is only a type:\n" + "\n".join(cycles)
    )


def test_slot_suppliers_know_nothing_of_the_workers_that_hold_them() -> None:
    # workers/slots/ is a leaf of workers/: the daemon, pools and supervisor use
    # suppliers; a supplier reads only the port, its siblings and the machine's samples.
    allowed = ("conveyor.workers.slots", "conveyor.workers.resources")
    imports = [i for i in all_imports() if i.module.startswith("conveyor.workers.slots.")]
    assert imports  # it looked
    wrong = sorted(
        str(i) for i in imports
        if i.target.startswith("conveyor.workers") and not i.target.startswith(allowed)
    )
    assert wrong == [], "a slot supplier reaching into the workers that use it:\n" + (
        "\n".join(wrong))


def test_the_supervisor_and_its_child_share_nothing_but_the_protocol() -> None:
    # Two processes, two sides: what one says to the other is protocol.py, so neither
    # side can come to depend on the other's internals.
    room = "conveyor.workers.supervisor"
    child, shared = f"{room}.child", (f"{room}.protocol", room)
    imports = [i for i in all_imports() if i.module.startswith(f"{room}.")]
    assert any(i.module == child for i in imports)  # it looked
    wrong = sorted(
        str(i) for i in imports
        if i.target.startswith(f"{room}.") and i.target not in shared
        and (i.module == child) != (i.target == child)
    )
    assert wrong == [], "parent and child of the supervisor meet in protocol.py:\n" + (
        "\n".join(wrong))


CLI = "conveyor.cli"
CLI_HELPERS = ("conveyor.cli.common", "conveyor.cli.render", "conveyor.cli.reload")
"""What commands share (options, errors, tables) or lean on (``worker --reload``);
every other module of ``cli/`` is one command group."""


def test_nothing_outside_the_cli_imports_it() -> None:
    """The CLI is the top room: the library is usable (and testable) without click's
    commands, and a command is never a library function in disguise. (``python -m
    conveyor`` is the command too: ``conveyor/__main__.py`` runs it.)"""
    imports = all_imports()
    assert any(i.target == CLI for i in imports)  # it looked
    wrong = sorted({
        str(i) for i in imports
        if not (i.module == CLI or i.module.startswith(f"{CLI}.")
                or i.module == "conveyor.__main__")
        and (i.target == CLI or i.target.startswith(f"{CLI}."))
    })
    assert wrong == [], "move what both need out of conveyor.cli:\n" + "\n".join(wrong)


def test_a_command_module_imports_no_other_command_module() -> None:
    """One module per command group, each on its own: what two commands share lives in a
    helper (``cli/common.py``: options, errors; ``cli/render.py``: tables), and helpers
    import no command. Only the package (the main command) imports the command modules,
    to register them."""
    imports = all_imports()
    assert any(i.module == f"{CLI}.dlq" for i in imports)  # it looked
    wrong = sorted({
        str(i) for i in imports
        if i.module.startswith(f"{CLI}.") and i.module != f"{CLI}.__main__"
        and i.target.startswith(f"{CLI}.") and i.target != i.module
        and (i.target not in CLI_HELPERS or i.module in CLI_HELPERS)
    })
    assert wrong == [], "\n".join(wrong)


def test_only_the_cli_parses_arguments_or_prints_with_click() -> None:
    """click is the CLI's: the library reports by returning and raising, never by
    ``click.echo`` or ``sys.exit`` from deep inside."""
    cli_dir = PACKAGE_DIR / "cli"
    found = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        if cli_dir in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(PACKAGE_DIR.parent)}:{node.lineno}"
                      for name in names if name == "click" or name.startswith("click.")]
    assert found == [], "\n".join(found)


KAFKA = "conveyor.adapters.kafka"
KAFKA_ABOVE_THE_ADAPTER = {
    f"{KAFKA}", f"{KAFKA}.adapter", f"{KAFKA}.group_balancer", f"{KAFKA}.backend"}
"""The package's entry, the adapter, the balancer that drives an adapter, and the backend
that offers both: the rest (codec, receiver, cluster, the helpers) take the cluster,
never the adapter."""


def circles_inside(package: str, one_module: str) -> list[str]:
    """The import circles among ``package``'s modules, type-only imports counted as
    run-time ones; ``one_module`` is imported by some module of it (proof it looked)."""
    inside = [i for i in all_imports()
              if i.module.startswith(package) and i.target.startswith(package)]
    assert any(i.target == f"{package}.{one_module}" for i in inside)  # it looked
    return [" -> ".join(c) for c in import_cycles(
        [Import(i.module, i.target, i.line, type_only=False) for i in inside])]


def test_kafka_modules_form_no_circle_even_through_type_only_imports() -> None:
    cycles = circles_inside(KAFKA, "cluster")
    assert cycles == [], "\n".join(cycles)


def test_no_kafka_helper_imports_the_adapter() -> None:
    wrong = sorted(str(i) for i in all_imports()
                   if i.module.startswith(KAFKA) and i.module not in KAFKA_ABOVE_THE_ADAPTER
                   and i.target in (f"{KAFKA}.adapter", KAFKA, f"{KAFKA}.group_balancer"))
    assert wrong == [], "hand the helper the KafkaCluster instead:\n" + "\n".join(wrong)


REDIS = "conveyor.adapters.redis"
REDIS_ABOVE_THE_ADAPTER = {REDIS, f"{REDIS}.adapter", f"{REDIS}.backend"}
"""The package's entry, the adapter and the backend that offers it: the receiver, the
letters and the groups take what they use of the adapter as a protocol; the rest take a
client, a Caller or Keys."""


def test_redis_modules_form_no_circle_even_through_type_only_imports() -> None:
    cycles = circles_inside(REDIS, "keys")
    assert cycles == [], "\n".join(cycles)


def test_no_redis_helper_imports_the_adapter() -> None:
    wrong = sorted(str(i) for i in all_imports()
                   if i.module.startswith(f"{REDIS}.") and i.module not in REDIS_ABOVE_THE_ADAPTER
                   and i.target in (f"{REDIS}.adapter", REDIS))
    assert wrong == [], "give the helper a protocol of what it uses:\n" + "\n".join(wrong)
