"""Dependencies point one way: studio -> engine -> pipelines. The studio never needs torch,
the engine never imports gradio or the studio, the model adapters never import either.

Each check imports every module of a package in a fresh interpreter and looks at what got
loaded (with torch made unimportable where it must not be needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
