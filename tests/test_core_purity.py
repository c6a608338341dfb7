"""core/ stays pure: it imports only the standard library's logic and msgspec, and never
reads a clock, randomness, the environment or the network."""

import ast
import pathlib
import sys

CORE = pathlib.Path(__file__).resolve().parent.parent / "core"
# Standard-library modules that would bring time, randomness, I/O or concurrency into core.
FORBIDDEN_STDLIB = {
    "time",
    "datetime",
    "random",
    "secrets",
    "uuid",
    "os",
    "sys",
    "io",
    "socket",
    "select",
    "threading",
    "multiprocessing",
    "asyncio",
    "subprocess",
    "signal",
    "shutil",
    "tempfile",
    "pathlib",
    "glob",
    "urllib",
    "http",
    "ssl",
    "ctypes",
    "concurrent",
    "sched",
    "queue",
    "zoneinfo",
    "calendar",
    "locale",
    "platform",
    "resource",
    "logging",
}
# tomllib reads a file a user names; the one function that does so is allowed to open it.
ALLOWED_THIRD_PARTY = {"msgspec"}
FORBIDDEN_CALLS = {"open"}
OPEN_ALLOWED_IN = {("policy.py", "read_policy_toml")}


def core_files():
    files = sorted(CORE.rglob("*.py"))
    assert files, "core/ has no modules"
    return files


def imported_roots(tree: ast.AST) -> list[str]:
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.append(node.module.split(".")[0])
    return roots


def test_core_imports_only_stdlib_logic_and_msgspec():
    for path in core_files():
        tree = ast.parse(path.read_text())
        for root in imported_roots(tree):
            if root in ALLOWED_THIRD_PARTY:
                continue
            assert root in sys.stdlib_module_names, f"{path.name} imports {root}"
            assert root not in FORBIDDEN_STDLIB, f"{path.name} imports {root}: core must stay pure"


def test_core_reads_no_clock_randomness_or_files():
    for path in core_files():
        tree = ast.parse(path.read_text())
        for func in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
            for node in ast.walk(func):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    if node.func.id in FORBIDDEN_CALLS:
                        assert (path.name, func.name) in OPEN_ALLOWED_IN, (
                            f"{path.name}:{func.name} calls {node.func.id}()"
                        )
                if isinstance(node, ast.Attribute) and node.attr in (
                    "now",
                    "utcnow",
                    "time_ns",
                    "perf_counter",
                ):
                    raise AssertionError(f"{path.name}:{func.name} reads a clock ({node.attr})")


def set_iterations(tree: ast.AST) -> list[int]:
    """Lines where a loop or comprehension iterates a set literal, a set comprehension or a
    set()/frozenset() call (an order Python does not fix)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)):
            it = node.iter
            if isinstance(it, (ast.Set, ast.SetComp)) or (
                isinstance(it, ast.Call)
                and isinstance(it.func, ast.Name)
                and it.func.id in ("set", "frozenset")
            ):
                lines.append(it.lineno)
    return lines


def test_core_never_iterates_a_set():
    for path in core_files():
        assert set_iterations(ast.parse(path.read_text())) == [], f"{path.name} iterates a set"


def test_the_set_check_would_catch_each_way_of_iterating_a_set():
    bad = ast.parse(
        "for a in {1, 2}: pass\n"
        "b = [x for x in set(a)]\n"
        "c = {y for y in frozenset(b)}\n"
        "for d in {z for z in c}: pass\n"
        "for e in sorted({1, 2}): pass\n"
    )
    assert sorted(set_iterations(bad)) == [1, 2, 3, 4]


def test_the_purity_check_would_catch_a_clock(tmp_path):
    bad = ast.parse("import time\ndef f():\n    return time.time()\n")
    assert "time" in imported_roots(bad)


def test_no_core_file_is_over_500_lines_without_a_reason_at_its_top():
    for path in core_files():
        text = path.read_text()
        if text.count("\n") > 500:
            docstring = ast.get_docstring(ast.parse(text)) or ""
            assert "Over 500 lines on purpose" in docstring, f"{path.name}: split it, or say why not"
