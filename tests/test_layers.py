"""The package's shape, checked: layers that import one way, no import circles, no oversized module.

Read from the source with ``ast`` (nothing is imported), so every import counts:
at the top of a module, inside a function, under ``if TYPE_CHECKING:``, and a
module named to ``importlib.import_module`` as a string.

    book      the chapters' helpers, plots, figures, the report, grading, the bench runner
    lab       the experiments behind the chapters, the programs they start (ours and others'), their results
    server | hops | client     (side by side: none imports another)
    model     loading, sampling, the detokenizer, generation, batching, backlog
    net       the thin asyncio glue the servers and clients share, and child processes for every layer
    protocol  HTTP, SSE, WebSocket and the stop vocabulary: bytes in, events out
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "streamlab"
LAYERS: list[tuple[str, ...]] = [
    ("book",),
    ("lab",),
    ("server", "hops", "client"),
    ("model",),
    ("net",),
    ("protocol",),
]
TOP = {"streamlab", "streamlab.__main__", "streamlab.cli"}  # the entry points, above every layer
MAX_TOP_MODULES = 12
MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path) -> set[str]:
    """Every streamlab module ``name`` imports, wherever the import stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            targets = [node.args[0].value]  # importlib.import_module("streamlab.x"): an import all the same
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in MODULES and t != name}
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def layer_of(name: str) -> int | None:
    parts = name.split(".")
    if name in TOP or len(parts) < 2:
        return None
    for rank, packages in enumerate(LAYERS):
        if parts[1] in packages:
            return rank
    return None


# Inside server/, its wings along a request's path, top to bottom: a module imports its own wing and those below.
SERVER_WINGS: list[tuple[str, ...]] = [
    ("app", "command", "api_docs", "queues"),
    ("resources",),
    ("wire",),
    ("answers",),
    ("transport",),
    ("store",),
    ("config",),
]


# Inside lab/, what each package holds, top to bottom: the experiments use the programs they start and keep results.
LAB_WINGS: list[tuple[str, ...]] = [
    ("experiments",),
    ("outside",),
    ("setups",),
    ("conformance",),
    ("results",),
]


# A package's wings, top to bottom: a module imports its own wing and those below it.
WINGS = {"server": SERVER_WINGS, "lab": LAB_WINGS}


def wing_of(name: str, package: str) -> int | None:
    parts = name.split(".")
    if parts[:2] != ["streamlab", package] or len(parts) < 3:
        return None
    return next((rank for rank, wings in enumerate(WINGS[package]) if parts[2] in wings), None)


@pytest.mark.parametrize("package", WINGS)
def test_every_module_of_a_winged_package_is_in_a_wing(package: str) -> None:
    homeless = [name for name in MODULES if name.startswith(f"streamlab.{package}.") and wing_of(name, package) is None]
    assert not homeless, f"{package} modules outside every wing: {homeless}"


@pytest.mark.parametrize("package", WINGS)
def test_wings_import_down(package: str) -> None:
    wrong = [f"{name} -> {target}" for name, targets in GRAPH.items() if (rank := wing_of(name, package)) is not None
             for target in sorted(targets) if (other := wing_of(target, package)) is not None and other < rank]
    assert not wrong, f"imports up {package}'s wings:\n" + "\n".join(wrong)


def test_every_module_is_in_a_layer() -> None:
    homeless = [name for name in MODULES if name not in TOP and layer_of(name) is None]
    assert not homeless, f"modules outside every layer (add them to a package): {homeless}"


def test_the_top_of_the_package_stays_small() -> None:
    top = [p.name for p in PACKAGE.glob("*.py")]
    assert len(top) <= MAX_TOP_MODULES, top


def test_imports_run_one_way_through_the_layers() -> None:
    wrong = []
    for name, targets in GRAPH.items():
        rank = layer_of(name)
        if rank is None:
            continue
        for target in sorted(targets):
            other = layer_of(target)
            if other is None:
                wrong.append(f"{name} -> {target} (the entry points import the layers, not the other way)")
            elif other < rank:
                wrong.append(f"{name} -> {target} (up from {LAYERS[rank]} to {LAYERS[other]})")
            elif other == rank and name.split(".")[1] != target.split(".")[1]:
                wrong.append(f"{name} -> {target} (sideways: {LAYERS[rank]} do not import each other)")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles() -> None:
    assert _cycles(GRAPH) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_over_600_lines(name: str) -> None:
    lines = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name]} has {lines} lines: split it along a seam"


