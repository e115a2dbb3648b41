"""Grow a trained FLUX transformer by blocks that start as the identity (adaLN-Zero, as DiT
initializes its blocks), so training a deeper model goes on from what the smaller one learned
instead of from scratch.

FluxTransformerBlock adds its attention and feed-forward outputs times gates made by its
modulation layers (norm1, norm1_context); FluxSingleTransformerBlock adds its output times the gate
of its `norm`. With those layers' weights and biases zero every gate is 0 and the block passes its
input through unchanged; the gates get gradients at once, so the block starts learning at the first
step.
"""

from __future__ import annotations

import torch

# The blocks of each kind, and the modulation layers whose zeros make such a block the identity.
MODULATIONS = (("transformer_blocks", ("norm1", "norm1_context")), ("single_transformer_blocks", ("norm",)))


def grow_into(transformer: torch.nn.Module, trained_state: dict) -> int:
    """Load a trained transformer's state with fewer blocks into `transformer` (each of its blocks
    into the block of the same index); the extra blocks start as the identity, so the grown model
    computes exactly what the trained one did. Returns the number of new blocks."""
    state = transformer.state_dict()
    unknown = set(trained_state) - set(state)
    assert not unknown, f"the trained transformer has blocks this one lacks: {sorted(unknown)[:3]}"
    transformer.load_state_dict({**state, **trained_state})
    new_blocks = 0
    for kind, modulations in MODULATIONS:
        for index, block in enumerate(getattr(transformer, kind)):
            if any(key.startswith(f"{kind}.{index}.") for key in trained_state):
                continue
            new_blocks += 1
            for name in modulations:
                torch.nn.init.zeros_(getattr(block, name).linear.weight)
                torch.nn.init.zeros_(getattr(block, name).linear.bias)
    return new_blocks
