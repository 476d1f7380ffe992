"""The package's import layering, read from the source with `ast` (nothing is imported).

An import may only go to the same or a lower layer, files may not import each other in a
cycle, every top-level module or package must be placed in a layer on purpose, and every
file stays under 400 lines. Imports under `if TYPE_CHECKING:` are exempt (they never run);
imports inside functions count (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Top-level module or package of `loomrl` -> layer, bottom (1) to top. `__init__` is the
# package root `loomrl/__init__.py`. A name listed here that does not exist yet is allowed.
LAYERS: dict[str, int] = {
    **dict.fromkeys(
        [
            "types",
            "codec",
            "lru",
            "aio",
            "redact",
            "hardware",
            "workers",
            "process_calls",
            "process_preload",
            "algos",
            "rundir",
            "lifeline",
            "reaper",
            "terminal",
        ],
        1,
    ),
    "models": 2,
    **dict.fromkeys(["tokens", "token_probe", "token_check", "vision"], 3),
    "engines": 4,
    **dict.fromkeys(["data", "sandbox", "parsers", "answers", "runs"], 5),
    "rewards": 6,
    "envs": 7,
    "harness": 8,
    "episode": 9,
    **dict.fromkeys(["producer", "experience", "distributed", "config"], 10),
    "rollout": 11,
    **dict.fromkeys(["train", "report", "integrations"], 12),
    "run": 13,
    **dict.fromkeys(["cli", "doctor", "__init__"], 14),
}

MAX_LINES = 400
ROOT = Path(__file__).resolve().parent.parent / "loomrl"


@dataclass(frozen=True)
class Edge:
    """One import of one module by another, where it is written."""

    source: str
    target: str
    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.source} -> {self.target}"


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every `.py` file under the package directory `root`."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: all but the bodies of `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def _known(name: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of `name` that is a module of the package, or None."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in known:
            return ".".join(parts)
        parts.pop()
    return None


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_init: bool, known) -> set[str]:
    """The package's modules one import statement reaches (no parent `__init__` files)."""
    if isinstance(node, ast.Import):
        return {t for alias in node.names if (t := _known(alias.name, known))}
    if node.level:
        package = module.split(".") if is_init else module.split(".")[:-1]
        base = package[: len(package) - (node.level - 1)]
        base_name = ".".join([*base, node.module] if node.module else base)
    else:
        base_name = node.module or ""
    targets: set[str] = set()
    named = {f"{base_name}.{alias.name}" for alias in node.names}
    targets |= named & known.keys()
    if named - known.keys() and (t := _known(base_name, known)):
        targets.add(t)
    return targets


def walk(root: Path) -> list[Edge]:
    """Every import from one module of the package in `root` to another (self-imports dropped)."""
    known = modules(root)
    edges: list[Edge] = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        shown = path.relative_to(root.parent)
        for node in _imports(tree):
            for target in _targets(node, module, path.name == "__init__.py", known):
                if target != module:
                    edges.append(Edge(module, target, shown, node.lineno))
    return sorted(edges, key=lambda e: (str(e.path), e.line, e.target))


def top_name(module: str) -> str:
    """`loomrl.envs.base` -> `envs`; the package root -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward(edges: list[Edge], layers: dict[str, int]) -> list[str]:
    """Imports that go to a higher layer than the importer's (unplaced names are skipped)."""
    found = []
    for edge in edges:
        have, want = layers.get(top_name(edge.source)), layers.get(top_name(edge.target))
        if have is not None and want is not None and want > have:
            found.append(f"{edge} (layer {have} -> {want})")
    return found


