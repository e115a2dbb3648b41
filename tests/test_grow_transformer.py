"""Growing the built-in FLUX transformer by identity blocks (tools/grow_transformer.py): the grown
model computes what the trained one did, bit for bit at first, and its new blocks learn."""

from __future__ import annotations

import torch

from tools.builtin_components import build_transformer
from tools.grow_transformer import grow_into


def inputs(batch: int = 2, side: int = 8, text: int = 5) -> dict:
    generator = torch.Generator().manual_seed(1)
    grid = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij"), -1).reshape(-1, 2)
    return {"hidden_states": torch.randn(batch, side * side, 64, generator=generator),
            "encoder_hidden_states": torch.randn(batch, text, 64, generator=generator),
            "pooled_projections": torch.randn(batch, 64, generator=generator),
            "timestep": torch.tensor([0.3, 0.8]),
            "img_ids": torch.cat([torch.zeros(side * side, 1), grid.float()], 1),
            "txt_ids": torch.zeros(text, 3)}


def test_a_grown_transformer_computes_what_the_trained_one_did_and_its_new_blocks_learn():
    torch.manual_seed(0)
    trained = build_transformer()
    with torch.no_grad():  # weights away from their initial values, as a trained model's are
        for parameter in trained.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    grown = build_transformer(4, 8)
    assert grow_into(grown, trained.state_dict()) == 2 + 4
    with torch.no_grad():
        before, after = trained(**inputs()).sample, grown(**inputs()).sample
    assert torch.equal(before, after)
    # Every new block's gates get gradients at the first step (adaLN-Zero), so the blocks can move.
    grown(**inputs()).sample.square().mean().backward()
    for kind, name in (("transformer_blocks", "norm1"), ("single_transformer_blocks", "norm")):
        new_block = getattr(grown, kind)[-1]
        assert getattr(new_block, name).linear.weight.grad.abs().sum() > 0
    # A trained transformer with more blocks than the target is refused, not cut.
    try:
        grow_into(build_transformer(), grown.state_dict())
    except AssertionError as error:
        assert "lacks" in str(error)
    else:
        raise AssertionError("a deeper state went into a shallower transformer")
