"""Tiny random-weight Stable Diffusion and SDXL checkpoints, built offline in well under a second.

The configs follow diffusers' own fast tests (`get_dummy_components`); the CLIP tokenizer
is built in memory (a character-level BPE vocabulary, no merges) instead of downloaded.
Each builder writes a normal diffusers folder (`save_pretrained`, safetensors) that
`pipelines.loader.load_pipeline(str(folder))` and `*Pipeline.from_pretrained` both load.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from diffusers import (
    AutoencoderKL,
    EulerDiscreteScheduler,
    PNDMScheduler,
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
)
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

VOCAB_SIZE = 1000
BOS_ID, EOS_ID = 0, 1  # "<|startoftext|>", "<|endoftext|>" (also the padding token)


def tiny_clip_tokenizer() -> CLIPTokenizer:
    """Every lowercase letter, digit and punctuation mark is a token, alone and word-final."""
    vocab = {"<|startoftext|>": BOS_ID, "<|endoftext|>": EOS_ID}
    for char in string.ascii_lowercase + string.digits + string.punctuation:
        for piece in (char, char + "</w>"):
            vocab.setdefault(piece, len(vocab))
    assert len(vocab) < VOCAB_SIZE
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[])
    tokenizer.model_max_length = 77  # as every real SD tokenizer: prompts pad/truncate to 77
    return tokenizer


def _clip_text_config(**extra) -> CLIPTextConfig:
    return CLIPTextConfig(
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
        hidden_size=32,
        layer_norm_eps=1e-05,
        vocab_size=VOCAB_SIZE,
        **extra,
    )


def _sd15_like_scheduler_config() -> dict:
    # The noise-schedule settings every SD 1.x/2.x and SDXL checkpoint ships with.
    return dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1)


def build_tiny_sd(folder: Path) -> Path:
    """A Stable Diffusion 1.x-shaped checkpoint (PNDM default scheduler, like SD 1.5)."""
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(4, 8),
        layers_per_block=1,
        sample_size=32,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        norm_num_groups=2,
    )
    scheduler = PNDMScheduler(
        **_sd15_like_scheduler_config(), skip_prk_steps=True, set_alpha_to_one=False
    )
    torch.manual_seed(0)
    vae = AutoencoderKL(
        block_out_channels=[4, 8],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
        up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"],
        latent_channels=4,
        norm_num_groups=2,
    )
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(
        _clip_text_config(intermediate_size=64, num_attention_heads=8, num_hidden_layers=3)
    ).eval()
    pipeline = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tiny_clip_tokenizer(),
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.save_pretrained(folder, safe_serialization=True)
    return Path(folder)


def build_tiny_sdxl(folder: Path) -> Path:
    """An SDXL-shaped checkpoint: two CLIP encoders, pooled embeds, added time ids, Euler."""
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(2, 4),
        layers_per_block=2,
        sample_size=32,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        transformer_layers_per_block=(1, 2),
        projection_class_embeddings_input_dim=80,  # 6 time ids * 8 + 32 pooled
        cross_attention_dim=64,
        norm_num_groups=1,
    )
    scheduler = EulerDiscreteScheduler(**_sd15_like_scheduler_config(), timestep_spacing="leading")
    torch.manual_seed(0)
    vae = AutoencoderKL(
        block_out_channels=[32, 64],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
        up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"],
        latent_channels=4,
        sample_size=128,
    )
    torch.manual_seed(0)
    text_config = _clip_text_config(
        intermediate_size=37, num_attention_heads=4, num_hidden_layers=5, hidden_act="gelu", projection_dim=32
    )
    text_encoder = CLIPTextModel(text_config).eval()
    text_encoder_2 = CLIPTextModelWithProjection(text_config).eval()
    pipeline = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tiny_clip_tokenizer(),
        text_encoder_2=text_encoder_2,
        tokenizer_2=tiny_clip_tokenizer(),
        unet=unet,
        scheduler=scheduler,
        add_watermarker=False,
    )
    pipeline.save_pretrained(folder, safe_serialization=True)
    return Path(folder)
