"""The library's import graph: no cycles, arrows pointing down (STYLE.md), no reach into private members,
and other libraries' private code left theirs (no private imports, no patching, no private overrides)."""

import ast
import importlib
import inspect
import pathlib
import pkgutil
import re
import sys

import keras

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "keras_tfam"
# Where our code lives: the library, the TensorFlow pipelines and the tests.
CHECKED = ("keras_tfam", "pipelines", "tests")


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
                cycles.add(tuple(stack[stack.index(target) :]))
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
                assert not target.startswith("keras_tfam.models"), (
                    f"{module} imports {target}: layers never import models"
                )
            if module.startswith("keras_tfam.models"):
                assert not target.startswith("keras_tfam.convert"), (
                    f"{module} imports {target}: models never import their loaders"
                )


def _checked_files():
    for folder in CHECKED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "fixtures" not in path.relative_to(ROOT).parts:
                yield path


def _where(path, node):
    return f"{path.relative_to(ROOT) if path.is_absolute() else path}:{node.lineno}"


# Our own top-level modules: the packages and the tests' helpers (`backend`, `pipeline_runs`, ...).
OURS = set(CHECKED) | {p.stem for p in (ROOT / "tests").rglob("*.py")} | {"conftest"}


def _external(module):
    """Whether `module` (a dotted name) is another library's: neither ours nor Python's own."""
    root = module.split(".")[0]
    return bool(root) and root not in OURS and root not in sys.stdlib_module_names


def _private_module(module):
    """Another library's private module: `keras.src`, `tensorflow.python`, or any `_name` part (`jax._src`)."""
    parts = module.split(".")
    return _external(module) and (
        parts[:2] in (["keras", "src"], ["tensorflow", "python"])
        or any(part.startswith("_") and not part.startswith("__") for part in parts[1:])
    )


