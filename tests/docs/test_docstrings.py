"""The documentation: every public class documented (a summary line, `Args:`, an `Example:`), every
public name in the reference pages that `scripts/docs.sh` builds, and every docstring example run."""

import doctest
import importlib
import inspect
import os
import re

import keras
import numpy as np
import pytest

import keras_tfam

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PUBLIC_MODULES = (
    "keras_tfam.layers",
    "keras_tfam.layers.attention.patterns",
    "keras_tfam.losses",
    "keras_tfam.models",
    "keras_tfam.generation",
    "keras_tfam.engine",
    "keras_tfam.retrieval",
    "keras_tfam.convert",
    "keras_tfam.ops",
)


def public_objects():
    """`{public path: class or function}` of every name in the public modules' `__all__`."""
    found = {}
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) or inspect.isfunction(value):
                found[f"{module_name}.{name}"] = value
    return found


def own_docstring(value):
    """The docstring written on `value` itself (`inspect.getdoc` would fall back on a base class's)."""
    return inspect.cleandoc(value.__dict__.get("__doc__") or "") if inspect.isclass(value) else inspect.getdoc(value)


def missing_parts(docstring):
    lines = docstring.splitlines()
    missing = []
    if not lines or not lines[0].strip() or (len(lines) > 1 and lines[1].strip()):
        missing.append("a summary line")
    if not re.search(r"^Args:$", docstring, re.M):
        missing.append("Args:")
    if not re.search(r"^Examples?:$", docstring, re.M):
        missing.append("Example:")
    return missing


def test_every_public_class_has_a_summary_line_args_and_an_example():
    incomplete = {
        path: missing_parts(own_docstring(value))
        for path, value in public_objects().items()
        if inspect.isclass(value) and missing_parts(own_docstring(value))
    }
    assert not incomplete, "\n".join(f"{path} lacks {', '.join(parts)}" for path, parts in incomplete.items())


def test_every_public_function_has_a_summary_line():
    bad = [
        path
        for path, value in public_objects().items()
        if inspect.isfunction(value) and "a summary line" in missing_parts(own_docstring(value) or "")
    ]
    assert not bad, bad


def reference_entries():
    entries = set()
    folder = os.path.join(REPO, "docs", "reference")
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            entries.update(re.findall(r"^::: (\S+)$", f.read(), re.M))
    return entries


def test_every_public_name_is_in_the_reference():
    entries = reference_entries()
    # A name is documented where it is exported or where it is defined.
    absent = [
        path
        for path, value in public_objects().items()
        if path not in entries and f"{value.__module__}.{value.__qualname__}" not in entries
    ]
    assert not absent, f"not in docs/reference/*.md: {absent}"


class _ShapeChecker(doctest.OutputChecker):
    """Shapes print as tuples on every backend: TensorFlow's `TensorShape([2, 5])` reads `(2, 5)`."""

    def check_output(self, want, got, optionflags):
        got = re.sub(
            r"TensorShape\(\[([^\]]*)\]\)", lambda m: f"({m.group(1)}{',' if ',' not in m.group(1) else ''})", got
        )
        return super().check_output(want, got, optionflags)


def docstring_examples():
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = {}
    for path, value in public_objects().items():
        for test in finder.find(value, path, module=inspect.getmodule(value)):
            if test.examples:
                tests[test.name] = test
    return [tests[name] for name in sorted(tests)]


EXAMPLES = docstring_examples()


@pytest.mark.parametrize("example", EXAMPLES, ids=[test.name for test in EXAMPLES])
def test_docstring_example_runs(example, monkeypatch):
    # As a user runs them: every public name imported, from the repository's root (the examples that
    # load a checkpoint load the tiny ones under tests/fixtures/).
    monkeypatch.chdir(REPO)
    keras.utils.set_random_seed(0)
    example.globs.update({"keras": keras, "np": np, "keras_tfam": keras_tfam})
    example.globs.update({path.rsplit(".", 1)[1]: value for path, value in public_objects().items()})
    runner = doctest.DocTestRunner(checker=_ShapeChecker(), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    runner.run(example, out=report.append)
    assert runner.failures == 0, "".join(report)
