"""Dependencies point one way: studio -> engine -> pipelines. The studio never needs torch,
the engine never imports gradio or the studio, the model adapters never import either.

Each check imports every module of a package in a fresh interpreter and looks at what got
loaded (with torch made unimportable where it must not be needed)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.source_trees import parse_source

ROOT = Path(__file__).resolve().parent.parent

_PROBE = r"""
import importlib, json, pkgutil, sys

class BlockTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"torch is blocked in this check (wanted: {name})")

if BLOCK_TORCH:
    sys.meta_path.insert(0, BlockTorch())
package = importlib.import_module(PACKAGE)
failed = {}
for module in pkgutil.iter_modules(package.__path__):
    try:
        importlib.import_module(f"{PACKAGE}.{module.name}")
    except Exception as error:
        failed[module.name] = f"{type(error).__name__}: {error}"
print(json.dumps({"failed": failed, "loaded": sorted(sys.modules)}))
"""


def _import_all(package: str, block_torch: bool) -> tuple[dict, set[str]]:
    code = f"PACKAGE = {package!r}\nBLOCK_TORCH = {block_torch!r}\n" + _PROBE
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report["failed"], set(report["loaded"])


def _top_level(modules: set[str]) -> set[str]:
    return {name.partition(".")[0] for name in modules}


def test_every_studio_module_loads_without_torch():
    failed, loaded = _import_all("studio", block_torch=True)
    assert failed == {}
    # From the model side the studio sees only plain-data modules (the protocol, parameters,
    # validation rules): with torch blocked, no model family or loader could have loaded.
    assert not {"torch", "diffusers", "transformers"} & _top_level(loaded)
    assert not {"pipelines.loader", "pipelines.toy"} & loaded


def test_the_engine_loads_without_torch_and_never_imports_gradio_or_the_studio():
    failed, loaded = _import_all("engine", block_torch=True)
    assert failed == {}
    assert not {"torch", "gradio", "studio", "fastapi"} & _top_level(loaded)


def test_model_adapters_never_import_the_engine_or_the_studio():
    failed, loaded = _import_all("pipelines", block_torch=False)
    assert failed == {}
    assert not {"engine", "studio", "gradio"} & _top_level(loaded)


# ---------------------------------------------------------------------- serve/ (Ray Serve replicas)
SERVE = ROOT / "serve"
# A named tuple's public API starts with "_" (prometheus samples are named tuples).
_PUBLIC_UNDERSCORE_NAMES = {"_replace", "_asdict", "_fields", "_make"}


def private_names_used(source: str) -> list[str]:
    """Private names a module takes from others: `from x import _y`, and `obj._y` on anything
    but its own `self` / `cls`."""
    used = []
    for node in ast.walk(parse_source(source)):
        if isinstance(node, ast.ImportFrom):
            used += [f"from {node.module} import {alias.name}" for alias in node.names if alias.name.startswith("_")]
        elif isinstance(node, ast.Attribute) and _is_private(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                used.append(f"{ast.unparse(node.value)}.{node.attr}")
    return used


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__") and name not in _PUBLIC_UNDERSCORE_NAMES


def imported_modules(source: str) -> set[str]:
    modules = set()
    for node in ast.walk(parse_source(source)):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.add(node.module)
    return modules


def test_the_private_name_check_sees_imports_and_attributes():
    source = ("from engine.engine import _Submit, Engine\n"
              "key = engine._batch_key(params)\n"
              "self._own = sample._replace(value=1)\n"
              "self._handle.prepare.remote(self._engine._cost)\n")
    assert private_names_used(source) == ["from engine.engine import _Submit", "engine._batch_key", "self._engine._cost"]


def test_serve_uses_only_public_names_of_the_engine_and_everything_else():
    used = {path.name: private_names_used(path.read_text()) for path in sorted(SERVE.glob("*.py"))}
    assert {name: names for name, names in used.items() if names} == {}


def engine_submodules_imported(source: str) -> set[str]:
    """`engine.<module>` names a module imports (`from engine.events import X`, `import engine.models`)."""
    return {module for module in imported_modules(source) if module.startswith("engine.")}


def test_the_engine_submodule_check_sees_both_import_forms():
    source = "from engine import Engine\nfrom engine.events import FINAL_EVENTS\nimport engine.models\n"
    assert engine_submodules_imported(source) == {"engine.events", "engine.models"}


def test_serve_and_the_studio_use_only_the_engine_packages_public_names():
    """`from engine import ...` only: what the engine offers its front ends is what engine/__init__.py
    exports (a lazy import inside a function counts too)."""
    sources = [*SERVE.glob("*.py"), *(ROOT / "studio").rglob("*.py"), ROOT / "app.py"]
    used = {str(path.relative_to(ROOT)): sorted(engine_submodules_imported(path.read_text())) for path in sources}
    assert {name: modules for name, modules in used.items() if modules} == {}


def test_serve_reaches_the_studio_only_for_its_options_and_its_app():
    imported = set().union(*(imported_modules(path.read_text()) for path in SERVE.glob("*.py")))
    assert "gradio" not in _top_level(imported)  # torch, yes: a replica runs a model
    # The app is built inside the ingress replica (serve/application.py), never at import.
    assert {m for m in imported if m.partition(".")[0] == "studio"} == {"studio.config", "studio.app"}


def test_every_serve_module_loads_without_torch_or_gradio():
    """Torch only once a replica starts on its device; gradio only in the ingress's app."""
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install -e '.[serve]')")
    failed, loaded = _import_all("serve", block_torch=True)
    assert failed == {}
    assert not {"torch", "gradio"} & _top_level(loaded)
    assert {m for m in loaded if m.partition(".")[0] == "studio"} == {"studio", "studio.config"}
