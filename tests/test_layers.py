"""Dependencies point one way (docs/design.md section 1): the package's import graph, drawn
from the source with every import (module level, inside functions, under ``TYPE_CHECKING``
alike), has no cycle, and no module imports one of a layer above its own.

A new module must be given a layer in :data:`LAYERS` (the test says which module has
none); a new arrow upwards or a new cycle fails here, with the arrows that make it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import mmserver

PACKAGE = Path(mmserver.__file__).parent

#: Top to bottom. A module may import modules of its own layer and of the layers below it.
#: An entry names a module and the modules under it, unless a longer entry names them.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("entry", ("mmserver.__main__", "mmserver.cli")),
    ("process topology", ("mmserver.engine.supervisor",)),
    ("hosts", ("mmserver.http.app", "mmserver.grpc", "mmserver.ray")),
    ("operations", ("mmserver.http.sagemaker", "mmserver.http.v2")),
    ("service", ("mmserver.http.local",)),
    ("what a request must hold", ("mmserver.http.requests",)),
    ("factory of served models", ("mmserver.registry", "mmserver.loader")),
    ("served models", ("mmserver.engine.isolated", "mmserver.engine.spawn",
                       "mmserver.engine.engine", "mmserver.loaded_model")),
    ("the engine's wire", ("mmserver.engine", "mmserver.engine.client", "mmserver.engine.channel",
                           "mmserver.engine.shared", "mmserver.engine.journal")),
    ("answers and exports", ("mmserver.served", "mmserver.http", "mmserver.http.service",
                             "mmserver.http.answers", "mmserver.http.triton",
                             "mmserver.http.errors", "mmserver.http.table", "mmserver.metrics")),
    ("request path", ("mmserver.pipeline", "mmserver.wires", "mmserver.capacity", "mmserver.model_roots",
                      "mmserver.paging", "mmserver.process", "mmserver.model_info")),
    ("model folders", ("mmserver.handler", "mmserver.signatures", "mmserver.v2_tensors",
                       "mmserver.codecs", "mmserver.text")),
    ("settings", ("mmserver.config", "mmserver.setting")),
    ("batching", ("mmserver.batching",)),
    ("leaves", ("mmserver", "mmserver.errors", "mmserver.workers", "mmserver.resources",
                "mmserver.heap", "mmserver.status", "mmserver.allocator", "mmserver.harness")),
)
#: What ``batching`` may import of the package (notebook 03 runs it alone).
BATCHING_MAY_IMPORT = ("mmserver.batching", "mmserver.errors", "mmserver.workers")
WEB_FRAMEWORKS = ("aiohttp", "starlette", "fastapi", "ray", "grpc", "uvicorn")


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported_names(module: str, path: Path) -> set[str]:
    """Every name ``module`` imports, absolute, wherever in the file the import is."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if path.name == "__init__.py" else \
                    module.split(".")[:-1]
                here = here[:len(here) - node.level + 1]
                base = ".".join(here + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module to the package's modules it imports (a name resolves to its longest module)."""
    known = modules(root)
    graph = {}
    for module, path in known.items():
        targets = set()
        for name in imported_names(module, path):
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of the longest entry naming ``module``, else None."""
    best, best_length = None, -1
    for position, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and len(entry) > best_length:
                best, best_length = position, len(entry)
    return best


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    arrows = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if layer_of(target) < layer_of(module):
                arrows.append(f"{module} ({LAYERS[layer_of(module)][0]}) -> {target} "
                              f"({LAYERS[layer_of(target)][0]})")
    return arrows


def test_every_module_has_a_layer():
    assert [m for m in sorted(modules()) if layer_of(m) is None] == []


def test_the_import_graph_has_no_cycle():
    assert cycles(import_graph()) == []


def test_no_module_imports_from_a_layer_above_its_own():
    assert upward_arrows(import_graph()) == []


def test_batching_imports_nothing_else_of_the_package_and_no_web_framework():
    graph = import_graph()
    for module, path in modules().items():
        if layer_of(module) != layer_of("mmserver.batching"):
            continue
        names = imported_names(module, path)
        assert [n for n in names if n.split(".")[0] in WEB_FRAMEWORKS] == [], module
        assert [n for n in graph[module]
                if not n.startswith(BATCHING_MAY_IMPORT)] == [], module


def test_the_checks_see_a_cycle_made_inside_a_function_and_an_upward_arrow(tmp_path):
    package = tmp_path / "pkg"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text("")
    (package / "low" / "a.py").write_text("def later():\n    from pkg import high\n")
    (package / "high.py").write_text("from .low import a\n")
    graph = import_graph(package)
    assert "pkg.low.a" in graph["pkg.high"] and "pkg.high" in graph["pkg.low.a"]
    assert cycles(graph) == [["pkg.high", "pkg.low.a"]]
    assert "mmserver.registry (factory of served models) -> mmserver.http.app (hosts)" in \
        upward_arrows({"mmserver.registry": {"mmserver.http.app"}, "mmserver.http.app": set()})


def test_every_file_the_design_docs_module_map_names_exists():
    """Section 1 of docs/design.md (the module map and the newcomer table) names files a
    newcomer opens; a file renamed or removed must be renamed or removed there too."""
    text = (PACKAGE.parent / "docs" / "design.md").read_text()
    section = text[text.index("## 1. Architecture"):text.index("## 2. ")]
    named = set(re.findall(r"`([\w/.]+\.(?:py|json))`", section))
    in_model_folders = {"mmserver.json", "code/inference.py"}
    names_in_package = {path.name for path in PACKAGE.rglob("*") if path.is_file()}
    missing = [path for path in sorted(named - in_model_folders)
               if not (PACKAGE / path).exists() and not (PACKAGE.parent / path).exists()
               and ("/" in path or path not in names_in_package)]
    assert missing == []
