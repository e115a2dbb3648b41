"""Average the weights of two exported model folders of one architecture (a "model soup").

Two fine-tunes of the same starting weights often sit in one basin, so their average keeps what
each learned: shapes-flux v2's shipped weights are run 6 and run 7 averaged half and half (the
card, assets/shapes-flux-v2/README.md). Every safetensors file but the VAE's is averaged (the VAE
must be the same file in both); the rest of the folder (configs, tokenizers, stepstudio.json) is
the second folder's.

    python -m tools.average_models RUN6_FOLDER RUN7_FOLDER --weight 0.5 --out assets/shapes-flux-v2
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

KEPT_AS_IS = ("vae",)  # components both runs share unchanged


def average_state(first: dict, second: dict, weight: float) -> dict:
    """(1 - weight) x first + weight x second, in float32, stored in the second's dtypes."""
    if first.keys() != second.keys():
        raise ValueError(f"the two folders hold different tensors: {sorted(first.keys() ^ second.keys())[:5]}")
    mixed = {}
    for name, tensor in second.items():
        if first[name].shape != tensor.shape:
            raise ValueError(f"{name}: shapes {tuple(first[name].shape)} and {tuple(tensor.shape)} differ")
        if tensor.is_floating_point():
            mixed[name] = (first[name].float() * (1.0 - weight) + tensor.float() * weight).to(tensor.dtype)
        else:
            mixed[name] = tensor
    return mixed


def average_models(first: Path, second: Path, weight: float, out: Path) -> list[Path]:
    """Write `out`: `second`'s folder with every averaged weights file; returns the files averaged."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"--weight must lie in [0, 1], got {weight}")
    if out.resolve() in (first.resolve(), second.resolve()):
        raise ValueError("--out must be a new folder, not one of the two averaged")
    for shared in KEPT_AS_IS:
        for path in (second / shared).glob("*.safetensors"):
            if path.read_bytes() != (first / shared / path.name).read_bytes():
                raise ValueError(f"{shared} differs between the two folders: only fine-tunes sharing it average")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(second, staging, ignore=shutil.ignore_patterns("*.safetensors"))
    averaged = []
    for path in sorted(second.rglob("*.safetensors")):
        relative = path.relative_to(second)
        target = staging / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if relative.parts[0] in KEPT_AS_IS:
            shutil.copy2(path, target)
            continue
        save_file(average_state(load_file(first / relative), load_file(path), weight), target, metadata={"format": "pt"})
        averaged.append(relative)
    # Files the destination holds and the sources do not (a model card, a contact sheet) stay.
    if out.exists():
        for extra in out.iterdir():
            if not (staging / extra.name).exists():
                shutil.move(str(extra), staging / extra.name)
        shutil.rmtree(out)
    staging.rename(out)
    return averaged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--weight", type=float, default=0.5, help="the second folder's share")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    for relative in average_models(args.first, args.second, args.weight, args.out):
        print(f"averaged {relative}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
