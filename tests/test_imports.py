"""No import cycle among simcore's modules (issue 26).

Every import counts: top-level, under ``if TYPE_CHECKING:`` and inside
functions (lazy), since each is a dependency of one module on another even
when it does not run at import time.  Modules are read with ``ast``; nothing
is imported (no numba compilation).  Importing ``simcore.a.b`` also runs the
package ``simcore.a``'s ``__init__``; those implicit edges are left out (the
``__init__`` files are facades), only the imports written in a module count.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIMCORE = ROOT / "simcore"


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _graph():
    paths = {_module_name(p): p for p in sorted(SIMCORE.rglob("*.py"))}
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}" if base else anchor
                for alias in node.names:  # ``from simcore.timing import aic`` names a module
                    sub = f"{base}.{alias.name}"
                    targets.add(sub if sub in paths else base)
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def _cycle(graph):
    """One cycle of the graph as a list of modules, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_module_graph_reads_simcore_imports():
    graph = _graph()
    assert "simcore.config" in graph and "simcore.timing.aic" in graph
    # a top-level, a TYPE_CHECKING and a function-level import are all edges
    assert "simcore.derive" in graph["simcore.config"]
    assert "simcore.settings" in graph["simcore.bounds"]  # under TYPE_CHECKING
    assert "simcore.timing.api" in graph["simcore.bounds"]  # inside a function


def test_simcore_has_no_import_cycle():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
