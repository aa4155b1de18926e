"""House style 19: public simcore functions carry numpydoc Parameters/Returns.

Walks every module under ``simcore/`` with ``ast`` (nothing is imported, so no
numba compilation).  For every public top-level function that takes at least one
argument, the docstring must have a ``Parameters`` section, and a ``Returns``
section unless the body has no ``return <value>`` statement (kernels that write
caller-allocated outputs document them under Parameters).
"""
import ast
import re
from pathlib import Path

SIMCORE = Path(__file__).resolve().parent.parent / "simcore"


def _has_section(doc, name):
    """True if ``doc`` has a numpydoc section header ``name`` underlined by dashes."""
    return re.search(rf"^\s*{name}\s*\n\s*-{{3,}}\s*$", doc, re.MULTILINE) is not None


def _n_args(fn):
    a = fn.args
    return (len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
            + (a.vararg is not None) + (a.kwarg is not None))


def _returns_value(fn):
    """True if ``fn`` itself (not a nested def/lambda/class) has ``return <value>``."""
    stack = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Return) and node.value is not None:
            if not (isinstance(node.value, ast.Constant) and node.value.value is None):
                return True
        stack.extend(ast.iter_child_nodes(node))
    return False


def _offenders():
    out = []
    for path in sorted(SIMCORE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = path.relative_to(SIMCORE.parent)
        for fn in tree.body:
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if fn.name.startswith("_") or _n_args(fn) == 0:
                continue
            doc = ast.get_docstring(fn) or ""
            missing = []
            if not _has_section(doc, "Parameters"):
                missing.append("Parameters")
            if _returns_value(fn) and not _has_section(doc, "Returns"):
                missing.append("Returns")
            if missing:
                out.append(f"{rel}:{fn.lineno} {fn.name}: missing {', '.join(missing)}")
    return out


def test_checker_sees_modules():
    assert any(SIMCORE.rglob("*.py")), SIMCORE


def test_public_functions_have_numpydoc_sections():
    offenders = _offenders()
    assert not offenders, (f"{len(offenders)} public simcore function(s) lack numpydoc "
                           "sections (STYLE.md 19):\n  " + "\n  ".join(offenders))
