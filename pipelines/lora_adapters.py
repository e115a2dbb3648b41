"""Reading a LoRA adapter file for a loaded model, and checking it fits.

A file is read through the model's own diffusers loader (`<Pipeline>.lora_state_dict`), so
every format diffusers converts is understood the way diffusers understands it: diffusers/PEFT
safetensors (with their `lora_adapter_metadata`), kohya/A1111 (`lora_down`/`lora_up`/`alpha`),
XLabs for FLUX. Only safetensors are read (no pickles).

What comes out is a `LoraAdapter`: for every module the adapter changes (in the denoiser, and
in the text encoders the family's diffusers loader also adapts: CLIP for SD, SDXL, SD3 and
FLUX), its down (A) and up (B) weights, with the adapter's own scaling (alpha / r, PEFT's rule)
folded into B, on that module's device and dtype. How rows of a forward use it:
pipelines/lora_rows.py.

Adapters are checked against the model they are loaded for: a module the model lacks, a
shape that does not match it, a component that takes no adapters here (T5, say) or a LoRA
variant this project does not run (DoRA, LoRA biases) is a `LoraFileError` naming the first
offender.
"""

from __future__ import annotations

import collections
import inspect
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers.utils import convert_state_dict_to_diffusers, convert_state_dict_to_peft, convert_unet_state_dict_to_peft
from torch import nn


class LoraFileError(ValueError):
    """An adapter file that can't be served with this model; the message names the first reason."""


@dataclass(frozen=True)
class LoraWeights:
    """One module's low-rank pair: delta(x) = up(down(x)), the adapter's scaling inside `up`."""

    down: torch.Tensor  # Linear: (rank, in); Conv2d: (rank, in, kh, kw)
    up: torch.Tensor  # Linear: (out, rank); Conv2d: (out, rank, 1, 1)


@dataclass(frozen=True)
class LoraAdapter:
    """A loaded adapter: its name, its file and its weights by the module they change
    ("transformer.single_transformer_blocks.0.attn.to_q", "unet.down_blocks.1...",
    "text_encoder.encoder.layers.0.self_attn.q_proj")."""

    name: str
    path: Path
    modules: dict[str, LoraWeights]

    @property
    def rank(self) -> int:
        return max(weights.down.shape[0] for weights in self.modules.values())

    @property
    def changes_text_encoder(self) -> bool:
        """Whether prompts encode differently with this adapter (their cache entries then differ)."""
        return any(is_text_encoder(module_name.partition(".")[0]) for module_name in self.modules)

    @property
    def parameter_count(self) -> int:
        return sum(w.down.numel() + w.up.numel() for w in self.modules.values())


def is_text_encoder(component: str) -> bool:
    return component.startswith("text_encoder")


def read_adapter(name: str, path: str | Path, pipe: Any, components: dict[str, nn.Module],
                 device: torch.device | None = None, dtype: torch.dtype | None = None) -> LoraAdapter:
    """The adapter in `path` for the diffusers pipeline `pipe`; `components`: the models an
    adapter may change, by their pipeline component name ("transformer", "unet", "transformer_2",
    "text_encoder", "text_encoder_2"). Its weights are kept on `device` in `dtype` (default: each
    layer's own): on the device the forwards run on, wherever a memory plan keeps the model's. Raises LoraFileError."""
    path = Path(path)
    if not path.is_file():
        raise LoraFileError(f"LoRA {name!r}: {path} is not a file.")
    if path.suffix != ".safetensors":
        raise LoraFileError(f"LoRA {name!r}: {path.name} is not a .safetensors file (only safetensors are read).")
    state_dict, alphas, metadata = _diffusers_state_dict(pipe, path, name)
    pairs = _pairs_by_module(state_dict, name, tuple(components))
    modules = {}
    for file_module_name, (down, up) in pairs.items():
        component, _, file_inner = file_module_name.partition(".")
        inner = _inner_name(components[component], component, file_inner)
        module_name = f"{component}.{inner}"
        module = _module_of(components[component], inner, module_name, name)
        _check_shapes(module, down, up, module_name, name)
        scale = _scaling(module_name, component, file_inner, down.shape[0], alphas, metadata)
        weight = module.weight
        modules[module_name] = LoraWeights(
            down=down.to(device or weight.device, dtype or weight.dtype),
            up=(up.float() * scale).to(device or weight.device, dtype or weight.dtype),
        )
    if not modules:
        raise LoraFileError(f"LoRA {name!r}: {path.name} holds no LoRA weights.")
    return LoraAdapter(name, path, modules)


