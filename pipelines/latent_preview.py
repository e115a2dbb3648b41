"""Live previews without a VAE decode: a linear map from normalized latents to RGB.

Normalized latents are what the denoiser works on, `(z - shift_factor) * scaling_factor`.
The map `rgb = latents^T @ factors + bias` gives colours in [0, 1] at the latent grid's
resolution (one pixel per latent cell): about a millisecond, where a VAE decode per step
would take seconds on a CPU.

Where the factors come from, first match wins:
1. the model folder's stepstudio.json (`preview_rgb_factors`, `preview_rgb_bias`);
2. a known VAE (the FLUX.1 and SD3 autoencoders, recognised by their scaling and shift);
3. a least-squares fit at load time: a few smooth colour gradients go through the VAE
   encoder once (a few hundred milliseconds), and the map from their latents back to
   the downsampled images is solved for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from pipelines.studio_config import StudioConfig

# Factors published with ComfyUI's latent formats (comfy/latent_formats.py). They map to
# [-1, 1]; `published_projection` rescales them to [0, 1] like every other source here.
_FLUX_FACTORS = [
    [-0.0346, 0.0244, 0.0681], [0.0034, 0.0210, 0.0687], [0.0275, -0.0668, -0.0433], [-0.0174, 0.0160, 0.0617],
    [0.0859, 0.0721, 0.0329], [0.0004, 0.0383, 0.0115], [0.0405, 0.0861, 0.0915], [-0.0236, -0.0185, -0.0259],
    [-0.0245, 0.0250, 0.1180], [0.1008, 0.0755, -0.0421], [-0.0515, 0.0201, 0.0011], [0.0428, -0.0012, -0.0036],
    [0.0817, 0.0765, 0.0749], [-0.1264, -0.0522, -0.1103], [-0.0280, -0.0881, -0.0499], [-0.1262, -0.0982, -0.0778],
]
_FLUX_BIAS = [-0.0329, -0.0718, -0.0851]
_SD3_FACTORS = [
    [-0.0922, -0.0175, 0.0749], [0.0311, 0.0633, 0.0954], [0.1994, 0.0927, 0.0458], [0.0856, 0.0339, 0.0902],
    [0.0587, 0.0272, -0.0496], [-0.0006, 0.1104, 0.0309], [0.0978, 0.0306, 0.0427], [-0.0042, 0.1038, 0.1358],
    [-0.0194, 0.0020, 0.0669], [-0.0488, 0.0130, -0.0268], [0.0922, 0.0988, 0.0951], [-0.0278, 0.0524, -0.0542],
    [0.0332, 0.0456, 0.0895], [-0.0069, -0.0030, -0.0810], [-0.0596, -0.0465, -0.0293], [-0.1448, -0.1463, -0.1189],
]
_SD3_BIAS = [0.2394, 0.2135, 0.1925]

# (latent channels, scaling_factor, shift_factor) of a released VAE -> its name and factors.
_KNOWN_VAES = {
    (16, 0.3611, 0.1159): ("flux-vae", _FLUX_FACTORS, _FLUX_BIAS),
    (16, 1.5305, 0.0609): ("sd3-vae", _SD3_FACTORS, _SD3_BIAS),
}


@dataclass(frozen=True)
class LatentRgbProjection:
    factors: torch.Tensor  # [channels, 3], float32 on the CPU
    bias: torch.Tensor  # [3]
    source: str  # where the factors came from: "stepstudio.json", "flux-vae", "sd3-vae" or "fitted"

    @property
    def channels(self) -> int:
        return self.factors.shape[0]

    def render(self, latents: torch.Tensor) -> Image.Image:
        """Normalized latents [C, H, W] (or [1, C, H, W]) -> an H x W RGB image."""
        latents = latents.detach().reshape(-1, *latents.shape[-2:]).float().cpu()
        if latents.shape[0] != self.channels:
            raise ValueError(
                f"preview got latents with {latents.shape[0]} channels; the projection expects {self.channels}."
            )
        rgb = torch.einsum("chw,cr->hwr", latents, self.factors) + self.bias
        array = (rgb.clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).numpy()
        return Image.fromarray(np.ascontiguousarray(array), mode="RGB")


def _vae_normalization(vae) -> tuple[float, float]:
    """(shift, scale) with normalized = (z - shift) * scale, as the pipelines use them."""
    return float(vae.config.shift_factor or 0.0), float(vae.config.scaling_factor)


def studio_projection(studio: StudioConfig, channels: int) -> LatentRgbProjection | None:
    """stepstudio.json's factors, checked against the VAE's latent channels (None when it has none)."""
    if studio.preview_rgb_factors is None:
        return None
    if len(studio.preview_rgb_factors) != channels:
        raise ValueError(
            f"stepstudio.json: preview_rgb_factors has {len(studio.preview_rgb_factors)} rows; "
            f"this VAE has {channels} latent channels, so it needs {channels} rows of [r, g, b]."
        )
    return LatentRgbProjection(
        torch.tensor(studio.preview_rgb_factors), torch.tensor(studio.preview_rgb_bias), "stepstudio.json"
    )


def published_projection(factors, bias, source: str) -> LatentRgbProjection:
    """Factors published for [-1, 1] output, as a projection to [0, 1]."""
    return LatentRgbProjection(torch.tensor(factors) / 2.0, (torch.tensor(bias) + 1.0) / 2.0, source)


def projection_for(vae, studio: StudioConfig, vae_scale_factor: int) -> LatentRgbProjection:
    """The preview projection of a model: stepstudio.json, a known VAE, or fitted now."""
    channels = int(vae.config.latent_channels)
    configured = studio_projection(studio, channels)
    if configured is not None:
        return configured
    shift, scale = _vae_normalization(vae)
    known = _KNOWN_VAES.get((channels, round(scale, 4), round(shift, 4)))
    if known is not None:
        name, factors, bias = known
        return published_projection(factors, bias, name)
    return fit_projection(vae, vae_scale_factor)


def gradient_images(count: int, size: int, seed: int = 0) -> torch.Tensor:
    """`count` images in [-1, 1], each a bilinear blend of four random corner colours."""
    generator = torch.Generator().manual_seed(seed)
    corners = torch.rand(count, 3, 2, 2, generator=generator) * 2.0 - 1.0
    return F.interpolate(corners, size=(size, size), mode="bilinear", align_corners=True)


def least_squares_projection(latents: torch.Tensor, images: torch.Tensor, vae_scale_factor: int) -> LatentRgbProjection:
    """The map from normalized latents [N, C, g, g] of `images` [N, 3, G, G] (in [-1, 1]) back to
    those images, downsampled to the latent grid. Gradients keep the map local, which is what
    a preview needs."""
    targets = F.avg_pool2d((images + 1.0) / 2.0, kernel_size=vae_scale_factor)  # [N, 3, g, g]
    inputs = latents.permute(0, 2, 3, 1).reshape(-1, latents.shape[1])
    inputs = torch.cat([inputs, torch.ones(len(inputs), 1)], dim=1)
    outputs = targets.permute(0, 2, 3, 1).reshape(-1, 3)
    solution = torch.linalg.lstsq(inputs.double(), outputs.double()).solution.float()
    return LatentRgbProjection(solution[:-1].contiguous(), solution[-1].contiguous(), "fitted")


@torch.no_grad()
def fit_projection(vae, vae_scale_factor: int, grid: int = 8, count: int = 8) -> LatentRgbProjection:
    """Least squares from the normalized latents of smooth test images to those images."""
    shift, scale = _vae_normalization(vae)
    parameter = next(vae.parameters())
    images = gradient_images(count, grid * vae_scale_factor)
    latents = vae.encode(images.to(parameter.device, parameter.dtype)).latent_dist.mean.float().cpu()
    return least_squares_projection((latents - shift) * scale, images, vae_scale_factor)
