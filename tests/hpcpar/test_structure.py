"""The house rules, checked on the source: no import cycles, no borrowed private names,
the core never imports an app, every module says what it is for and what it exports."""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

import hpcpar

ROOT = Path(__file__).resolve().parents[2]
# where the import system finds them (setup.cfg's package_dir places two outside hpcpar/)
PACKAGES = {
    name: Path(importlib.util.find_spec(name).submodule_search_locations[0])
    for name in ("hpcpar", "hpcpar.checkpoint", "hpcpar.apps")
}


def _modules() -> dict[str, Path]:
    out = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, str | None]]:
    """(module imported, name taken from it or None), every import statement, nested too."""
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")[: len(base.split(".")) - node.level + 1]
                target = ".".join(parts + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub, None) if sub in MODULES else (target, alias.name))
    return found


@functools.cache
def _graph() -> dict[str, list[tuple[str, str | None]]]:
    """Every module's imports (parsed when a test first needs them, not at collection)."""
    return {name: _imports(name, path) for name, path in MODULES.items()}


def test_no_import_cycles():
    edges = {n: {t for t, _ in found if t in MODULES and t != n} for n, found in _graph().items()}
    cycles, seen, path = [], set(), []

    def visit(node: str) -> None:
        if node in path:
            cycles.append([*path[path.index(node) :], node])
            return
        if node in seen:
            return
        seen.add(node)
        path.append(node)
        for nxt in sorted(edges[node]):
            visit(nxt)
        path.pop()

    for node in sorted(edges):
        visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _subpackage(module: str, parent: str) -> str | None:
    """The subpackage of ``parent`` that ``module`` lies in (None: a plain module of it)."""
    rest = module[len(parent) + 1 :].split(".") if module.startswith(parent + ".") else []
    if len(rest) < 2 and not (rest and MODULES.get(module, Path()).name == "__init__.py"):
        return None
    return f"{parent}.{rest[0]}"


def test_no_two_subpackages_import_each_other():
    """Sibling subpackages (``collectives.cost`` and ``collectives.algorithms``) depend one
    way: what both need lives beside them (``collectives.tally``)."""
    parents = {n for n, p in MODULES.items() if p.name == "__init__.py"}
    both = []
    for parent in sorted(parents):
        arrows = set()
        for name, found in _graph().items():
            mine = _subpackage(name, parent)
            for target, _ in found:
                theirs = _subpackage(target, parent)
                if mine and theirs and mine != theirs:
                    arrows.add((mine, theirs))
        both += sorted(f"{a} <-> {b}" for a, b in arrows if (b, a) in arrows and a < b)
    assert both == [], "\n".join(both)


# The layers, lowest first: a module imports only from its own layer or those below.
LAYERS = [
    ("base", ["hpcpar", "hpcpar.errors", "hpcpar._version", "hpcpar.layout"]),
    ("runtime", ["hpcpar.runtime"]),
    ("topology", ["hpcpar.topology"]),
    ("datatypes", ["hpcpar.datatypes"]),
    ("collectives", ["hpcpar.collectives"]),
    (
        "p2p, halo, checkpoint",
        [
            "hpcpar.p2p",
            "hpcpar.halo",
            "hpcpar.checkpoint",
            "hpcpar.gradients",
            "hpcpar.feedback",
            "hpcpar.powersgd",
        ],
    ),
    (
        "cli, bench, launcher",
        [
            "hpcpar.cli",
            "hpcpar.bench",
            "hpcpar.launcher",
            "hpcpar.restarts",
            "hpcpar.intercept",
            "hpcpar.horovod",
            "hpcpar.run",
            "hpcpar.vcluster",
            "hpcpar.plugins",
            "hpcpar.testing",
            "hpcpar.__main__",
        ],
    ),
    ("apps", ["hpcpar.apps"]),
]


def _layer(module: str) -> int | None:
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or (prefix != "hpcpar" and module.startswith(prefix + ".")):
                best = i
    return best


def test_every_module_is_in_a_layer():
    assert [n for n in MODULES if _layer(n) is None] == []


def test_imports_only_run_down_the_layers():
    """runtime < topology < datatypes < collectives < p2p/halo/checkpoint < cli/bench < apps
    (the package's ``__init__`` re-exports the public API from every layer)."""
    upward = []
    for name, found in _graph().items():
        if name == "hpcpar":
            continue
        for target, _ in found:
            if target.startswith("hpcpar") and target != "hpcpar":
                mine, theirs = _layer(name), _layer(target)
                if theirs is not None and mine is not None and theirs > mine:
                    upward.append(
                        f"{name} ({LAYERS[mine][0]}) imports {target} ({LAYERS[theirs][0]})"
                    )
    assert upward == [], "\n".join(upward)


def test_the_formatter_is_the_house_style():
    """Nothing opts out of ``ruff format`` (which CI checks): no fmt directives."""
    directive = "# fmt: " + "skip"
    found = [
        str(p.relative_to(ROOT))
        for folder in ("hpcpar", "apps", "checkpoint", "tests", "jobs")
        for p in (ROOT / folder).rglob("*.py")
        if directive in p.read_text() or "# fmt: " + "off" in p.read_text()
    ]
    assert found == [], found


def test_no_module_imports_another_modules_private_names():
    borrowed = [
        f"{n} imports {item} from {t}"
        for n, found in _graph().items()
        for t, item in found
        if item and item.startswith("_") and not item.startswith("__") and t in MODULES
    ]
    assert not borrowed, "\n".join(borrowed)


def test_the_core_never_imports_an_app():
    core = [n for n in _graph() if not n.startswith("hpcpar.apps")]
    uses = [f"{n} imports {t}" for n in core for t, _ in _graph()[n] if t.startswith("hpcpar.apps")]
    assert not uses, "\n".join(uses)


def test_every_module_says_what_it_is_for_and_declares_all():
    missing = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        doc = ast.get_docstring(tree)
        if not doc or not doc.splitlines()[0].strip():
            missing.append(f"{name}: no one-line docstring")
        names = {
            t.id
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Name)
        }
        if "__all__" not in names and not name.endswith("__main__"):
            missing.append(f"{name}: no __all__")
    assert not missing, "\n".join(missing)


def test_the_public_names_resolve():
    for name in hpcpar.__all__:
        assert getattr(hpcpar, name) is not None, name
    import hpcpar.collectives as collectives

    for name in collectives.__all__:
        assert getattr(collectives, name) is not None, name


def test_every_package_folder_is_installed():
    """setup.cfg lists every folder with an ``__init__.py`` (a new subpackage left out
    would be missing from a regular install, where only the editable one finds it)."""
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    listed = set(config["options"]["packages"].split())
    where = {"hpcpar": "hpcpar", "checkpoint": "hpcpar.checkpoint", "apps": "hpcpar.apps"}
    found = set()
    for folder, name in where.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *parts)))
    assert found == listed, (sorted(found - listed), sorted(listed - found))