def _diffusers_state_dict(pipe: Any, path: Path, name: str) -> tuple[dict, dict | None, dict | None]:
    """(state dict with `component.module.lora_A/B.weight` keys, network alphas, metadata), as the
    family's diffusers loader converts the file."""
    loader = type(pipe).lora_state_dict
    kwargs: dict[str, Any] = {"return_lora_metadata": True, "use_safetensors": True, "local_files_only": True}
    if "return_alphas" in inspect.signature(loader).parameters:
        kwargs["return_alphas"] = True
    try:
        result = loader(str(path), **kwargs)
    except Exception as exc:  # noqa: BLE001 - whatever diffusers refuses, the user gets its reason
        raise LoraFileError(f"LoRA {name!r}: diffusers can't read {path.name}: {type(exc).__name__}: {exc}") from None
    state_dict, *rest = result
    metadata = rest[-1] if rest else None
    alphas = rest[0] if len(rest) == 2 else None
    return state_dict, alphas or None, metadata or None


_PAIR_KEY = re.compile(r"(?P<module>.+)\.(?P<half>lora_[AB])\.weight")


def _pairs_by_module(state_dict: dict, name: str, components: tuple[str, ...]) -> dict[str, tuple]:
    """{"component.module": (down, up)}; the older diffusers key names (`processor.to_k_lora.down`)
    renamed first by diffusers' own converter, as its `load_lora_adapter` does."""
    by_component: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state_dict.items():
        component, _, inner = key.partition(".")
        if component not in components:
            raise LoraFileError(f"LoRA {name!r} changes {component!r} ({key}): adapters of this model may "
                                f"change {', '.join(components)} only.")
        by_component.setdefault(component, {})[inner] = tensor
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for component, tensors in by_component.items():
        if is_text_encoder(component):  # as diffusers' _load_lora_into_text_encoder converts them
            tensors = convert_state_dict_to_peft(convert_state_dict_to_diffusers(tensors))
        elif "lora_A" not in next(iter(tensors)):
            tensors = convert_unet_state_dict_to_peft(tensors)
        for key, tensor in tensors.items():
            if "lora_magnitude_vector" in key or "dora_scale" in key:
                raise LoraFileError(f"LoRA {name!r} is a DoRA adapter ({key}): only plain LoRA is served.")
            match = _PAIR_KEY.fullmatch(key)
            if match is None:
                raise LoraFileError(f"LoRA {name!r}: {component}.{key} is not a LoRA weight this project runs "
                                    "(expected MODULE.lora_A.weight / MODULE.lora_B.weight; LoRA biases are not "
                                    "served).")
            halves.setdefault(f"{component}.{match.group('module')}", {})[match.group("half")] = tensor
    pairs = {}
    for module_name, pair in halves.items():
        if set(pair) != {"lora_A", "lora_B"}:
            missing = ({"lora_A", "lora_B"} - set(pair)).pop()
            raise LoraFileError(f"LoRA {name!r}: {module_name} has no {missing} weight.")
        pairs[module_name] = (pair["lora_A"], pair["lora_B"])
    return pairs


