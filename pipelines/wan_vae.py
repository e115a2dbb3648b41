"""The Wan VAE latent space, shared by Wan (`AutoencoderKLWan`) and Qwen-Image
(`AutoencoderKLQwenImage`, the same architecture): latent normalisation and previews.

The denoisers work on normalized latents, `(z - latents_mean) / latents_std` per channel,
with the statistics in the VAE config; latents are 5-D [batch, channels, frames, h, w].
"""

from __future__ import annotations

import torch

from pipelines.latent_preview import (
    LatentRgbProjection,
    gradient_images,
    least_squares_projection,
    published_projection,
    studio_projection,
)
from pipelines.studio_config import StudioConfig

# Latent -> RGB preview factors of the Wan 2.1 VAE (as published with ComfyUI), on normalized
# latents: rgb in [-1, 1] = latent @ FACTORS + BIAS.
WAN_LATENT_RGB_FACTORS = (
    (-0.1299, -0.1692, 0.2932), (0.0671, 0.0406, 0.0442), (0.3568, 0.2548, 0.1747), (0.0372, 0.2344, 0.1420),
    (0.0313, 0.0189, -0.0328), (0.0296, -0.0956, -0.0665), (-0.3477, -0.4059, -0.2925), (0.0166, 0.1902, 0.1975),
    (-0.0412, 0.0267, -0.1364), (-0.1293, 0.0740, 0.1636), (0.0680, 0.3019, 0.1128), (0.0032, 0.0581, 0.0639),
    (-0.1251, 0.0927, 0.1699), (0.0060, -0.0633, 0.0005), (0.3477, 0.2275, 0.2950), (0.1984, 0.0913, 0.1861),
)
WAN_LATENT_RGB_BIAS = (-0.1835, -0.0868, -0.3360)


# The Wan 2.1 VAE's latent statistics (AutoencoderKLWan's defaults; Qwen-Image's VAE has them too).
WAN_LATENTS_MEAN = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)


def _statistics(vae, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
    std_inverse = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(latents.device, latents.dtype)
    return mean, std_inverse


def unnormalized(vae, latents: torch.Tensor) -> torch.Tensor:
    """What the VAE decodes, computed as WanPipeline and QwenImagePipeline do (the same float ops)."""
    latents = latents.to(vae.dtype)
    mean, std_inverse = _statistics(vae, latents)
    return latents / std_inverse + mean


def wan_vae_projection(vae, studio: StudioConfig, vae_scale_factor: int) -> LatentRgbProjection:
    """stepstudio.json's factors, else the published Wan 2.1 factors for the Wan 2.1 VAE
    (recognised by its latent statistics), else a least-squares fit on this VAE now."""
    configured = studio_projection(studio, vae.config.z_dim)
    if configured is not None:
        return configured
    if tuple(round(value, 4) for value in vae.config.latents_mean) == WAN_LATENTS_MEAN:
        return published_projection(WAN_LATENT_RGB_FACTORS, WAN_LATENT_RGB_BIAS, "wan-2.1-vae")
    return fit_wan_projection(vae, vae_scale_factor)


@torch.no_grad()
def fit_wan_projection(vae, vae_scale_factor: int, grid: int = 8, count: int = 8) -> LatentRgbProjection:
    """latent_preview's fit, with each test image as a one-frame video."""
    parameter = next(vae.parameters())
    images = gradient_images(count, grid * vae_scale_factor)
    latents = vae.encode(images[:, :, None].to(parameter.device, parameter.dtype)).latent_dist.mean.float().cpu()
    mean, std_inverse = _statistics(vae, latents)
    return least_squares_projection(((latents - mean) * std_inverse)[:, :, 0], images, vae_scale_factor)
