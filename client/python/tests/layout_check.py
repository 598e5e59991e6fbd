"""Checks the shardload package's layout: no import circle among its modules (every
import counted, those inside functions and under TYPE_CHECKING too) and no module over
500 lines.

    layout_check.py [PACKAGE_DIR]    default: ../shardload

integration's TestPythonClientLayout runs it. Prints one JSON line, {"modules": N},
and exits 0; otherwise prints the circles and the long modules and exits 1.
"""

import ast
import json
import os
import sys

MAX_LINES = 500


def imports(path, package, modules):
    """The package's modules that the module at path imports."""
    out = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                if node.module:
                    out.add(node.module.split(".")[0])
                else:  # from . import x
                    out.update(a.name for a in node.names)
            elif node.level == 0 and node.module and node.module.split(".")[0] == package:
                parts = node.module.split(".")
                if len(parts) > 1:
                    out.add(parts[1])
                else:  # from shardload import x
                    out.update(a.name for a in node.names)
            elif node.level > 1:
                raise SystemExit(f"{path}: relative import above the package")
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == package and len(parts) > 1:
                    out.add(parts[1])
    return out & modules


def circles(graph):
    """Every import circle, each once, as a list of modules."""
    found, seen = [], set()

    def visit(m, path):
        for d in sorted(graph[m]):
            if d in path:
                c = path[path.index(d):]
                i = c.index(min(c))
                key = tuple(c[i:] + c[:i])
                if key not in seen:
                    seen.add(key)
                    found.append(list(key) + [key[0]])
            else:
                visit(d, path + [d])

    for m in sorted(graph):
        visit(m, [m])
    return found


def main(pkg):
    pkg = os.path.abspath(pkg)
    package = os.path.basename(pkg)
    files = {f[:-3]: os.path.join(pkg, f) for f in os.listdir(pkg) if f.endswith(".py")}
    modules = set(files)
    # __init__ is left out: it imports the modules, which import one another.
    graph = {m: imports(p, package, modules) - {m} for m, p in files.items() if m != "__init__"}
    problems = []
    for c in circles(graph):
        problems.append("import circle: " + " -> ".join(c))
    for m, p in sorted(files.items()):
        n = len(open(p, encoding="utf-8").read().splitlines())
        if n > MAX_LINES:
            problems.append(f"{m}.py has {n} lines (at most {MAX_LINES}): split it by idea")
    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print(json.dumps({"modules": len(files)}))


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "shardload"))
