"""Which LoRA adapter files a server loads, and for which model.

Two sources, read once at start:

- `--lora NAME=PATH` (repeatable) loads PATH as NAME for the first model; `--lora MODEL:NAME=PATH`
  for the loaded model named MODEL.
- Adapter folders, each holding one subfolder per model name: `<folder>/<model>/<name>.safetensors`
  is adapter <name> of that model. The built-in adapters (assets/loras/) and `./loras` are read by
  default (`--loras DIR` names another folder instead of `./loras`).

A name given twice for one model is an error, never a silent choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipelines.lora_request import LORA_NAME_PATTERN, MAX_LORA_NAME_CHARS

BUILTIN_LORA_DIR = Path(__file__).resolve().parent.parent / "assets" / "loras"
DEFAULT_LORA_DIR = "loras"


@dataclass(frozen=True)
class LoraOption:
    """One `--lora [MODEL:]NAME=PATH`."""

    name: str
    path: str
    model: str | None = None  # None: the first model

    @classmethod
    def parse(cls, text: str) -> "LoraOption":
        left, equals, path = text.partition("=")
        model, colon, name = left.rpartition(":")
        if not equals or not path or not name or (colon and not model):
            raise ValueError(f"--lora {text!r}: write NAME=PATH (for the first model) or MODEL:NAME=PATH.")
        _check_name(name, f"--lora {text!r}")
        return cls(name=name, path=path, model=model or None)


def _check_name(name: str, where: str) -> None:
    if len(name) > MAX_LORA_NAME_CHARS or not LORA_NAME_PATTERN.fullmatch(name):
        raise ValueError(f"{where}: {name!r} is not a LoRA name: use 1..{MAX_LORA_NAME_CHARS} letters, digits, "
                         "'_', '-' or '.', starting with a letter or digit.")


def adapter_files(model: str, first: bool, options: tuple[LoraOption, ...], folders: tuple[str | Path, ...]
                  ) -> dict[str, Path]:
    """{name: file} of the adapters for the loaded model named `model` (`first`: it is the first
    model, which `--lora NAME=PATH` means). Raises ValueError for a name given twice."""
    found: dict[str, Path] = {}

    def add(name: str, path: Path) -> None:
        if name in found:
            raise ValueError(f"LoRA {name!r} of {model} is given twice ({found[name]} and {path}): rename one.")
        found[name] = path

    for folder in folders:
        for path in sorted((Path(folder).expanduser() / model).glob("*.safetensors")):
            _check_name(path.stem, f"adapter file {path}")
            add(path.stem, path)
    for option in options:
        if option.model == model or (option.model is None and first):
            add(option.name, Path(option.path).expanduser())
    return found


def check_lora_models(options: tuple[LoraOption, ...], loaded: list[str]) -> None:
    """Every `--lora MODEL:...` names a loaded model."""
    for option in options:
        if option.model is not None and option.model not in loaded:
            raise ValueError(f"--lora {option.model}:{option.name}=...: no model named {option.model!r} is loaded; "
                             f"the loaded models are: {', '.join(loaded)}.")