def test_no_module_is_named_like_the_standard_library() -> None:
    clashes = [name for name in MODULES if name.rpartition(".")[2] in sys.stdlib_module_names]
    assert not clashes, clashes


def _defined(path: Path) -> set[str]:
    """The names a module defines itself at its top level (def, class, assignment), in any if/try there too."""
    names: set[str] = set()

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, (ast.If, ast.Try)):
                walk(node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    walk(handler.body)

    walk(ast.parse(path.read_text(encoding="utf-8")).body)
    return names


DEFINED = {name: _defined(path) for name, path in MODULES.items()}
ROOT = PACKAGE.parent


def _sources() -> dict[str, str]:
    """Every Python text that imports from streamlab: the library, tests, benchmarks, the notebooks' code cells."""
    import json

    texts = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
             for folder in ("streamlab", "tests", "benchmarks") for p in sorted((ROOT / folder).rglob("*.py"))}
    for notebook in sorted((ROOT / "notebooks").rglob("*.ipynb")):
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        texts[str(notebook.relative_to(ROOT))] = "\n".join(line for line in code.splitlines()
                                                           if not line.lstrip().startswith(("%", "!")))
    return texts


def test_every_name_is_imported_from_where_it_is_defined() -> None:
    """No module re-exports another's names: ``from streamlab.X import name`` finds ``name`` defined in X."""
    wrong = []
    for where, text in _sources().items():
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("streamlab") or node.level:
                continue
            if node.module not in MODULES:
                continue
            for alias in node.names:
                if f"{node.module}.{alias.name}" in MODULES or alias.name in DEFINED[node.module]:
                    continue
                wrong.append(f"{where}: from {node.module} import {alias.name}")
    assert not wrong, "names imported through a module that does not define them:\n" + "\n".join(sorted(wrong))


def test_the_ground_layers_look_nothing_up_by_name() -> None:
    """net/ and protocol/ take what they render or parse from their callers: no importlib there."""
    found = [name for name, path in MODULES.items() if name.split(".")[1:2] in (["net"], ["protocol"])
             and "import_module" in path.read_text(encoding="utf-8")]
    assert not found, found


def test_all_lists_only_what_the_module_defines() -> None:
    """An ``__all__`` naming an imported name would be a re-export by another name."""
    wrong = []
    for name, path in MODULES.items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                wrong += [f"{name}: {n}" for n in ast.literal_eval(node.value) if n not in DEFINED[name]
                          and n != "__version__"]
    assert not wrong, wrong


def test_a_module_s_attributes_are_read_where_they_are_defined() -> None:
    """``module.name`` (a streamlab module bound by an import) finds ``name`` defined in that module."""
    wrong = []
    for where, text in _sources().items():
        tree = ast.parse(text)
        bound: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("streamlab") and not node.level:
                bound |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names
                          if f"{node.module}.{a.name}" in MODULES}
            elif isinstance(node, ast.Import):
                bound |= {a.asname: a.name for a in node.names if a.asname and a.name in MODULES}
        # Patching a module's own binding (a test's stand-in for its os, an exercise's for its forwarder_for) is
        # where that module looks the name up, not a re-export: a file that assigns module.name may read it too.
        patched = {(n.value.id, n.attr) for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                   and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)}
        patched |= {(call.args[0].id, call.args[1].value) for call in ast.walk(tree) if isinstance(call, ast.Call)
                    and getattr(call.func, "attr", "") == "setattr" and len(call.args) >= 2
                    and isinstance(call.args[0], ast.Name) and isinstance(call.args[1], ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
                module = bound[node.value.id]
                if node.attr.startswith("__") or (node.value.id, node.attr) in patched:
                    continue
                if node.attr not in DEFINED[module] and f"{module}.{node.attr}" not in MODULES:
                    wrong.append(f"{where}:{node.lineno}: {node.value.id}.{node.attr} ({module} does not define it)")
    assert not wrong, "attributes read through a module that does not define them:\n" + "\n".join(sorted(set(wrong)))
