"""The package's rooms and the direction of their imports, read from the source with ``ast``.

``platform/`` is the broker-agnostic core: it imports nothing from ``workers/`` or
``adapters/`` (nor the package root, which re-exports them). And no module of
``conveyor`` imports another that imports it back at run time, directly or round a
longer cycle. Imports inside functions count (they run); imports under
``if TYPE_CHECKING:`` do not, except that ``platform/`` may not even name the other rooms
there. Modules chosen by name at run time (``importlib``, the adapter and membership
registries) are not imports and are not checked here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import conveyor

PACKAGE_DIR = Path(conveyor.__file__).parent
FOREIGN_TO_PLATFORM = ("conveyor.workers", "conveyor.adapters")


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
    commands, and a command is never a library function in disguise."""
    imports = all_imports()
    wrong = sorted({
        str(i) for i in imports
        if not (i.module == CLI or i.module.startswith(f"{CLI}."))
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
KAFKA_ABOVE_THE_ADAPTER = {f"{KAFKA}", f"{KAFKA}.adapter", f"{KAFKA}.group_balancer"}
"""The package's entry, the adapter, and the balancer that drives an adapter: the rest
(codec, receiver, cluster, the helpers) take the cluster, never the adapter."""


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
REDIS_ABOVE_THE_ADAPTER = {REDIS, f"{REDIS}.adapter"}
"""The package's entry and the adapter: the receiver, the letters and the groups take
what they use of the adapter as a protocol; the rest take a client, a Caller or Keys."""


def test_redis_modules_form_no_circle_even_through_type_only_imports() -> None:
    cycles = circles_inside(REDIS, "keys")
    assert cycles == [], "\n".join(cycles)


def test_no_redis_helper_imports_the_adapter() -> None:
    wrong = sorted(str(i) for i in all_imports()
                   if i.module.startswith(f"{REDIS}.") and i.module not in REDIS_ABOVE_THE_ADAPTER
                   and i.target in (f"{REDIS}.adapter", REDIS))
    assert wrong == [], "give the helper a protocol of what it uses:\n" + "\n".join(wrong)
