"""The house's layers, read from the imports: a package imports only packages below it
(core at the bottom, the CLI on top; agents and replay side by side), and no module
imports itself round a circle, whether at the top of a file or inside a function."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Lowest first. Packages on one line are siblings: neither imports the other.
LAYERS = [
    ("core",),  # the pure decision core: stdlib and msgspec only (see test_core_purity)
    ("trust",),  # signing and verifying the log
    ("transport",),  # NATS: the embedded server and the streams
    ("agents", "replay"),  # live processes; the simulator and its peers
    ("projections",),  # reading the log into DuckDB, analyses, the dashboard
    ("xirang",),  # the command line: parses, calls, prints
]
RANK = {package: rank for rank, names in enumerate(LAYERS) for package in names}
# Inside core, lowest first: its sub-packages, then the modules at core's top (the step,
# the inputs' handlers, the explanations, replay). A sub-package imports only those below it.
CORE_LAYERS = ["model", "forecast", "log", "rules", "passes", ""]
CORE_RANK = {name: rank for rank, name in enumerate(CORE_LAYERS)}


def module_files() -> dict[str, Path]:
    """Module name -> file, for every module of the layered packages."""
    found = {}
    for package in RANK:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[str]:
    """The modules of ours that `name` imports anywhere in its file (a `from a import b` of a
    module `a.b` counts as importing `a.b`, of a name in `a` as importing `a`)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                stem = package[: len(package) - node.level + 1]
                base = ".".join(stem + ([node.module] if node.module else []))
            for alias in node.names:
                targets.append(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return sorted({t for t in targets if t in modules and t != name})


def import_graph() -> dict[str, list[str]]:
    """Module -> the modules of ours it imports (a fresh copy to change at will)."""
    return {name: list(targets) for name, targets in _graph().items()}


@cache
def _graph() -> dict[str, tuple[str, ...]]:
    modules = module_files()
    return {name: tuple(imports_of(name, path, modules)) for name, path in sorted(modules.items())}


def upward_imports(graph: dict[str, list[str]]) -> list[str]:
    """`module -> target` for every import of a package at its own layer or above."""
    return sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        for target in targets
        if name.split(".")[0] != target.split(".")[0]
        and RANK[target.split(".")[0]] >= RANK[name.split(".")[0]]
    )


def test_every_package_imports_only_packages_below_it():
    assert upward_imports(import_graph()) == [], "move the code down, or the caller up"


def core_part(module: str) -> str:
    """The sub-package of core a module of core belongs to ("" for core's top modules)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in CORE_RANK) else ""


def upward_core_imports(graph: dict[str, list[str]]) -> list[str]:
    """`module -> target` for every import inside core of a sub-package at its own layer
    (another one) or above."""
    return sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name.split(".")[0] == "core"
        for target in targets
        if target.split(".")[0] == "core"
        and core_part(target) != core_part(name)
        and CORE_RANK[core_part(target)] >= CORE_RANK[core_part(name)]
    )


def test_core_sub_packages_import_only_those_below_them():
    assert upward_core_imports(import_graph()) == [], "move the code down, or the caller up"


def test_the_core_layer_check_sees_an_upward_import():
    graph = import_graph()
    graph["core.model.made_up"] = ["core.model.state", "core.rules.fairness"]
    graph["core.rules.made_up"] = ["core.model.state", "core.passes.plan", "core.machine"]
    assert upward_core_imports(graph) == [
        "core.model.made_up -> core.rules.fairness",
        "core.rules.made_up -> core.machine",
        "core.rules.made_up -> core.passes.plan",
    ]


def test_no_core_module_is_over_500_lines():
    long = {
        str(path.relative_to(REPO)): lines
        for path in sorted((REPO / "core").rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > 500
    }
    assert long == {}, "split them by concept"


def test_no_module_imports_itself_round_a_circle():
    graph = import_graph()
    circles = [component for component in strongly_connected(graph) if len(component) > 1]
    assert circles == [], "import circles"


def test_the_layer_check_sees_an_upward_and_a_sideways_import():
    # given the real graph, plus a module of core that imports the CLI and one of agents
    # that imports the simulator (a sibling)
    graph = import_graph()
    assert "xirang.cli" in graph and "replay.sim" in graph
    graph["core.made_up"] = ["core.model.state", "xirang.cli"]
    graph["agents.made_up"] = ["core.model.state", "replay.sim"]
    # then the check names exactly those two
    assert upward_imports(graph) == ["agents.made_up -> replay.sim", "core.made_up -> xirang.cli"]


def test_the_circle_check_sees_a_circle():
    graph = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}
    assert [c for c in strongly_connected(graph) if len(c) > 1] == [["a", "b", "c"]]


def strongly_connected(graph: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, each sorted, in order of their first member."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, []):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)
