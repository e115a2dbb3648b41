"""Image-to-image rows for training shapes-flux v2 (`tools/train_builtin_v2.py --recolor-rate`):
a row starts from its scene in another colour and learns to land on the colour its caption names.

Without them the model sees, at every noise level, latents that agree with the caption, so at
image-to-image strength 0.7 it trusts the picture's colour over the prompt's (29% of redraws took
the prompt's colour after the first run; 100% after a run with a fifth of the rows like this).
"""

from __future__ import annotations

import numpy as np
import torch

from tools.shapes_world_v2 import Scene, recolored, render
from tools.train_builtin import pack_latents, to_tensor


def recolor_sources(edits: list[int], scenes: list[Scene], x0, sigma, vae, shift: float, scale: float,
                    rng: np.random.Generator, generator: torch.Generator):
    """Image-to-image rows: each row in `edits` starts from a blend of its scene and the same scene
    in another colour (the blend's share uniform in [0, 1], covering every state an image-to-image
    run passes through), at a noise level in [0.35, 0.95], so that a caption naming a colour wins
    over the picture's colour while the layout is kept."""
    with torch.no_grad():
        pictures = to_tensor([render(recolored(scenes[i], rng)) for i in edits])
        other = pack_latents((vae.encode(pictures).latent_dist.mean - shift) * scale)
    share = torch.rand(len(edits), generator=generator)[:, None, None]
    source, sigma = x0.clone(), sigma.clone()
    source[edits] = share * other + (1.0 - share) * x0[edits]
    sigma[edits] = 0.35 + 0.6 * torch.rand(len(edits), generator=generator)
    return source, sigma
