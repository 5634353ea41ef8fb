"""The house rules of the installed package (issue 43): no long units, a core that knows no
model, and no test infrastructure or study among what gets installed."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import setuptools

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import long_functions  # noqa: E402  (tools/ is no package)

# What the core is, for the model search: everything installed but the built-in models and
# their data (models/), the tools (tools/, used after a run; bench/, which benchmarks the
# built-in models) and the question's program replayed (specimen/), about MNIST by design.
NOT_CORE = ("models", "tools", "bench", "specimen")
ABOUT_MNIST = re.compile(r"mnist|digits|28x28|784", re.IGNORECASE)
OWN_NAME = re.compile(r"sync[_-]mnist", re.IGNORECASE)
# lab/'s modules: test infrastructure and studies, in the repository only.
LAB = ("testbed", "delay", "loopback_faults", "chaos", "scaling", "straggler", "sparse_bytes")


def mentions_of_mnist(files) -> list[str]:
    """Lines that name MNIST, digits, 28x28 or 784 (the package's own name aside), except
    comments that name the question's example."""
    found = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            text = OWN_NAME.sub("", line)
            if not ABOUT_MNIST.search(text):
                continue
            if text.lstrip().startswith("#") and "question" in text:
                continue
            found.append(f"{path}:{number}: {line.strip()}")
    return found


def core_files() -> list[Path]:
    package = ROOT / "sync_mnist"
    return [p for p in sorted(package.rglob("*.py"))
            if p.relative_to(package).parts[0] not in NOT_CORE]


def test_no_function_over_60_lines_and_no_class_over_150(tmp_path):
    assert long_functions.long_units([ROOT / "sync_mnist"]) == []
    # ...and the check sees one: a 61-line function and a 151-line class.
    lines = ["    x = 0\n"] * 150
    (tmp_path / "long.py").write_text("def f():\n" + "".join(lines[:60]) + "\n\nclass C:\n"
                                      + "".join(lines) + "\n\ndef g():\n" + "".join(lines[:59]))
    found = [where.split()[-1] for _, where in long_functions.long_units([tmp_path])]
    assert sorted(found) == ["C", "f"]


def test_the_core_knows_no_model(tmp_path):
    files = core_files()
    assert any(p.name == "sync.py" for p in files) and not any("models" in p.parts for p in files)
    assert mentions_of_mnist(files) == []
    # ...and the search finds what it looks for, but a comment on the question's example.
    probe = tmp_path / "probe.py"
    probe.write_text("# the question's MLP 784-256-256-10\nimport sync_mnist\n"
                     "IMAGE = 28  # 28x28 digits\nDATA = 'MNIST'\n")
    assert [m.split(": ", 1)[1] for m in mentions_of_mnist([probe])] == [
        "IMAGE = 28  # 28x28 digits", "DATA = 'MNIST'"]


def test_the_installed_package_holds_no_test_infrastructure_or_study():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = setuptools.find_packages(str(ROOT), **config["packages"]["find"])
    assert "sync_mnist" in packages and "sync_mnist.core" in packages
    assert all(p == "sync_mnist" or p.startswith("sync_mnist.") for p in packages), packages
    installed = {p.stem for p in (ROOT / "sync_mnist").rglob("*.py")}
    assert installed.isdisjoint(LAB), sorted(installed & set(LAB))
    assert all((ROOT / "lab" / f"{name}.py").is_file() for name in LAB)
    # Nothing installed imports lab/: it is not there once installed.
    importers = [str(p.relative_to(ROOT)) for p in (ROOT / "sync_mnist").rglob("*.py")
                 if re.search(r"^\s*(from lab\b|import lab\b)", p.read_text(), re.M)]
    assert importers == []


def layout_paths(text: str) -> set[str]:
    """The .py paths the layout's tree names: each entry's indentation (two spaces a level)
    says its folder."""
    block = text.split("## Layout, in full", 1)[1].split("```", 2)[1]
    folders, paths = [], set()
    for line in block.splitlines():
        name = line.split()[0] if line.strip() else ""
        depth = (len(line) - len(line.lstrip())) // 2
        if not name or depth > 4:  # blank, or a description's second line
            continue
        del folders[depth:]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        elif name.endswith(".py") and name != "__init__.py":
            paths.add("/".join([*folders, name]))
    return paths


def test_the_layout_names_every_module_and_no_other():
    listed = layout_paths((ROOT / "docs" / "details.md").read_text())
    actual = {str(p.relative_to(ROOT)) for folder in ("sync_mnist", "lab")
              for p in (ROOT / folder).rglob("*.py") if p.name != "__init__.py"}
    assert sorted(actual - listed) == [] and sorted(listed - actual) == []
    # ...and the parse sees a module in the wrong folder.
    moved = layout_paths("## Layout, in full\n```\nsync_mnist/\n  core/\n    a.py   x\n"
                         "  b.py   y\n```\n")
    assert moved == {"sync_mnist/core/a.py", "sync_mnist/b.py"}


def import_graph(package: Path) -> dict[str, set[str]]:
    """{module: the package's modules it imports}, every import counted: at the top, in a
    function, under TYPE_CHECKING. A package's __init__ is the package's name."""
    import ast

    names = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str | None:
        while name and name not in names:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in names.items():
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        graph[module] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [known(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[:len(here.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [known(f"{base}.{a.name}") for a in node.names]
            else:
                continue
            graph[module] |= {t for t in targets if t and t != module}
    return graph


def import_circle(graph: dict[str, set[str]]) -> list[str] | None:
    import graphlib

    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        return e.args[1]
    return None


def test_no_import_circle_in_the_package(tmp_path):
    assert import_circle(import_graph(ROOT / "sync_mnist")) is None
    # ...and the search sees one made through a function's import.
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "__init__.py").write_text("")
    (tmp_path / "p" / "a.py").write_text("from p import b\n")
    (tmp_path / "p" / "b.py").write_text("def f():\n    from . import a\n")
    assert sorted(set(import_circle(import_graph(tmp_path / "p")))) == ["p.a", "p.b"]


def test_the_models_package_is_a_table_of_names():
    """sync_mnist/models/__init__.py names the built-in models and nothing else: their data
    reaches them as any model's does, through their params (models/params.py)."""
    tree = ast.parse((ROOT / "sync_mnist" / "models" / "__init__.py").read_text())
    kinds = {type(node).__name__ for node in tree.body[1:]}  # the docstring first
    assert kinds == {"Assign"}
    names = {target.id for node in tree.body[1:] for target in node.targets}
    assert names == {"BUILT_IN", "DEFAULT", "DEFAULT_EPOCHS"}
