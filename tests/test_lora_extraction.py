"""tools/lora_extraction.py: a fine-tune's change to the target layers cut into a PEFT adapter."""

import pytest
import torch

pytest.importorskip("peft", reason="the cut adapter is a PEFT adapter (pip install -e '.[test]')")

from tools.lora_extraction import cut_adapter, low_rank, matches, train_whole  # noqa: E402

TARGETS = ("to_q", "ff.net.2", "proj_mlp")


def tiny_transformer():
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    return FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                  attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                  pooled_projection_dim=32, axes_dims_rope=(4, 6, 6)).eval()


def forward(model) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        return model(hidden_states=torch.randn(1, 16, 4, generator=generator), timestep=torch.tensor([0.5]),
                     pooled_projections=torch.randn(1, 32, generator=generator),
                     encoder_hidden_states=torch.randn(1, 5, 32, generator=generator), txt_ids=torch.zeros(5, 3),
                     img_ids=torch.zeros(16, 3), return_dict=False)[0]


def test_only_the_target_layers_weights_train_and_their_base_values_are_kept():
    model = tiny_transformer()
    weights, originals = train_whole(model, TARGETS)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {name + ".weight" for name in originals}
    assert all(matches(name, TARGETS) for name in originals)
    assert len(weights) == len(originals) == 4  # to_q and ff.net.2 of the double block, to_q and proj_mlp of the single
    assert not matches("transformer_blocks.0.ff_context.net.2", TARGETS)  # PEFT's rule: a whole name part


def test_a_change_of_the_adapters_rank_is_cut_exactly_and_the_base_weights_come_back():
    model = tiny_transformer()
    weights, originals = train_whole(model, TARGETS)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for weight in weights:  # a rank-2 change to every target layer
            out, inner = weight.shape
            weight += 0.3 * torch.randn(out, 2, generator=generator) @ torch.randn(2, inner, generator=generator)
    changed = forward(model)
    summary = cut_adapter(model, originals, 2, TARGETS)
    assert summary["kept"] == pytest.approx(1.0, abs=1e-6)
    torch.testing.assert_close(forward(model), changed, atol=1e-5, rtol=1e-4)
    modules = dict(model.named_modules())
    for name, original in originals.items():
        assert torch.equal(modules[name].base_layer.weight, original)
    model.disable_adapters()
    assert not torch.allclose(forward(model), changed, atol=1e-3)


def test_a_lower_rank_keeps_the_largest_singular_directions():
    change = torch.diag(torch.tensor([3.0, 1.0, 0.0]))
    a, b = low_rank(change, 1)
    torch.testing.assert_close(b @ a, torch.diag(torch.tensor([3.0, 0.0, 0.0])))
    model = tiny_transformer()
    weights, originals = train_whole(model, ("to_q",))
    with torch.no_grad():
        for weight in weights:
            weight[:2, :2] += torch.diag(torch.tensor([3.0, 1.0]))
    assert cut_adapter(model, originals, 1, ("to_q",))["kept"] == pytest.approx(0.9, abs=1e-6)


def test_an_adapter_file_recut_to_a_lower_rank_keeps_its_largest_directions_in_the_same_format(tmp_path):
    import json

    from diffusers import FluxPipeline
    from peft.utils import get_peft_model_state_dict
    from safetensors import safe_open

    from tools.lora_extraction import recut

    model = tiny_transformer()
    weights, originals = train_whole(model, ("to_q",))
    with torch.no_grad():
        for weight in weights:
            weight[:3, :3] += torch.diag(torch.tensor([2.0, 1.0, 1.0]))  # energy 4 + 1 + 1 per layer
    cut_adapter(model, originals, 3, ("to_q",))
    metadata = {"r": 3, "lora_alpha": 3, "target_modules": ["to_q"]}
    FluxPipeline.save_lora_weights(tmp_path, transformer_lora_layers=get_peft_model_state_dict(model),
                                   transformer_lora_adapter_metadata=metadata, weight_name="big.safetensors")
    summary = recut(tmp_path / "big.safetensors", tmp_path / "small" / "x.safetensors", 1)
    assert summary["kept"] == pytest.approx(4 / 6, abs=1e-6)
    with safe_open(str(tmp_path / "small" / "x.safetensors"), "pt") as small:
        metadata = json.loads(small.metadata()["lora_adapter_metadata"])
        assert metadata["transformer.r"] == metadata["transformer.lora_alpha"] == 1
        a_keys = sorted(key for key in small.keys() if key.endswith("lora_A.weight"))
        assert len(a_keys) == 2  # the double and the single block's to_q
        for key in a_keys:
            product = small.get_tensor(key.replace("lora_A", "lora_B")) @ small.get_tensor(key)
            expected = torch.zeros_like(product)
            expected[0, 0] = 2.0
            torch.testing.assert_close(product, expected, atol=1e-5, rtol=0)