def private_imports(source, path=pathlib.Path("x.py")):
    """`import` / `from ... import` of other libraries' private modules (inside functions too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [f"{_where(path, node)}: imports {name}" for name in names if _private_module(name)][:1]
    return found


def _bindings(tree):
    """`{name: dotted name}` of what a file imports from other libraries (`tf` -> `tensorflow`)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _external(alias.name):
                    top = alias.name.split(".")[0]
                    names[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and _external(node.module):
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _root_name(node):
    """The name an attribute chain starts from (`keras` of `keras.backend.x`; `TFLayer` of `type(TFLayer).y`)."""
    in_type = False
    while True:
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type" and node.args:
            node, in_type = node.args[0], True
        elif isinstance(node, ast.Call) and in_type:  # `type(keras.export.ExportArchive())`: the class
            node = node.func
        else:
            return node.id if isinstance(node, ast.Name) else None


def patches(source, path=pathlib.Path("x.py")):
    """Assignments to attributes of other libraries' modules or classes: `keras.x = ...`, `TFLayer.y = ...`,
    `setattr(module, ...)`, `delattr(...)`, `monkeypatch.setattr(module_or_class, ...)` or
    `monkeypatch.setattr("keras.x", ...)`."""
    tree = ast.parse(source)
    external = _bindings(tree)
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            targets = [t for t in targets if isinstance(t, ast.Attribute)]
        elif isinstance(node, ast.Call) and node.args:
            function = node.func
            name = function.id if isinstance(function, ast.Name) else getattr(function, "attr", None)
            if name in ("setattr", "delattr", "setitem", "delitem"):
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    if _external(first.value.split(".")[0]) and "." in first.value:
                        found.append(f"{_where(path, node)}: {name}({first.value!r}, ...)")
                    continue
                targets = [first] if name in ("setattr", "delattr") else []
        for target in targets:
            root = _root_name(target)
            if root in external:
                found.append(f"{_where(path, node)}: {ast.unparse(target)} (of {external[root]})")
    return found


def test_the_checks_catch_private_imports_and_patches():
    assert private_imports("from keras.src.backend import set_keras_mask")
    assert private_imports("def f():\n    from jax._src.interpreters import mlir")
    assert private_imports("import tensorflow.python.ops.array_ops as a")
    assert private_imports("from tensorflow import python")
    assert not private_imports("import keras\nfrom keras import ops\nimport tensorflow as tf\nimport os._x")
    assert patches("import keras\nkeras.config.x = 1")
    assert patches("from keras.src.backend.tensorflow.layer import TFLayer\nTFLayer._default_save_signature = None")
    assert patches("from keras.src.backend.tensorflow import trainer as t\nt.reduce_per_replica = f")
    assert patches("import keras\nsetattr(keras.layers.Dense, 'call', f)")
    assert patches("import keras\nmonkeypatch.setattr(type(keras.export.ExportArchive()), 'w', f)")
    assert patches("def test(monkeypatch):\n    monkeypatch.setattr('keras.utils.x', f)")
    assert not patches("import keras\nmodel = keras.Model()\nmodel.train_step = f")
    assert not patches("import os\nos.environ['A'] = '1'")
    assert not patches("from pipelines import export\ndef test(monkeypatch):\n    monkeypatch.setattr(export, 'f', g)")


def test_no_private_imports_of_other_libraries():
    found = []
    for path in _checked_files():
        found += private_imports(path.read_text(), path)
    assert found == []


def test_no_patching_of_other_libraries():
    found = []
    for path in _checked_files():
        found += patches(path.read_text(), path)
    assert found == []


# The hooks Keras documents for quantization-compatible layers (keras.io, "Writing quantization-compatible layers";
# `keras.layers.Layer.quantized_build` / `quantized_call` dispatch to them), which a layer overrides.
QUANTIZATION_HOOKS = {
    f"_{mode}_{step}" for mode in ("int8", "int4", "float8", "gptq", "awq") for step in ("build", "call")
}
# Keras' `MultiHeadAttention._compute_attention` is documented for subclasses to override; our attention layers
# keep that hook, so a test's attention subclass overriding it is overriding ours.
DOCUMENTED_HOOKS = QUANTIZATION_HOOKS | {"_compute_attention"}
# The one module of each package that works around Keras where it has no public way, each work-around tested
# against the Keras behaviour it exists for (tests/test_keras_compat.py, tests/pipelines/test_multi_worker_fit.py).
WORKAROUND_MODULES = {"keras_tfam.keras_compat", "pipelines.keras_workarounds"}


def _library_classes():
    for folder in ("keras_tfam", "pipelines"):
        for info in pkgutil.walk_packages([str(ROOT / folder)], prefix=f"{folder}."):
            module = importlib.import_module(info.name)
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if cls.__module__ == info.name:
                    yield cls


def private_overrides(cls):
    """Methods of `cls` named `_x` that override one defined by a Keras class it derives from."""
    keras_bases = [base for base in cls.__mro__[1:] if base.__module__.split(".")[0] == "keras"]
    return [
        f"{cls.__module__}.{cls.__qualname__}.{name}"
        for name in vars(cls)
        if name.startswith("_")
        and not name.startswith("__")
        and name not in QUANTIZATION_HOOKS
        and any(name in vars(base) for base in keras_bases)
    ]


def private_uses(cls, keras_private=None):
    """`self._x` / `super()._x` in `cls`'s own methods where `_x` is a Keras class's private member, not ours
    (in a mixin, any Keras class's: `keras_private`)."""
    keras_bases = [base for base in cls.__mro__[1:] if base.__module__.split(".")[0] == "keras"]
    ours = set().union(*(vars(base) for base in cls.__mro__ if base.__module__.split(".")[0] != "keras"))
    if not keras_bases and keras_private:
        keras_bases = [type("KerasPrivate", (), dict.fromkeys(keras_private))]
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return []
    names = set(re.findall(r"\b(?:self|super\(\))\.(_(?!_)\w+)", source))
    return [
        f"{cls.__module__}.{cls.__qualname__}: self.{name}"
        for name in sorted(names)
        if name not in ours and name not in QUANTIZATION_HOOKS and any(name in vars(base) for base in keras_bases)
    ]


def test_the_override_check_catches_a_private_override():
    class Leaky(keras.layers.Dense):
        def _get_kernel_with_merged_lora(self):
            return None

        def _int8_call(self, inputs):
            return inputs

    assert private_overrides(Leaky) == [f"{__name__}.{Leaky.__qualname__}._get_kernel_with_merged_lora"]

    class Untracking(keras.layers.Layer):
        def drop(self, variable):
            self._untrack_variable(variable)

    assert private_uses(Untracking) == [f"{__name__}.{Untracking.__qualname__}: self._untrack_variable"]


def _keras_private_names():
    """Every `_name` a class of the public `keras` namespace defines."""
    names = set()
    for module in (
        keras.layers,
        keras.models,
        keras.losses,
        keras.metrics,
        keras.callbacks,
        keras.optimizers,
        keras.initializers,
        keras.regularizers,
        keras.constraints,
        keras.dtype_policies,
        keras.random,
    ):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            for base in cls.__mro__:
                if base.__module__.split(".")[0] == "keras":
                    names.update(n for n in vars(base) if n.startswith("_") and not n.startswith("__"))
    return names


def test_no_overrides_or_calls_of_keras_private_methods():
    keras_private = _keras_private_names()
    found = [
        name
        for cls in _library_classes()
        if cls.__module__ not in WORKAROUND_MODULES
        for name in private_overrides(cls) + private_uses(cls, keras_private)
    ]
    # The tests' own classes, read from their source: a `_name` method Keras defines, in a class with a base.
    private = keras_private - DOCUMENTED_HOOKS
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path.name == "test_import_graph.py":
            continue  # this file's own examples
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.bases:
                found += [
                    f"{_where(path, item)}: {node.name}.{item.name}"
                    for item in node.body
                    if isinstance(item, ast.FunctionDef) and item.name in private
                ]
    assert found == []


def _own_modules(source):
    """Names a file binds to our own modules (`from pipelines import training`, `import keras_tfam.cpu as cpu`)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.asname or a.name.split(".")[0] for a in node.names if not _external(a.name))
        elif isinstance(node, ast.ImportFrom) and node.module and not _external(node.module):
            for alias in node.names:
                where = ROOT.joinpath(*node.module.split("."), alias.name)
                if where.with_suffix(".py").is_file() or where.is_dir():
                    names.add(alias.asname or alias.name)
    return names


def test_no_reach_into_another_objects_private_members():
    # `other._name` for any `other` but `self` / `cls` / `super()` (dunder names aside): other libraries'
    # objects (`keras.backend._x`, `tf._x`, `np._x`) included.
    reach = re.compile(r"\b(?!self\b|cls\b)([a-z_][a-z0-9_]*)\._(?!_)[a-z]")
    # Python's own functions named so on purpose: `os._exit` (exit without cleanup), `sys._getframe`.
    allowed = {"os", "sys"}
    # Each exception names the line and why no public route exists.
    exceptions = {
        # Keras' public `dtype_policy` setter writes into a layer's `DTypePolicyMap` instead of replacing it
        # (tests/test_keras_compat.py fails when that changes).
        "keras_tfam/keras_compat.py: layer._dtype_policy = policy",
    }
    found = []
    for path in _checked_files():
        if path.name == "test_import_graph.py":
            continue  # this file's own examples
        modules = _own_modules(path.read_text())  # our modules' privates are ours to test
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            for match in reach.finditer(code):
                name = match.group(1)
                if name not in allowed and name not in modules and not code.lstrip().startswith(("from ", "import ")):
                    if f"{path.relative_to(ROOT)}: {code.strip()}" not in exceptions:
                        found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []
