"""Structure guards over arctic_rl/'s source, read with `ast` (nothing is imported):

- the module-level imports of the package form no cycle (imports inside functions run lazily, once both modules
  have loaded, and are not counted);
- no module sets a global of another package module (`mod.NAME = ...`, `setattr(mod, ...)`): what a module
  needs from its caller is passed to it as an argument.

Each check is also run on a small package written to tmp_path that breaks it, so a check that cannot fail
would show here.
"""

from __future__ import annotations

import ast
from pathlib import Path

from repo_paths import REPO

PACKAGE = REPO / "arctic_rl"


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the package `root` (a package is named by its
    __init__.py)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _package_of(module: str, path: Path) -> str:
    """The package a relative import in `module` is relative to."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _imported(node: ast.Import | ast.ImportFrom, module: str, path: Path, modules: dict) -> list[tuple[str, str, str]]:
    """(bound name, package module bound to it, package module loaded) for each package module one import
    statement names. `import a.b` loads a.b and binds `a`; `from pkg import x` refers to the module pkg.x when
    there is one, else to pkg (x is a name in it)."""
    out = []
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name in modules:
                top = a.name.partition(".")[0]
                out.append((a.asname, a.name, a.name) if a.asname else (top, top, a.name))
        return out
    if node.level:
        base = _package_of(module, path)
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        source = f"{base}.{node.module}" if node.module else base
    else:
        source = node.module or ""
    for a in node.names:
        sub = f"{source}.{a.name}"
        target = sub if sub in modules else source if source in modules else None
        if target is not None:
            out.append((a.asname or a.name, target, target))
    return out


def _type_checking_only(node: ast.stmt) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _module_level_imports(body: list[ast.stmt]):
    """Import statements that run when the module is imported: the top level, including inside top-level
    if/try/with blocks and class bodies; not inside functions (run later) nor under `if TYPE_CHECKING:`."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or _type_checking_only(node):
            continue
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                yield from _module_level_imports(
                    [n for n in getattr(node, field, []) if isinstance(n, (ast.stmt, ast.excepthandler))]
                )


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the package modules its module-level imports load. Importing a.b.c also runs a/__init__ and
    a/b/__init__, but those implicit parent edges are left out: a package's __init__ importing its own
    submodules is the normal pattern, not a cycle."""
    modules = module_files(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = {
            target
            for node in _module_level_imports(tree.body)
            for _, _, target in _imported(node, name, path, modules)
            if target != name
        }
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [m0, m1, ..., m0], or None (depth-first search, white/grey/black)."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n) :] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def _module_named(expr: ast.expr, aliases: dict[str, str], modules: dict, own: str) -> str | None:
    """The package module (other than `own`) that `expr` names: a bound alias, or a dotted path such as
    arctic_rl.engines.forward after `import arctic_rl.engines.forward` (which binds only `arctic_rl`)."""
    if isinstance(expr, ast.Name):
        target = aliases.get(expr.id)
        return target if target is not None and target != own else None
    if isinstance(expr, ast.Attribute):
        dotted = ast.unparse(expr)
        if dotted in modules and dotted != own and dotted.partition(".")[0] in aliases:
            return dotted
    return None


def _writes_in(name: str, path: Path, modules: dict) -> list[ast.AST]:
    tree = ast.parse(path.read_text(), str(path))
    aliases = {
        bound: target
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for bound, target, _ in _imported(node, name, path, modules)
    }
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            if node.args and _module_named(node.args[0], aliases, modules, name):
                found.append(node)
            continue
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        flat = [e for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])]
        if any(isinstance(t, ast.Attribute) and _module_named(t.value, aliases, modules, name) for t in flat):
            found.append(node)
    return found


def foreign_global_writes(root: Path) -> list[str]:
    """`file:line: text` of every statement that assigns, augments or deletes an attribute of an imported
    package module, or calls setattr/delattr on one. Imports anywhere in the file count (a function-level
    import binds the module as well as a top-level one)."""
    modules = module_files(root)
    found = sorted(
        (path, node.lineno, ast.unparse(node))
        for name, path in modules.items()
        for node in _writes_in(name, path, modules)
    )
    return [f"{p.relative_to(root.parent)}:{line}: {text}" for p, line, text in found]


def _write_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "pkg"


def test_no_import_cycle():
    """Module-level imports only: an import inside a function runs when the function is called, after both
    modules finished loading, so it is left out (it is the sanctioned way to import something heavy lazily)."""
    cycle = find_cycle(import_graph(PACKAGE))
    assert cycle is None, "import cycle among arctic_rl modules: " + " -> ".join(cycle or [])


def test_import_cycle_check_finds_cycles(tmp_path):
    pkg = _write_package(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import f\n",
            "pkg/a.py": "from . import b\n\ndef f():\n    from pkg import c\n",
            "pkg/b.py": "try:\n    from .sub.c import g\nexcept ImportError:\n    pass\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/c.py": "import pkg.a as a\n",
            "pkg/c.py": "from pkg import a\n",  # reached from a only lazily: no cycle through it
        },
    )
    assert import_graph(pkg)["pkg.a"] == {"pkg.b"}
    assert find_cycle(import_graph(pkg)) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]
    (pkg / "sub/c.py").write_text("def h():\n    import pkg.a\n")
    assert find_cycle(import_graph(pkg)) is None


def test_no_module_sets_another_modules_global():
    """Module globals are set by their own module only; what a caller wants changed is passed as an argument."""
    writes = foreign_global_writes(PACKAGE)
    assert not writes, "modules setting another module's global:\n" + "\n".join(writes)


def test_foreign_global_check_finds_writes(tmp_path):
    pkg = _write_package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "FLAG = False\n",
            "pkg/b.py": (
                "import pkg.a\n"
                "from pkg import a as mod\n"
                "def f():\n"
                "    from . import a\n"
                "    a.FLAG = True\n"
                "    setattr(mod, 'FLAG', 1)\n"
                "    pkg.a.FLAG += 1\n"
                "    obj = object()\n"
                "    obj.a = 1\n"  # not a module
            ),
        },
    )
    writes = foreign_global_writes(pkg)
    assert [w.split(": ", 1)[1] for w in writes] == [
        "a.FLAG = True",
        "setattr(mod, 'FLAG', 1)",
        "pkg.a.FLAG += 1",
    ], writes
