"""What a request says about LoRA adapters: which loaded adapters it runs with, at what scales.

A request names zero or more adapters (`GenerationParams.loras`, a tuple of `LoraUse`). The
adapters themselves are loaded once per model at start (pipelines/lora_adapters.py) and applied
per row of a shared forward (pipelines/lora_rows.py), so the adapter set is never part of a
batch key.

A1111's prompt syntax is understood too: `<lora:NAME:SCALE>` (or `<lora:NAME>` for scale 1)
anywhere in a prompt names the adapter and is removed from the text the model reads
(`split_prompt_tags`); saved results write the adapters back as such tags (`prompt_tags`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from pipelines.errors import ParamError

MAX_LORAS_PER_REQUEST = 4
# Scales outside this range only break images; A1111 users go to about +-2.
MIN_LORA_SCALE, MAX_LORA_SCALE = -4.0, 4.0
MAX_LORA_NAME_CHARS = 64
LORA_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

# <lora:name> or <lora:name:scale>; the scale is any number text, checked afterwards.
_PROMPT_TAG = re.compile(r"<lora:([^:<>]*)(?::([^:<>]*))?>", re.IGNORECASE)


@dataclass(frozen=True)
class LoraUse:
    """One adapter a request runs with: a loaded adapter's name and its scale (1 = as trained)."""

    name: str
    scale: float = 1.0

    def __post_init__(self) -> None:
        check_lora_name(self.name)
        scale = self.scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise ParamError("loras", f"the scale of LoRA {self.name!r} must be a number, got {scale!r:.60}.")
        if not math.isfinite(scale) or not MIN_LORA_SCALE <= scale <= MAX_LORA_SCALE:
            raise ParamError("loras", f"LoRA {self.name!r} has scale {scale}: allowed is "
                                      f"{MIN_LORA_SCALE:g}..{MAX_LORA_SCALE:g} (1 = as trained, 0 = off).")

    @classmethod
    def of(cls, value: object) -> "LoraUse":
        """From what an API caller sends: {"name": ..., "scale": ...} (scale optional) or a LoraUse."""
        if isinstance(value, LoraUse):
            return value
        if not isinstance(value, dict) or set(value) - {"name", "scale"} or "name" not in value:
            raise ParamError("loras", 'each LoRA must be {"name": NAME, "scale": NUMBER} (scale optional, '
                                      f"default 1), got {value!r:.80}.")
        return cls(value["name"], value.get("scale", 1.0))

    def to_json(self) -> dict:
        return {"name": self.name, "scale": self.scale}


def check_lora_name(name: object) -> None:
    if not isinstance(name, str) or not name or len(name) > MAX_LORA_NAME_CHARS or not LORA_NAME_PATTERN.fullmatch(name):
        raise ParamError("loras", f"{name!r:.80} is not a LoRA name: use 1..{MAX_LORA_NAME_CHARS} letters, digits, "
                                  "'_', '-' or '.', starting with a letter or digit.")


def check_loras(loras: object) -> None:
    """The model-independent rule for GenerationParams.loras: a tuple of LoraUse, each name once,
    at most MAX_LORAS_PER_REQUEST."""
    if not isinstance(loras, tuple) or not all(isinstance(use, LoraUse) for use in loras):
        raise ParamError("loras", f"loras must be a tuple of LoraUse, got {type(loras).__name__}.")
    if len(loras) > MAX_LORAS_PER_REQUEST:
        names = ", ".join(use.name for use in loras)
        raise ParamError("loras", f"{len(loras)} LoRAs ({names}) are too many: a request runs with at most "
                                  f"{MAX_LORAS_PER_REQUEST}.")
    names = [use.name for use in loras]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ParamError("loras", f"LoRA {', '.join(twice)} is named more than once: name each adapter once, "
                                  "with the scale you want.")


def loras_from_json(value: object) -> tuple[LoraUse, ...]:
    """An API's `loras` field (a list of {"name", "scale"}; None or [] for none) as LoraUse."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise ParamError("loras", f'loras must be a list of {{"name", "scale"}} objects, got {value!r:.80}.')
    return tuple(LoraUse.of(item) for item in value)


def split_prompt_tags(prompt: str) -> tuple[str, tuple[LoraUse, ...]]:
    """A1111's `<lora:NAME:SCALE>` tags out of a prompt: (the text without them, the adapters)."""
    uses = []
    for match in _PROMPT_TAG.finditer(prompt):
        name, scale_text = match.group(1).strip(), match.group(2)
        scale = 1.0
        if scale_text is not None:
            try:
                scale = float(scale_text)
            except ValueError:
                raise ParamError("loras", f"{match.group(0)!r:.80} in the prompt: the scale must be a number, "
                                          "e.g. <lora:NAME:0.8>.") from None
        uses.append(LoraUse(name, scale))
    if not uses:
        return prompt, ()
    text = re.sub(r"\s{2,}", " ", _PROMPT_TAG.sub(" ", prompt)).strip()
    text = re.sub(r"\s+([,.;])", r"\1", text).strip(" ,")
    return text, tuple(uses)


def prompt_tags(loras: tuple[LoraUse, ...]) -> str:
    """The adapters as A1111 writes them in a prompt: `<lora:outline:1> <lora:thick:0.5>`."""
    return " ".join(f"<lora:{use.name}:{use.scale:g}>" for use in loras)


def check_loaded_loras(loras: tuple[LoraUse, ...], model: str, loaded: tuple[str, ...]) -> None:
    """Every named adapter is one loaded for this model (PipelineInfo.loras)."""
    unknown = [use.name for use in loras if use.name not in loaded]
    if unknown:
        offered = f"the loaded ones are: {', '.join(loaded)}" if loaded else "none is loaded for it"
        raise ParamError("loras", f"LoRA {', '.join(map(repr, unknown))} is not loaded for {model}; {offered} "
                                  "(python app.py --lora NAME=PATH loads one).")
