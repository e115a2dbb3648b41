"""A denoiser from one quantized file (`--denoiser-file`): the GGUF files people download for
FLUX and Wan (city96's, and any written with the `gguf` package), in place of the model folder's
own transformer or UNet.

Loaded by diffusers itself: `<DenoiserClass>.from_single_file(file, config=<the model folder>,
quantization_config=GGUFQuantizationConfig(compute_dtype=<serving dtype>))`. Its layers keep the
quantized blocks and dequantize them for each forward; the rest of the model (text encoders,
VAE, scheduler) comes from the folder. Files in the original checkpoint's key names are converted
by diffusers; files already in diffusers' names load as they are. Needs the `gguf` package
(`pip install -e '.[gguf]'`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

SUPPORTED_KINDS = {".gguf": "GGUF"}


def supported_quant_types() -> list[str]:
    from diffusers.quantizers.gguf.utils import SUPPORTED_GGUF_QUANT_TYPES, UNQUANTIZED_TYPES

    return sorted({kind.name for kind in (*SUPPORTED_GGUF_QUANT_TYPES, *UNQUANTIZED_TYPES)})


def denoiser_component(index: dict) -> str:
    """The model folder's denoiser: "transformer" (DiT families) or "unet"."""
    for name in ("transformer", "unet"):
        if isinstance(index.get(name), list) and index[name][1] is not None:
            return name
    raise ValueError("this model folder has no transformer or unet to replace with --denoiser-file.")


def check_denoiser_file(path: Path) -> None:
    """ValueError, naming what is supported, for a file that is missing or of a kind not served."""
    kinds = ", ".join(f"{suffix} ({name})" for suffix, name in SUPPORTED_KINDS.items())
    if path.suffix.lower() not in SUPPORTED_KINDS:
        raise ValueError(f"--denoiser-file {path.name}: {path.suffix or 'this'} files are not supported; the kinds "
                         f"that are: {kinds}.")
    if not path.is_file():
        raise ValueError(f"--denoiser-file {path}: no such file.")
    if importlib.util.find_spec("gguf") is None:
        raise ValueError("--denoiser-file with a .gguf file needs the gguf package: pip install -e '.[gguf]'")
    from gguf import GGUFReader

    try:
        types = {tensor.tensor_type.name for tensor in GGUFReader(str(path)).tensors}
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file, whatever the reader says
        raise ValueError(f"--denoiser-file {path.name} is not a readable GGUF file ({type(exc).__name__}: {exc}).") from exc
    unsupported = sorted(types - set(supported_quant_types()))
    if unsupported:
        raise ValueError(f"--denoiser-file {path.name} holds {', '.join(unsupported)} tensors, which diffusers can't "
                         f"dequantize; the quantization types it can: {', '.join(supported_quant_types())}.")


def load_denoiser_file(path: str | Path, model_folder: Path, index: dict, dtype: torch.dtype) -> tuple[str, torch.nn.Module]:
    """(component name, the denoiser loaded from `path`) for the folder's pipeline."""
    import diffusers
    from diffusers import GGUFQuantizationConfig

    path = Path(path).expanduser()
    check_denoiser_file(path)
    component = denoiser_component(index)
    model_class = getattr(diffusers, index[component][1])
    try:
        model = model_class.from_single_file(str(path), config=str(model_folder), subfolder=component,
                                             quantization_config=GGUFQuantizationConfig(compute_dtype=dtype),
                                             dtype=dtype)
    except Exception as exc:  # noqa: BLE001 - a file for another model, or shapes that don't match
        raise ValueError(f"could not load {path.name} as the {component} ({model_class.__name__}) of {model_folder.name} "
                         f"({type(exc).__name__}: {exc}). The file must be this model's {component}.") from exc
    return component, model
