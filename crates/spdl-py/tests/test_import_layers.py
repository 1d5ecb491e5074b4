"""The ``spdl_rs`` package's modules import each other in layers: the graph of module-level imports among its
own modules has no cycle, and no function or method imports one of them (an import inside a function is how a
cycle is usually dodged). Imports of optional third-party packages (torch, ray, numpy) may stay lazy; this test
looks only at imports of ``spdl_rs``'s own modules.

The graph is read from the source with :py:mod:`ast`, without importing anything:

- ``import spdl_rs.a.b`` imports ``spdl_rs.a.b``;
- ``from .x import y`` imports ``.x`` (or ``.x.y`` when that is a module), and ``from . import x`` imports the
  submodule ``.x`` when there is one, else the package itself;
- a submodule's implicit dependency on its parent package (Python imports ``spdl_rs.io`` before
  ``spdl_rs.io._media``) is not an edge: package ``__init__`` files import their submodules, and counting it
  would make every package a cycle;
- imports under ``if TYPE_CHECKING:`` count: the layering holds for type annotations too;
- names a package loads on first attribute access (``_lazy.lazy_attributes``) are not imports;
- inside functions, ``importlib.import_module("...")`` of a constant spdl_rs name counts as an import too.

The modules a subinterpreter loads by path (:py:data:`STANDALONE`) import nothing from spdl_rs at all.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "spdl_rs"
ROOT = Path(__file__).resolve().parent.parent / "python" / PACKAGE

# Function-level imports of spdl_rs modules that cannot move to module level, each with the reason. Keys are
# (module, imported module). Keep it empty.
ALLOWED_FUNCTION_IMPORTS: dict[tuple[str, str], str] = {}

# Loaded by file path in subinterpreters, where spdl_rs's native module cannot be loaded: no spdl_rs import.
STANDALONE = {f"{PACKAGE}.pipeline._run_protocol"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package)."""
    return {_module_name(p): (p, p.name == "__init__.py") for p in sorted(ROOT.rglob("*.py"))}


def _all_modules(sources: dict[str, tuple[Path, bool]]) -> set[str]:
    """The package's modules: its .py files and its extension modules (``_native`` and its submodules, from the
    built module or, in a tree without one, from their stubs)."""
    modules = set(sources)
    for p in ROOT.rglob("*"):
        if p.suffix in (".so", ".pyd", ".pyi"):
            parts = list(p.relative_to(ROOT.parent).parts)
            parts[-1] = parts[-1].split(".")[0]
            if parts[-1] == "__init__":  # a stub package: `_native/__init__.pyi` is `_native`
                parts.pop()
            modules.add(".".join(parts))
    return modules


def _resolve(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: set[str]) -> list[str]:
    """The spdl_rs modules an import statement imports."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name == PACKAGE or a.name.startswith(PACKAGE + ".")]
    if node.level:
        base = module.split(".")
        if not is_package:
            base.pop()
        if node.level > 1:
            base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target != PACKAGE and not target.startswith(PACKAGE + "."):
        return []
    out = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        out.append(sub if sub in modules else target)
    return sorted(set(out))


def _import_module_call(node: ast.AST) -> ast.Import | ast.ImportFrom | None:
    """``import_module("name")`` / ``import_module(".name", __package__)`` as the import statement it does."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    arg = node.args[0]
    if name != "import_module" or not isinstance(arg, ast.Constant) or not isinstance(arg.value, str):
        return None
    target = arg.value
    level = len(target) - len(target.lstrip("."))
    if level:
        return ast.ImportFrom(module=target[level:] or None, names=[ast.alias(name="*")], level=level, lineno=node.lineno)
    return ast.Import(names=[ast.alias(name=target)], lineno=node.lineno)


def _imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement, with whether it is inside a function (or lambda) body."""

    def walk(node: ast.AST, in_function: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            elif in_function and (call := _import_module_call(child)) is not None:
                yield call, in_function
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from walk(child, inner)

    yield from walk(tree, False)


def _analyse() -> tuple[dict[str, set[str]], list[str]]:
    """(module-level import graph, function-level imports of spdl_rs modules as "file:line: target")."""
    sources = _sources()
    modules = _all_modules(sources)
    graph: dict[str, set[str]] = {m: set() for m in sources}
    in_functions: list[str] = []
    for module, (path, is_package) in sources.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, in_function in _imports(tree):
            for target in _resolve(node, module, is_package, modules):
                if in_function:
                    if (module, target) not in ALLOWED_FUNCTION_IMPORTS:
                        rel = path.relative_to(ROOT.parent)
                        in_functions.append(f"{rel}:{node.lineno}: imports {target}")
                elif target != module:
                    graph[module].add(target)
    return graph, in_functions


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a list of modules (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_graph_is_read() -> None:
    graph, _ = _analyse()
    assert f"{PACKAGE}.pipeline._builder" in graph
    assert f"{PACKAGE}.pipeline._op" in graph[f"{PACKAGE}.pipeline._builder"]
    assert f"{PACKAGE}.pipeline.defs" in graph[f"{PACKAGE}.pipeline"]


def test_no_import_cycle() -> None:
    graph, _ = _analyse()
    cycle = _find_cycle(graph)
    assert cycle is None, "spdl_rs modules import each other in a cycle: " + " -> ".join(cycle or [])


def test_no_function_level_imports_of_spdl_rs() -> None:
    _, in_functions = _analyse()
    assert not in_functions, (
        "spdl_rs modules imported inside functions (import them at module level; a cycle this dodges means a "
        "helper belongs in a lower module):\n" + "\n".join(in_functions)
    )


def test_standalone_modules_import_no_spdl_rs_module() -> None:
    sources = _sources()
    modules = _all_modules(sources)
    assert STANDALONE <= set(sources)
    for module in sorted(STANDALONE):
        path, is_package = sources[module]
        found = [
            f"{node.lineno}: {t}"
            for node, _ in _imports(ast.parse(path.read_text()))
            for t in _resolve(node, module, is_package, modules)
        ]
        assert not found, f"{module} is loaded by path in subinterpreters and must not import spdl_rs: {found}"


def test_allow_list_is_current() -> None:
    """Every allow-list entry still names a function-level import."""
    sources = _sources()
    modules = _all_modules(sources)
    seen = set()
    for module, (path, is_package) in sources.items():
        for node, in_function in _imports(ast.parse(path.read_text())):
            if in_function:
                seen.update((module, t) for t in _resolve(node, module, is_package, modules))
    assert set(ALLOWED_FUNCTION_IMPORTS) <= seen
