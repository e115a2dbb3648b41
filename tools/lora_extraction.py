"""A LoRA adapter cut out of a fine-tune: the layers an adapter would touch are trained whole, then
each one's change (trained weight minus base weight) is kept as its best rank-r approximation
(truncated SVD, Eckart-Young) in a PEFT adapter, and the base weights are put back.

Used by tools/train_lora_v2.py --whole-layers: a full-rank update can learn what a low-rank one
trained from zero does not find, and the cut keeps what of it fits the rank the file declares.

    python -m tools.lora_extraction BIG.safetensors SMALL.safetensors --rank 32   # an adapter cut lower
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from tools.training_loop import log


def matches(name: str, target_modules: list[str] | tuple[str, ...]) -> bool:
    """PEFT's rule for a string target: the module's name is the target or ends with "." + it."""
    return any(name == target or name.endswith("." + target) for target in target_modules)


def target_linears(model: torch.nn.Module, target_modules) -> dict[str, torch.nn.Linear]:
    """{name: layer} of every nn.Linear an adapter with these targets would wrap."""
    return {name: module for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and matches(name, target_modules)}


def train_whole(model: torch.nn.Module, target_modules) -> tuple[list[torch.nn.Parameter], dict[str, torch.Tensor]]:
    """Make only the target layers' weight matrices trainable (biases stay: an adapter has none);
    (the trainable weights, a copy of their base values)."""
    layers = target_linears(model, target_modules)
    if not layers:
        raise ValueError(f"no nn.Linear matches {list(target_modules)}")
    model.requires_grad_(False)
    originals = {}
    for name, layer in layers.items():
        layer.weight.requires_grad_(True)
        originals[name] = layer.weight.detach().clone()
    log(f"whole layers: {sum(layer.weight.numel() for layer in layers.values()):,} weights in {len(layers)} layers")
    return [layer.weight for layer in layers.values()], originals


@torch.no_grad()
def low_rank(change: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [rank, in], B [out, rank]) with B @ A the closest rank-`rank` matrix to `change`; the
    singular values split evenly between the two."""
    u, s, vh = torch.linalg.svd(change.double(), full_matrices=False)
    rank = min(rank, s.numel())
    root = s[:rank].sqrt()
    return (root[:, None] * vh[:rank]).float(), (u[:, :rank] * root[None, :]).float()


@torch.no_grad()
def cut(change: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """`low_rank`'s (A, B), with the change's energy (squared Frobenius norm) and the part B @ A keeps."""
    a, b = low_rank(change, rank)
    return a, b, float(change.double().pow(2).sum()), float((b.double() @ a.double()).pow(2).sum())


@torch.no_grad()
def cut_adapter(model: torch.nn.Module, originals: dict[str, torch.Tensor], rank: int, target_modules) -> dict:
    """Put the base weights back and add a PEFT LoRA adapter (r = lora_alpha = `rank`, scaling 1)
    holding each layer's change at that rank; {"kept": share of the change's energy (squared
    Frobenius norm) the adapter holds, over all layers}."""
    from peft import LoraConfig

    changes = {}
    for name, layer in target_linears(model, target_modules).items():
        changes[name] = layer.weight.detach() - originals[name]
        layer.weight.copy_(originals[name])
        layer.weight.requires_grad_(False)
    model.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=list(target_modules), lora_dropout=0.0,
                                 init_lora_weights=True))
    modules = dict(model.named_modules())
    total = kept = 0.0
    for name, change in changes.items():
        a, b, energy, held = cut(change, rank)
        wrapped = modules[name]
        wrapped.lora_A["default"].weight.zero_()[: a.shape[0]].copy_(a)
        wrapped.lora_B["default"].weight.zero_()[:, : b.shape[1]].copy_(b)
        total, kept = total + energy, kept + held
    summary = {"kept": kept / total if total else 1.0}
    log(f"cut to rank {rank}: the adapter holds {100 * summary['kept']:.1f}% of the change's energy")
    return summary


def recut(source: Path, out: Path, rank: int) -> dict:
    """`source`'s adapter (diffusers/PEFT file, scaling 1) cut to a lower `rank` into `out`, in the
    same format; {"kept": share of the adapter's energy kept}."""
    import json

    from safetensors import safe_open

    from tools.train_lora import write_adapter

    with safe_open(str(source), "pt") as adapter:
        stored = json.loads(adapter.metadata()["lora_adapter_metadata"])  # {"transformer.r": ..., ...}
        metadata = {key.removeprefix("transformer."): value for key, value in stored.items()}
        tensors = {key: adapter.get_tensor(key) for key in adapter.keys()}
    if metadata["lora_alpha"] != metadata["r"]:
        raise ValueError(f"{source}: lora_alpha {metadata['lora_alpha']} != r {metadata['r']}; only scaling 1 is cut")
    layers, total, kept = {}, 0.0, 0.0
    for key in tensors:
        if not key.endswith(".lora_A.weight"):
            continue
        module = key[len("transformer."):-len(".lora_A.weight")]
        change = tensors[f"transformer.{module}.lora_B.weight"].double() @ tensors[key].double()
        a, b, energy, held = cut(change, rank)
        layers[f"{module}.lora_A.weight"] = a.to(tensors[key].dtype).contiguous()
        layers[f"{module}.lora_B.weight"] = b.to(tensors[key].dtype).contiguous()
        total, kept = total + energy, kept + held
    write_adapter(layers, {**metadata, "r": rank, "lora_alpha": rank}, out)
    return {"kept": kept / total if total else 1.0}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Cut a LoRA adapter file (scaling 1) to a lower rank by SVD.")
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--rank", type=int, required=True)
    args = parser.parse_args(argv)
    summary = recut(args.source, args.out, args.rank)
    log(f"{args.out}: rank {args.rank}, {100 * summary['kept']:.1f}% of {args.source}'s energy")


if __name__ == "__main__":
    main()
