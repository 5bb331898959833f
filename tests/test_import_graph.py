"""The library's import graph: no cycles, arrows pointing down (STYLE.md), no reach into private members."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "keras_tfam"


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules():
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def import_graph():
    """`{module: {imported keras_tfam modules}}`, imports inside functions included."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
                # `from package import module` is an edge to the module; otherwise to the module named.
                targets = [t for t in targets[:-1] if t in modules] or [node.module]
            else:
                continue
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def find_cycles(graph):
    """Every elementary cycle found by depth-first search from each module (as sorted tuples, deduplicated)."""
    cycles, state = set(), {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for target in graph.get(node, ()):
            if state.get(target) == "open":
                cycles.add(tuple(stack[stack.index(target):]))
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return sorted(cycles)


def test_find_cycles_finds_a_cycle():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b", "c")]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_the_library_has_no_import_cycle():
    assert find_cycles(import_graph()) == []


def test_arrows_point_down():
    graph = import_graph()
    for module, targets in graph.items():
        for target in targets:
            if module.startswith("keras_tfam.layers"):
                assert not target.startswith("keras_tfam.models"), f"{module} imports {target}: layers never import models"
            if module.startswith("keras_tfam.models"):
                assert not target.startswith("keras_tfam.convert"), f"{module} imports {target}: models never import their loaders"


def test_no_reach_into_another_objects_private_members():
    # `other._name` for any `other` but `self` / `cls` / `super()` (dunder names and modules' privates aside).
    reach = re.compile(r"\b(?!self\b|cls\b)([a-z_][a-z0-9_]*)\._(?!_)[a-z]")
    allowed = {"keras", "ops", "np", "tf", "jax", "torch", "math", "os", "random", "sys"}
    # Each exception names the line and why no public route exists.
    exceptions = {
        # A loaded quantized model's layers hold a DTypePolicyMap that Keras' `save_own_variables` misreads;
        # the public `dtype_policy` setter writes into the map instead of replacing it.
        "keras_tfam/models/quantization.py: layer._dtype_policy = policy[layer.path]",
        # A checkpoint loader gives Keras' deferred variables their first value from the checkpoint (no
        # random draw of 250M weights to throw away); Keras initializes a deferred variable only through
        # its initializer, and has no public call for one variable (undrawn_variables.py says more).
        "keras_tfam/convert/undrawn_variables.py: variable._initializer = lambda shape, dtype: value",
        "keras_tfam/convert/undrawn_variables.py: variable._deferred_initialize()",
    }
    found = []
    for path in PACKAGE.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            for match in reach.finditer(code):
                if match.group(1) not in allowed and not code.lstrip().startswith(("from ", "import ")):
                    if f"{path.relative_to(ROOT)}: {code.strip()}" not in exceptions:
                        found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []
