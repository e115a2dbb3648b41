"""The studio's parts use each other through public names only, and every arrow between them points
one way: no module takes another's private (`_x`) names, no circle of imports (not even one
hidden in a function), and the API routes (studio/api) never need the page (studio/page).

Read from the source with `ast`, so a lazy import inside a function counts like any other; the
API/page check also imports every studio/api module in a fresh interpreter and looks at what got
loaded, so an indirect import of the page counts too."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from tests.source_trees import parse_source

ROOT = Path(__file__).resolve().parent.parent
STUDIO = ROOT / "studio"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(STUDIO.rglob("*.py"))}


def _trees() -> dict[str, ast.Module]:
    return {name: parse_source(path.read_text(), filename=str(path)) for name, path in MODULES.items()}


def _studio_module(dotted: str) -> str | None:
    """The studio module a dotted import name refers to (`studio.api.errors.ApiError` ->
    `studio.api.errors`); None for names outside the studio."""
    while dotted:
        if dotted in MODULES:
            return dotted
        dotted = dotted.rpartition(".")[0]
    return None


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The studio modules one import statement loads."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif node.module is None or node.level:
        raise AssertionError(f"relative import at line {node.lineno}: the studio uses absolute imports")
    else:
        names = [f"{node.module}.{alias.name}" for alias in node.names]
    return [module for module in map(_studio_module, names) if module not in (None, "studio")]


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_studio_module_imports_a_private_name_of_another_module():
    found = []
    for name, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                found += [f"{name}: from {node.module} import {alias.name}"
                          for alias in node.names if _is_private(alias.name)]
    assert found == []


def test_no_studio_module_reaches_into_another_studio_modules_private_names():
    """`from studio.api import errors as http_errors` then `http_errors._x` is the same as
    importing `_x`."""
    found = []
    for name, tree in _trees().items():
        module_aliases = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("studio"):
                module_aliases |= {alias.asname or alias.name for alias in node.names
                                   if f"{node.module}.{alias.name}" in MODULES}
            elif isinstance(node, ast.Import):
                module_aliases |= {alias.asname or alias.name for alias in node.names if alias.name in MODULES}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in module_aliases and _is_private(node.attr)):
                found.append(f"{name}:{node.lineno}: {node.value.id}.{node.attr}")
    assert found == []


def test_no_studio_module_imports_another_inside_a_function():
    """An import inside a function is how a circle gets hidden: every studio import is at the top."""
    found = []
    for name, tree in _trees().items():
        for function in ast.walk(tree):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [f"{name}:{node.lineno} ({function.name})" for node in ast.walk(function)
                          if isinstance(node, (ast.Import, ast.ImportFrom)) and _imported(node)]
    assert found == []


def test_the_studio_modules_import_each_other_without_a_circle():
    imports = {name: set() for name in MODULES}
    for name, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imports[name] |= {module for module in _imported(node) if module != name}
    circles: list[list[str]] = []
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(imports[module]):
            if state.get(target) == "open":
                circles.append(path[path.index(target):] + [module, target])
            elif target not in state:
                visit(target, path + [module])
        state[module] = "done"

    for module in sorted(imports):
        if module not in state:
            visit(module, [])
    assert circles == []
    # The check sees real imports: the tracker is used by the image and video routes, the runs and the endpoints.
    assert {"studio.api.image_results", "studio.api.video_jobs", "studio.api.gradio_endpoints",
            "studio.workflows.run"} <= {name for name, targets in imports.items() if "studio.tracker" in targets}


def _imports_from(package: str, targets: tuple[str, ...]) -> list[str]:
    """"module imports target" for every import (a TYPE_CHECKING one too) by a module of `package`
    of a studio module in (or under) one of `targets`."""
    return [f"{name} imports {target}" for name, tree in _trees().items() if name.startswith(package + ".")
            for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            for target in _imported(node) if any(target == t or target.startswith(t + ".") for t in targets)]


def test_the_layer_check_sees_imports_made_only_for_type_checking():
    assert _imports_from("studio.store", ("studio.store.store",))  # durable.py and recovery.py import it
    assert "studio.store.durable imports studio.outputs" in _imports_from("studio.store", ("studio.outputs",))


def test_the_store_never_needs_the_api_the_page_or_the_app():
    """The durable store sits under every front end: what it needs of one (recovery's video jobs) it
    states itself (a Protocol), even for type checking."""
    assert _imports_from("studio.store", ("studio.api", "studio.page", "studio.app", "studio.server.app")) == []


ABOVE_THE_API = ("studio.api", "studio.page", "studio.app", "studio.server.app")  # the routes, the page, the app


def test_the_api_never_imports_the_composition_root_or_a_package_that_imports_the_api():
    """studio/app.py wires the API and the page together; the API routes use low-level pieces
    (studio.server's guards, throttle and temp files, the store): no module of a
    package the API uses may import the API, the page or the app, so an arrow into studio.server
    never leads back up."""
    assert _imports_from("studio.api", ABOVE_THE_API[1:]) == []
    used = {target.rpartition(".")[0] for name, tree in _trees().items() if name.startswith("studio.api.")
            for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)) for target in _imported(node)}
    packages = sorted(package for package in used if package.startswith("studio.") and package != "studio.api")
    assert {"studio.server", "studio.store"} <= set(packages)  # the check sees them
    assert [found for package in packages for found in _imports_from(package, ABOVE_THE_API)] == []


_PROBE = r"""
import importlib, json, pkgutil, sys
import studio.api
for module in pkgutil.iter_modules(studio.api.__path__):
    importlib.import_module(f"studio.api.{module.name}")
print(json.dumps(sorted(name for name in sys.modules if name.startswith("studio."))))
"""


def test_the_api_routes_never_need_the_page():
    static = [f"{name} imports {target}" for name, tree in _trees().items() if name.startswith("studio.api.")
              for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
              for target in _imported(node) if target.startswith("studio.page")]
    assert static == []
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert "studio.api.http_routes" in loaded and "studio.api.gradio_endpoints" in loaded
    assert [name for name in loaded if name.startswith("studio.page")] == []
