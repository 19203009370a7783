"""ARCHITECTURE.md is held to the code: its layer table is read here and every import checked against it.

A module may import from its own layer or the layers below (at run time; ``if TYPE_CHECKING:``
imports are for annotations only). ``core/`` imports no polars, typer or rich; only ``cli/``
imports typer or rich; every module is named in ARCHITECTURE.md; and no module imports insecure
randomness (``random``, numpy's global generators).
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dpcli"


def layers() -> dict[str, int]:
    """``{"cli/": 10, "advice.py": 6, …}`` from ARCHITECTURE.md's table (higher layers import lower ones)."""
    table = {}
    for line in (ROOT / "ARCHITECTURE.md").read_text().splitlines():
        row = re.match(r"\|\s*(\d+) `\w+` \|(.*?)\|", line)
        if row:
            for part in re.findall(r"`([^`]+)`", row.group(2)):
                table[part] = int(row.group(1))
    return table


def layer_of(module: str, table: dict[str, int]) -> int:
    """The layer of ``dpcli.a.b`` (by its package ``a/`` or its module ``a.py``)."""
    top = module.split(".")[1] if "." in module else ""
    for key in (f"{top}/", f"{top}.py"):
        if key in table:
            return table[key]
    raise AssertionError(f"{module} is in no layer of ARCHITECTURE.md")


@functools.lru_cache(maxsize=None)  # every check walks the same files: each is parsed once (nothing edits a tree)
def parsed(path: Path) -> ast.Module:
    """The syntax tree of the package file ``path``."""
    return ast.parse(path.read_text())


@functools.lru_cache(maxsize=None)
def package_modules() -> frozenset[str]:
    """The dotted names of every module of the package."""
    return frozenset(module_name(p) for p in PACKAGE.rglob("*.py"))


@functools.lru_cache(maxsize=None)  # the two contract tests walk the same files
def runtime_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every ``dpcli`` import in ``path`` outside ``if TYPE_CHECKING:`` blocks."""
    tree = parsed(path)
    typing_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(n) for child in node.body for n in ast.walk(child)}
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dpcli"):
            targets = [node.module] if node.module != "dpcli" else [
                f"dpcli.{a.name}" for a in node.names if not a.name.startswith("__")]  # (__version__: the package's)
            found += [(node.lineno, t) for t in targets]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("dpcli.")]
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def upward_imports(table: dict[str, int]) -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if name in ("dpcli", "dpcli.__main__"):
            continue  # the lazy public API and ``python -m dpcli`` stand above every layer
        own = layer_of(name, table)
        for line, target in runtime_imports(path):
            if target not in ("dpcli",) and layer_of(target, table) > own:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target} (layer {layer_of(target, table)} > {own})")
    return bad


def test_every_module_is_in_a_layer_and_imports_only_downwards():
    table = layers()
    assert len(set(table.values())) == 10, table
    assert upward_imports(table) == []


def test_the_contract_catches_an_upward_import():
    """The check itself can fail: pretend ``core`` sits above ``cli``, and core's imports of nothing
    upward stay fine while every cli module's imports of core become violations."""
    table = layers()
    swapped = {k: (11 if k == "core/" else v) for k, v in table.items()}
    assert any("imports dpcli.core" in line for line in upward_imports(swapped))


