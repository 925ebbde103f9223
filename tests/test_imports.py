"""The package's house rules: imports run one way, and modules stay short."""

import ast
from pathlib import Path

import specbook

PACKAGE = Path(specbook.__file__).parent
MAX_LINES = 400  # a longer module says why in its docstring, in a sentence that starts "Long because"


def _module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path):
    """The specbook modules ``path`` imports, at the top or inside a function."""
    name, found = _module_name(path), set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] == "specbook":
                modules = [f"{base}.{alias.name}" for alias in node.names]
                found |= {module for module in modules if module in MODULES} or {base}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "specbook"}
    return {module for module in found if module != name}


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def test_imports_have_no_cycle():
    graph = {name: {m for m in _imports(path) if m in MODULES} for name, path in MODULES.items()}
    graph = {name: {m for m in targets if not name.startswith(m + ".") and m != "specbook"}
             for name, targets in graph.items()}  # a submodule may use its package's names
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target, stack + [target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_modules_are_short_or_say_why():
    long = [f"{name} ({lines} lines)" for name, path in MODULES.items()
            if (lines := len(path.read_text().splitlines())) > MAX_LINES
            and "Long because" not in (ast.get_docstring(ast.parse(path.read_text())) or "")]
    assert not long, f"modules over {MAX_LINES} lines without a reason in their docstring: {', '.join(long)}"
