"""Write a model folder's denoiser as a quantized GGUF file, for `--denoiser-file`.

    python -m tools.quantize_denoiser --model assets/shapes-flux --type Q8_0 --out shapes-flux-Q8_0.gguf

Tensors are named as diffusers names them (diffusers loads such a file without conversion); the
2-D weights whose rows split into whole quantization blocks are quantized with `--type`, every
other tensor (biases, norms, small or odd-shaped weights) is stored in float32, as the GGUF
files published for FLUX and Wan do with their small tensors. Needs the `gguf` package.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

TYPES = ("Q8_0", "Q5_0", "Q4_0", "BF16", "F16")


def write_gguf(state_dict: dict[str, torch.Tensor], out: Path, quant_type: str = "Q8_0") -> dict[str, int]:
    """`state_dict` as a GGUF file; returns how many tensors were stored per type."""
    import gguf

    kind = gguf.GGMLQuantizationType[quant_type]
    block_size, _ = gguf.GGML_QUANT_SIZES[kind]
    writer = gguf.GGUFWriter(str(out), arch="stepstudio")
    counts: dict[str, int] = {}
    for name, tensor in state_dict.items():
        array = tensor.detach().float().cpu().numpy()
        quantize = array.ndim == 2 and array.shape[-1] % block_size == 0 and array.shape[0] >= 8
        stored = kind if quantize else gguf.GGMLQuantizationType.F32
        data = gguf.quants.quantize(array, stored) if stored != gguf.GGMLQuantizationType.F32 else array.astype(np.float32)
        writer.add_tensor(name, data, raw_dtype=stored)
        counts[stored.name] = counts.get(stored.name, 0) + 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a diffusers model folder")
    parser.add_argument("--type", default="Q8_0", choices=TYPES, help="quantization of the large weights")
    parser.add_argument("--out", required=True, help="the .gguf file to write")
    args = parser.parse_args(argv)
    import diffusers

    folder = Path(args.model)
    index = json.loads((folder / "model_index.json").read_text())
    component = "transformer" if isinstance(index.get("transformer"), list) else "unet"
    model = getattr(diffusers, index[component][1]).from_pretrained(folder / component, use_safetensors=True)
    counts = write_gguf(model.state_dict(), Path(args.out), args.type)
    print(f"{args.out}: {component} of {folder.name}, tensors by type {counts}")


if __name__ == "__main__":
    main()