def test_core_does_not_import_typer_rich_or_polars():
    core = PACKAGE / "core"
    modules = sorted("dpcli.core." + ".".join(p.relative_to(core).with_suffix("").parts)
                     for p in core.rglob("*.py") if p.stem != "__init__")
    assert len(modules) >= 11
    code = (
        f"import sys, importlib; [importlib.import_module(m) for m in {modules!r}];"
        "bad=[m for m in ('typer','rich','polars') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_only_the_cli_imports_typer_or_rich():
    for path in PACKAGE.rglob("*.py"):
        if "cli" in path.relative_to(PACKAGE).parts:
            continue
        imports = [line for line in path.read_text().splitlines() if line.lstrip().startswith(("import ", "from "))]
        for line in imports:
            assert "typer" not in line and "rich" not in line, (path, line)


def test_architecture_md_names_every_module():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    for path in PACKAGE.rglob("*.py"):
        if path.stem == "__main__":
            continue
        name = path.parent.name + "/" if path.stem == "__init__" else path.stem
        assert f"`{name}" in text or f"{path.stem}.py" in text or f"`{path.stem}`" in text, path


def test_no_insecure_randomness_in_package():
    for path in (ROOT / "dpcli").rglob("*.py"):
        text = path.read_text()
        assert "import random" not in text and "np.random" not in text and "numpy.random" not in text, path


def module_level_imports(path: Path, text: str | None = None, in_functions: bool = False) -> set[str]:
    """The ``dpcli`` modules that importing ``path`` imports at once, as its code names them: its imports outside
    function bodies and ``if TYPE_CHECKING:`` blocks; ``from P import m`` of a submodule counts as ``P.m``, and as
    ``P`` only when it also takes a name ``P`` defines or re-exports (the packages Python loads on the way are not
    named: a package ``__init__`` that imports its own modules is no circle unless one of them imports from it).
    ``in_functions``: the imports inside function bodies too (those that run later)."""
    tree = parsed(path) if text is None else ast.parse(text)
    modules = package_modules()
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not in_functions:
            return
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dpcli"):
            submodules = {f"{node.module}.{a.name}" for a in node.names} & modules
            found.update(submodules)
            if len(submodules) < len(node.names):  # a name P defines (or re-exports), not only P's modules
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("dpcli"))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found & modules


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of two or more modules in ``graph`` (Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = [stack.pop()]
            while part[-1] != v:
                part.append(stack.pop())
            if len(part) > 1:
                circles.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(circles)


def test_no_import_circle_at_module_level():
    """Issue 40: no two modules import each other, directly or round a longer loop, when they load (imports
    inside functions, which run later, are not loading; a package's ``__init__`` counts as a module)."""
    graph = {module_name(p): module_level_imports(p) - {module_name(p)} for p in PACKAGE.rglob("*.py")}
    assert import_circles(graph) == []


def test_no_import_circle_inside_release_even_in_functions():
    """Issue 40, item 2: the continuations sit above the steps they share (``release/steps.py``) and the path
    above them; no module of ``release/`` imports, even inside a function, one that imports it back (the
    lazily loaded continuations are named only by ``release/__init__.py``'s ``__getattr__``, not imported)."""
    paths = sorted((PACKAGE / "release").glob("*.py"))
    graph = {module_name(p): module_level_imports(p, in_functions=True) - {module_name(p)} for p in paths}
    inside = {name: {m for m in wanted if m.startswith("dpcli.release")} for name, wanted in graph.items()}
    assert import_circles(inside) == []
    assert "dpcli.release.scheduled" not in inside["dpcli.release.path"]  # the path never names a continuation
    assert "dpcli.release.stream_runs" not in inside["dpcli.release.path"]


def test_access_never_imports_io_even_in_functions():
    """The gate decides what dpcli may open; ``io/`` opens it through the gate: ``access/`` names no ``io``
    module, not even inside a function (the last such import, the catalog's of the dataset walk's hidden names, and
    the output check's of the private files' heads, live in ``access/`` now)."""
    for path in sorted((PACKAGE / "access").glob("*.py")):
        wanted = module_level_imports(path, in_functions=True)
        assert not {m for m in wanted if m.startswith("dpcli.io")}, path


def test_the_circle_check_sees_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_circles(graph) == [["a", "b", "c"]]
    # and a re-export taken back: dpcli.tasks's __init__ imports histogram, which imports Task from dpcli.tasks
    code = "from dpcli.tasks import Task\nfrom dpcli.tasks import topk\n"
    assert module_level_imports(PACKAGE / "tasks" / "histogram.py", code) == {"dpcli.tasks", "dpcli.tasks.topk"}


def test_the_gate_imports_the_catalog_never_the_reverse():
    """Issue 40, item 6: in ``access/`` the gate (``__init__``) imports the catalog and the walk, the catalog only
    the walk, the walk neither (at run time or inside functions: every import counts here); the gate's own
    modules (identity, locations, writes) never import the gate."""

    def imported(name: str) -> set[str]:
        tree = ast.parse((PACKAGE / "access" / name).read_text())
        found = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        found |= {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                  for a in n.names}
        return {m for m in found if m.startswith("dpcli.access")}

    def walk_names(module: str) -> set[str]:
        return {module} | {f"{module}.{n}" for n in dir(__import__(module, fromlist=["*"]))}

    assert imported("walk.py") == set()
    assert imported("catalog.py") <= walk_names("dpcli.access.walk")
    assert any(m.startswith("dpcli.access.catalog") for m in imported("__init__.py"))
    # the gate's own steps: who runs dpcli and the descriptor checks of writes know no catalog; the sealed
    # locations read only its entry type and its fix text
    assert imported("identity.py") == imported("writes.py") == set()
    assert imported("locations.py") <= walk_names("dpcli.access.walk") | {
        "dpcli.access.catalog", "dpcli.access.catalog.PATH_FIX", "dpcli.access.catalog.OutputEntry"}


#: The modules every task package has (issue 40, item 1): the query, its plan, its run and the task.
TASK_SHAPE = {"query", "plan", "run", "task"}


def test_every_task_package_has_the_same_shape():
    for task in ("histogram", "topk", "tabulate", "sql", "stream"):
        modules = {p.stem for p in (PACKAGE / "tasks" / task).glob("*.py")}
        assert TASK_SHAPE <= modules, (task, TASK_SHAPE - modules)
    assert not [p for p in (PACKAGE / "tasks").glob("*.py") if p.stem.split("_")[0] in
                ("histogram", "topk", "tabulate", "stream")], "a task's module outside its package"


def test_task_packages_share_only_through_the_modules_below_them():
    """Issue 40, item 1: what several tasks share (auto bounds, targets, budget splits such as ``gaussian_budget``,
    reports) lies in ``tasks/`` below the task packages; no task package imports another's (sql took
    ``gaussian_budget`` from histogram), at run time or inside a function."""
    tasks = ("histogram", "topk", "tabulate", "sql", "stream")
    crossing = []
    for task in tasks:
        for path in sorted((PACKAGE / "tasks" / task).glob("*.py")):
            for line, target in runtime_imports(path):
                parts = target.split(".")
                if len(parts) > 2 and parts[1] == "tasks" and parts[2] in tasks and parts[2] != task:
                    crossing.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert crossing == []


def test_no_module_over_500_lines():
    """Issue 40's limit, with no exception left (access/__init__, tasks/auto_bounds and release/schedules were
    the last ones over it, split along their seams)."""
    long = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert {name: n for name, n in long.items() if n > 500} == {}


def test_every_module_path_the_docs_name_exists():
    """A moved module leaves no stale path in the docs (``dpcli/catalog.py`` and ``dpcli/state/ledger.py`` did)."""
    named = set()
    for doc in [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        named |= set(re.findall(r"`(dpcli/[a-z_/]+(?:\.py|/))`", doc.read_text()))
    assert named and not [p for p in sorted(named) if not (ROOT / p).exists()]


#: Functions whose code (below their docstring) is over 60 lines, each with why it stays whole; may only shrink.
LONG_FUNCTIONS = {("tasks/histogram/run.py", "run_histogram"): "the algorithm kernel: bound, aggregate, select, noise "
                                                                  "and margins in the order the proof takes them"}


def long_functions(text: str) -> list[tuple[str, int]]:
    """(name, lines) of every function of ``text`` whose code, from the first statement below its docstring to its
    end, is over 60 lines (a command's signature, where its options are declared, is not code)."""
    return _long_functions_in(ast.parse(text))


def _long_functions_in(tree: ast.Module) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]
            if body and node.end_lineno is not None and node.end_lineno - body[0].lineno + 1 > 60:
                found.append((node.name, node.end_lineno - body[0].lineno + 1))
    return found


def test_no_function_over_60_lines_but_the_kernels_that_say_why():
    """Issue 40: no function's code over 60 lines (``wc -l`` of its body) outside the kernels listed with a reason."""
    over = {(str(p.relative_to(PACKAGE)), name) for p in PACKAGE.rglob("*.py") for name, _ in _long_functions_in(parsed(p))}
    assert over <= set(LONG_FUNCTIONS), sorted(over - set(LONG_FUNCTIONS))


def test_the_function_length_check_counts_code_not_docstrings():
    code = 'def f(\n    a,\n):\n    """doc\n' + "doc\n" * 80 + '"""\n' + "    x = 1\n" * 60 + "\n\ndef g():\n" + "    x = 1\n" * 61
    assert long_functions(code) == [("g", 61)]