def _inner_name(model: nn.Module, component: str, inner: str) -> str:
    """The module's name in `model`: CLIPTextModel lost its `text_model.` level in transformers 5,
    and older adapter files still name it (diffusers drops it the same way)."""
    if is_text_encoder(component) and inner.startswith("text_model.") and not hasattr(model, "text_model"):
        return inner.removeprefix("text_model.")
    return inner


def _module_of(model: nn.Module, inner: str, module_name: str, name: str) -> nn.Module:
    try:
        module = model.get_submodule(inner)
    except AttributeError:
        raise LoraFileError(f"LoRA {name!r} changes {module_name}, which this model does not have: "
                            "was it trained for another model?") from None
    if not isinstance(module, (nn.Linear, nn.Conv2d)):
        raise LoraFileError(f"LoRA {name!r} changes {module_name}, a {type(module).__name__}: only Linear and "
                            "Conv2d layers take adapters here.")
    if isinstance(module, nn.Conv2d) and (module.groups != 1 or module.padding_mode != "zeros"):
        raise LoraFileError(f"LoRA {name!r} changes {module_name}, a grouped or non-zero-padded Conv2d: "
                            "only plain convolutions take adapters here.")
    return module


def _check_shapes(module: nn.Module, down: torch.Tensor, up: torch.Tensor, module_name: str, name: str) -> None:
    if isinstance(module, nn.Linear):
        expected_down, expected_up = (down.shape[0], module.in_features), (module.out_features, down.shape[0])
    else:
        expected_down = (down.shape[0], module.in_channels, *module.kernel_size)
        expected_up = (module.out_channels, down.shape[0], 1, 1)
    if tuple(down.shape) != expected_down or tuple(up.shape) != expected_up:
        raise LoraFileError(
            f"LoRA {name!r} does not fit {module_name} ({module}): its down weight is {tuple(down.shape)} and its "
            f"up weight {tuple(up.shape)}; this model needs {expected_down} and {expected_up}. "
            "Was it trained for another model?"
        )


def _scaling(module_name: str, component: str, inner: str, rank: int, alphas: dict | None,
             metadata: dict | None) -> float:
    """PEFT's scaling of one module, lora_alpha / r (/ sqrt(r) with rsLoRA), from the file's
    metadata, else its network alphas; neither: alpha = rank, scaling 1 (diffusers' rule)."""
    if metadata:
        config = {key.split(".", 1)[1]: value for key, value in metadata.items() if key.startswith(component + ".")}
        config = config or metadata
        alpha = _pattern_value(config.get("alpha_pattern") or {}, inner, config.get("lora_alpha", rank))
        rank = _pattern_value(config.get("rank_pattern") or {}, inner, config.get("r", rank))
        return float(alpha) / (math.sqrt(rank) if config.get("use_rslora") else rank)
    if alphas:
        alpha = _alpha_from_network_alphas(alphas, component, inner)
        if alpha is not None:
            return alpha / rank
    return 1.0


def _alpha_from_network_alphas(alphas: dict, component: str, inner: str) -> float | None:
    """diffusers' `get_peft_kwargs`: the most common alpha of the component is its lora_alpha,
    the others an alpha_pattern keyed by the module the alpha key names."""
    mine = {key.removeprefix(component + "."): float(value) for key, value in alphas.items()
            if key.startswith(component + ".")}
    if not mine:
        return None
    common = collections.Counter(mine.values()).most_common()[0][0]
    patterns = {key.split(".lora_A.")[0].replace(".alpha", ""): value for key, value in mine.items() if value != common}
    return float(_pattern_value(patterns, inner, common))


def _pattern_value(patterns: dict, inner: str, default: Any) -> Any:
    """PEFT's rank/alpha pattern lookup: a key matches a module name it ends (at a dot)."""
    for pattern, value in patterns.items():
        anchored = pattern.startswith("^")
        if (re.match(pattern, inner) if anchored else re.fullmatch(rf"(.*\.)?({pattern})", inner)):
            return value
    return default
