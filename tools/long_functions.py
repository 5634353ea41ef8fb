"""List the functions longer than a limit (default 60 lines) and the classes longer than
another (default 150), longest first; exit 1 if there is any.

Usage: python tools/long_functions.py [--limit N] [--class-limit N] [PATH ...]
(default: the installed package, sync_mnist/ and its subpackages). A unit's length runs from
its `def` or `class` (decorators excluded) to its last line, docstring and comments included;
a nested function counts in its parent too, and is listed on its own when it is long itself.
`make test` runs it (tests/fast/test_house.py).
"""
import argparse
import ast
import pathlib
import sys

DEFAULT_PATHS = ("sync_mnist",)


def _python_files(paths):
    for path in map(pathlib.Path, paths):
        if path.is_dir():
            yield from sorted(path.rglob("*.py"))
        else:
            yield path


def long_units(paths, limit=60, class_limit=150):
    """Returns (lines, "file:line qualified.name") for each function longer than `limit` and
    each class longer than `class_limit`."""
    found = []
    for path in _python_files(paths):
        tree = ast.parse(path.read_text(), str(path))

        def visit(node, prefix):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = prefix + child.name
                    lines = child.end_lineno - child.lineno + 1
                    bound = class_limit if isinstance(child, ast.ClassDef) else limit
                    if lines > bound:
                        kind = "class " if isinstance(child, ast.ClassDef) else ""
                        found.append((lines, f"{path}:{child.lineno} {kind}{name}"))
                    visit(child, name + ".")

        visit(tree, "")
    return sorted(found, key=lambda item: (-item[0], item[1]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=60,
                        help="longest function allowed (default 60)")
    parser.add_argument("--class-limit", type=int, default=150,
                        help="longest class allowed (default 150)")
    parser.add_argument("paths", nargs="*", default=DEFAULT_PATHS,
                        help="files or folders (default: sync_mnist/)")
    args = parser.parse_args(argv)
    found = long_units(args.paths, args.limit, args.class_limit)
    for lines, where in found:
        print(f"{lines:4d}  {where}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
