"""List the functions and methods longer than a limit (default 60 lines), longest first.

Usage: python tools/long_functions.py [--limit N] [PATH ...]
(default: the installed package, sync_mnist/ and its subpackages). A function's length runs from its
`def` (decorators excluded) to its last line, docstring and comments included; a nested
function counts in its parent too, and is listed on its own when it is long itself.
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


def long_functions(paths, limit):
    """Returns (lines, "file:line qualified.name") for each function longer than limit."""
    found = []
    for path in _python_files(paths):
        tree = ast.parse(path.read_text(), str(path))

        def visit(node, prefix):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = prefix + child.name
                    if not isinstance(child, ast.ClassDef):
                        lines = child.end_lineno - child.lineno + 1
                        if lines > limit:
                            found.append((lines, f"{path}:{child.lineno} {name}"))
                    visit(child, name + ".")

        visit(tree, "")
    return sorted(found, key=lambda item: (-item[0], item[1]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=60, help="longest allowed (default 60)")
    parser.add_argument("paths", nargs="*", default=DEFAULT_PATHS,
                        help="files or folders (default: sync_mnist/)")
    args = parser.parse_args(argv)
    for lines, where in long_functions(args.paths, args.limit):
        print(f"{lines:4d}  {where}")


if __name__ == "__main__":
    sys.exit(main())