def _strong_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: each strongly-connected set of more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def enter(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        work.append((node, iter(sorted(graph.get(node, ())))))

    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = []
        enter(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = [stack.pop()]
                    while group[-1] != node:
                        group.append(stack.pop())
                    on_stack.difference_update(group)
                    if len(group) > 1:
                        groups.append(sorted(group))
            elif child not in index:
                enter(child)
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(groups)


def cycles(edges: list[Edge]) -> list[str]:
    """Each set of files that import each other in a cycle, with the imports inside it."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
    found = []
    for group in _strong_components(graph):
        members = set(group)
        inside = [str(e) for e in edges if e.source in members and e.target in members]
        shown = {e.source: str(e.path) for e in edges if e.source in members}
        files = ", ".join(shown[m] for m in group)
        found.append(f"cycle between {files}:\n    " + "\n    ".join(inside))
    return found


def package_cycles(edges: list[Edge], package: str) -> list[str]:
    """Each set of top-level modules/packages that import each other in a cycle (within
    one layer, where the layer check cannot see it), with the imports between them."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        source, target = top_name(edge.source), top_name(edge.target)
        if source != target:
            graph.setdefault(source, set()).add(target)
    found = []
    for group in _strong_components(graph):
        members = set(group)
        across = [
            str(e)
            for e in edges
            if top_name(e.source) in members
            and top_name(e.target) in members
            and top_name(e.source) != top_name(e.target)
        ]
        names = ", ".join(f"{package}.{n}" for n in group)
        found.append(f"cycle between packages {names}:\n    " + "\n    ".join(across))
    return found


def unassigned(root: Path, layers: dict[str, int]) -> list[str]:
    """Top-level modules and packages of the package in `root` that have no layer."""
    names = {top_name(m) for m in modules(root)}
    return sorted(f"{root.name}.{n} has no layer" for n in names - layers.keys())


def violations(root: Path, layers: dict[str, int]) -> list[str]:
    edges = walk(root)
    return [
        *unassigned(root, layers),
        *upward(edges, layers),
        *cycles(edges),
        *package_cycles(edges, root.name),
    ]


def long_files(root: Path, limit: int = MAX_LINES) -> list[str]:
    """Files with `limit` lines or more, counted as `wc -l` does (newline characters)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_bytes().count(b"\n")
        if lines >= limit:
            found.append(f"{path.relative_to(root.parent)}: {lines} lines (limit < {limit})")
    return found


def test_imports_follow_the_layer_order() -> None:
    found = violations(ROOT, LAYERS)
    assert not found, f"{len(found)} layering violations:\n" + "\n".join(found)


def test_files_stay_under_the_line_limit() -> None:
    found = long_files(ROOT)
    assert not found, "\n".join(found)


# The walker itself, on a fake package: it must see what it is meant to catch.


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "fake"


def test_walker_finds_upward_imports_cycles_and_unplaced_names(tmp_path: Path) -> None:
    root = _write(
        tmp_path,
        {
            "fake/__init__.py": "from fake.top import main\n",
            "fake/low.py": "def f():\n    from fake import high\n",
            "fake/high.py": "from .low import f\n",
            "fake/top/__init__.py": "",
            "fake/top/main.py": "import fake.low\nfrom ..high import f\n",
            "fake/stray.py": "",
        },
    )
    layers = {"low": 1, "high": 2, "top": 3, "__init__": 4, "later": 5}
    found = violations(root, layers)
    assert found[0] == "fake.stray has no layer"
    assert found[1] == "fake/low.py:2 fake.low -> fake.high (layer 1 -> 2)"
    assert found[2].startswith("cycle between fake/high.py, fake/low.py:")
    assert "fake/high.py:1 fake.high -> fake.low" in found[2]
    assert found[3].startswith("cycle between packages fake.high, fake.low:")
    assert len(found) == 4
    edges = {(e.source, e.target) for e in walk(root)}
    assert ("fake", "fake.top.main") in edges  # `from x import submodule` reaches the submodule
    assert ("fake", "fake.top") not in edges  # ... but not every parent `__init__`
    assert ("fake.top.main", "fake.low") in edges
    assert ("fake.top.main", "fake.high") in edges


def test_walker_skips_type_checking_imports_only(tmp_path: Path) -> None:
    files = {
        "fake/__init__.py": "",
        "fake/low.py": (
            "from typing import TYPE_CHECKING\nimport typing\n"
            "if TYPE_CHECKING:\n    from fake.high import g\n"
            "if typing.TYPE_CHECKING:\n    import fake.high\n"
            "else:\n    x = 1\n"
        ),
        "fake/high.py": "from fake import low\n",
    }
    layers = {"low": 1, "high": 2, "__init__": 3}
    assert violations(_write(tmp_path, files), layers) == []
    files["fake/low.py"] += "if not TYPE_CHECKING:\n    from fake import high\n"
    found = violations(_write(tmp_path, files), layers)
    assert found[0] == "fake/low.py:10 fake.low -> fake.high (layer 1 -> 2)"
    assert found[1].startswith("cycle between fake/high.py, fake/low.py:")


def test_walker_finds_a_cycle_between_packages_of_one_layer(tmp_path: Path) -> None:
    """No file cycle, but `a` and `b` need each other: neither can be understood alone."""
    files = {
        "fake/__init__.py": "",
        "fake/a/__init__.py": "",
        "fake/a/x.py": "from fake.b.y import f\n",
        "fake/a/w.py": "",
        "fake/b/__init__.py": "",
        "fake/b/y.py": "def f():\n    pass\n",
        "fake/b/z.py": "from fake.a import w\n",
    }
    found = violations(_write(tmp_path, files), {"a": 1, "b": 1, "__init__": 2})
    assert found == [
        "cycle between packages fake.a, fake.b:\n"
        "    fake/a/x.py:1 fake.a.x -> fake.b.y\n"
        "    fake/b/z.py:1 fake.b.z -> fake.a.w"
    ]


def test_walker_counts_lines_as_wc(tmp_path: Path) -> None:
    root = _write(tmp_path, {"fake/a.py": "x = 1\n" * 399, "fake/b.py": "x = 1\n" * 400})
    assert long_files(root) == ["fake/b.py: 400 lines (limit < 400)"]
