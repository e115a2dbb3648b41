"""tools/average_models.py: two model folders' weights averaged, the VAE kept, a card in the
destination kept, mismatched folders refused."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tools.average_models import average_models


def model_folder(root: Path, name: str, value: float, vae_value: float = 7.0) -> Path:
    folder = root / name
    (folder / "transformer").mkdir(parents=True)
    (folder / "vae").mkdir()
    save_file({"weight": torch.full((2, 3), value, dtype=torch.float16), "steps": torch.tensor([int(value)])},
              folder / "transformer" / "diffusion_pytorch_model.safetensors")
    save_file({"weight": torch.full((4,), vae_value)}, folder / "vae" / "diffusion_pytorch_model.safetensors")
    (folder / "model_index.json").write_text(f'{{"from": "{name}"}}')
    return folder


def test_the_weights_are_averaged_and_the_rest_is_the_second_folders(tmp_path):
    first, second = model_folder(tmp_path, "first", 1.0), model_folder(tmp_path, "second", 4.0)
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("the card")
    averaged = average_models(first, second, 0.25, out)

    assert averaged == [Path("transformer/diffusion_pytorch_model.safetensors")]
    transformer = load_file(out / "transformer" / "diffusion_pytorch_model.safetensors")
    assert transformer["weight"].dtype == torch.float16
    assert torch.equal(transformer["weight"], torch.full((2, 3), 1.75, dtype=torch.float16))  # 0.75 x 1 + 0.25 x 4
    assert transformer["steps"].tolist() == [4]  # integers are the second's
    assert torch.equal(load_file(out / "vae" / "diffusion_pytorch_model.safetensors")["weight"], torch.full((4,), 7.0))
    assert (out / "model_index.json").read_text() == '{"from": "second"}'
    assert (out / "README.md").read_text() == "the card"
    assert not (tmp_path / "out.partial").exists()


def test_folders_that_do_not_match_are_refused(tmp_path):
    first, second = model_folder(tmp_path, "first", 1.0), model_folder(tmp_path, "second", 2.0, vae_value=8.0)
    with pytest.raises(ValueError, match="vae differs"):
        average_models(first, second, 0.5, tmp_path / "out")
    third = model_folder(tmp_path, "third", 3.0)
    save_file({"weight": torch.ones(3, 2, dtype=torch.float16), "steps": torch.tensor([3])},
              third / "transformer" / "diffusion_pytorch_model.safetensors")
    with pytest.raises(ValueError, match="shapes"):
        average_models(first, third, 0.5, tmp_path / "out")
    with pytest.raises(ValueError, match="new folder"):
        average_models(first, third, 0.5, first)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        average_models(first, third, 1.5, tmp_path / "out")
