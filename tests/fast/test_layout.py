"""The package layout holds: no import circles, and every import points down the layers.

docs/ARCHITECTURE.md draws the layers; this test is what keeps them true. It reads the source with
`ast` (lazy, function-level imports included), so it needs nothing installed and runs in a second.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ada_core", "flows", "tasks", "report")

# ada_core's layers, bottom first: a module may import its own layer and the layers below.
CORE_LAYERS = [
    {"records", "protocols", "metrics", "errors", "occupancy", "paths", "processes"},
    {"config"},
    {"rl"},
    {"data"},
    {"sampling"},
    {"models"},
    {"engines"},
    {"run"},
    {"training"},
    {"cli"},
]
# Whole packages, bottom first.
PACKAGE_LAYERS = [{"ada_core"}, {"report"}, {"tasks"}, {"flows"}]
NEVER = {
    "ada_core": {"prefect", "mlflow", "flows", "tasks", "report"},
    "report": {"prefect", "mlflow", "flows", "tasks"},
    "tasks": {"flows", "report", "mlflow"},
}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")) if (ROOT / package).is_dir() else []:
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path) -> set[str]:
    """Every module `name` imports (absolute names, relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def edges() -> dict[str, set[str]]:
    """Module -> our modules it imports. A package's `__init__` that re-exports its children and a
    child that imports its own package are not edges of a circle (the import system resolves them)."""
    mods = modules()

    def resolve(target: str) -> str | None:
        while target and target not in mods:
            target = target.rpartition(".")[0]
        return target or None

    graph = {}
    for name, path in mods.items():
        targets = {resolve(t) for t in imports(name, path)} - {None, name}
        graph[name] = {t for t in targets if not name.startswith(t + ".") and not t.startswith(name + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def rank(layers: list[set[str]], name: str) -> int | None:
    return next((i for i, layer in enumerate(layers) if name in layer), None)


def test_no_import_circles():
    assert circles(edges()) == []


def test_circles_are_found():
    """The scan itself: a two-module circle and a longer one are reported, a chain is not."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(circles(graph)) == [["a", "b"], ["c", "d", "e"]]


def test_ada_core_imports_point_down_its_layers():
    every_module = {n.split(".")[1] for n in modules() if n.startswith("ada_core.")}
    assert every_module <= set().union(*CORE_LAYERS), "a new ada_core module needs a layer in this test"
    wrong = []
    for name, targets in edges().items():
        if not name.startswith("ada_core."):
            continue
        own = rank(CORE_LAYERS, name.split(".")[1])
        for target in targets:
            if target.startswith("ada_core.") and rank(CORE_LAYERS, target.split(".")[1]) > own:
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_packages_import_down_and_never_what_they_must_not():
    wrong = []
    mods = modules()
    for name, path in mods.items():
        top = name.split(".")[0]
        for target in imports(name, path):
            root = target.split(".")[0]
            if root in NEVER.get(top, ()):
                wrong.append(f"{name} imports {target}")
            elif root in {p for layer in PACKAGE_LAYERS for p in layer} and rank(PACKAGE_LAYERS, root) > rank(PACKAGE_LAYERS, top):
                wrong.append(f"{name} imports {target} (a higher package)")
    assert wrong == []


FACED = sorted(n for n, p in modules().items() if p.name == "__init__.py" and n.count(".") <= 1)  # the layers' packages


@pytest.mark.parametrize("package", FACED)
def test_every_package_has_a_face(package):
    """A docstring that says what the package is, and `__all__` that says what it offers."""
    path = modules()[package]
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree), f"{path} has no docstring"
    assert any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in n.targets) for n in tree.body), \
        f"{path} has no __all__"


def test_no_module_of_flows_shadows_a_top_level_name():
    """A worker loads a deployment's entrypoint (`flows/compare.py:compare`) by path, with `flows/` first on
    sys.path: a module there named like a top-level package (the repository's, the standard library's, an
    installed one's) is what every `import <name>` of that process then finds. `flows/report.py` made
    `from report import ...` in flows/group.py import itself, and the compare deployment crashed on a worker."""
    import sys
    from importlib.metadata import packages_distributions

    flows = ROOT / "flows"
    names = {p.stem for p in flows.glob("*.py")} | {p.name for p in flows.iterdir() if (p / "__init__.py").is_file()}
    names.discard("__init__")
    top_level = {p.stem for p in ROOT.glob("*.py")} | {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    imported = {target.split(".")[0] for name, path in modules().items() for target in imports(name, path)}
    taken = top_level | imported | set(sys.stdlib_module_names) | set(packages_distributions())
    assert sorted(names & taken) == [], "rename these modules of flows/: they shadow a top-level name on a worker"
