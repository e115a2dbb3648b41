"""Tiny random-weight FLUX.1 and Stable Diffusion 3 checkpoints, built offline in about a second.

The configs follow diffusers' own fast tests (`get_dummy_components`), a little wider where
the tiny sizes would hide a bug (two VAE levels so `vae_scale_factor` is not 1, a
dynamic-shifting scheduler so `mu` depends on the image size). Tokenizers are built in
memory (CLIP: character-level BPE without merges; T5: a word-level unigram vocabulary
with single letters as fallback) instead of downloaded. Each builder writes a normal
diffusers folder (`save_pretrained`, safetensors) that `pipelines.loader.load_pipeline`
and the stock `FluxPipeline` / `StableDiffusion3Pipeline` both load.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch
from diffusers import (
    AutoencoderKL,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
)
from transformers import (
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPTokenizer,
    T5Config,
    T5EncoderModel,
    T5Tokenizer,
)

CLIP_LENGTH = 32  # tokens: character-level pieces, so a short prompt fits
T5_LENGTH = 16
TEXT_WIDTH = 32
WORDS = ("a", "red", "green", "blue", "circle", "square", "triangle", "on", "the", "left", "right", "blurry")


def tiny_clip_tokenizer() -> CLIPTokenizer:
    """Every lowercase letter, digit and mark is a token, alone and word-final.

    The special tokens go last: CLIPTextModel treats eos_token_id == 2 as a legacy
    checkpoint and pools at argmax(input_ids) instead of at the first end-of-text token."""
    vocab: dict[str, int] = {}
    for char in string.ascii_lowercase + string.digits + ",.'":
        for piece in (char, char + "</w>"):
            vocab.setdefault(piece, len(vocab))
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=CLIP_LENGTH)


def tiny_t5_tokenizer() -> T5Tokenizer:
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [("\u2581" + word, -1.0) for word in WORDS]
    pieces += [(letter, -10.0) for letter in string.ascii_lowercase] + [("\u2581", -10.0)]
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=T5_LENGTH)


def _clip_config(tokenizer: CLIPTokenizer) -> CLIPTextConfig:
    return CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=TEXT_WIDTH,
        intermediate_size=37,
        projection_dim=TEXT_WIDTH,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=CLIP_LENGTH,
        layer_norm_eps=1e-05,
        hidden_act="gelu",
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _t5_encoder(tokenizer: T5Tokenizer, width: int) -> T5EncoderModel:
    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=width,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        dropout_rate=0.0,
        feed_forward_proj="gated-gelu",
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    return T5EncoderModel(config).eval()  # eval: T5 dropout would make outputs random


def _vae(latent_channels: int) -> AutoencoderKL:
    """Two levels: 1 latent cell = 2x2 pixels (vae_scale_factor 2)."""
    return AutoencoderKL(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(4, 8),
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )


def _write_studio_config(folder: Path, studio_config: dict | None) -> None:
    if studio_config is not None:
        (folder / "stepstudio.json").write_text(json.dumps(studio_config, indent=2) + "\n")


def build_tiny_flux(folder: Path, guidance_embeds: bool = False, studio_config: dict | None = None) -> Path:
    """A FLUX.1-shaped checkpoint: schnell-like by default, dev-like with `guidance_embeds=True`.

    Latents: 4 channels, packed 2x2 -> 16 transformer channels; a 32x32 image is 64 tokens."""
    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=TEXT_WIDTH,
        pooled_projection_dim=TEXT_WIDTH,
        guidance_embeds=guidance_embeds,
        axes_dims_rope=(4, 4, 8),
    )
    clip_tokenizer, t5_tokenizer = tiny_clip_tokenizer(), tiny_t5_tokenizer()
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(_clip_config(clip_tokenizer)).eval()
    torch.manual_seed(0)
    text_encoder_2 = _t5_encoder(t5_tokenizer, TEXT_WIDTH)
    torch.manual_seed(0)
    vae = _vae(latent_channels=4)
    # Dynamic shifting as in the real FLUX.1 configs, with sequence lengths fitted to tiny images.
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=16,
        max_image_seq_len=256,
    )
    pipe = FluxPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=clip_tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=t5_tokenizer,
        transformer=transformer,
    )
    pipe.save_pretrained(folder, safe_serialization=True)
    _write_studio_config(folder, studio_config)
    return folder


def build_tiny_sd3(folder: Path, studio_config: dict | None = None) -> Path:
    """A Stable Diffusion 3-shaped checkpoint: two CLIPs with projection + T5, patch size 2."""
    torch.manual_seed(0)
    transformer = SD3Transformer2DModel(
        sample_size=32,
        patch_size=2,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        caption_projection_dim=32,
        joint_attention_dim=2 * TEXT_WIDTH,  # the T5 width; the two CLIPs' concat is padded to it
        pooled_projection_dim=2 * TEXT_WIDTH,  # the two CLIPs' pooled outputs, concatenated
        out_channels=4,
    )
    clip_tokenizer, t5_tokenizer = tiny_clip_tokenizer(), tiny_t5_tokenizer()
    torch.manual_seed(0)
    text_encoder = CLIPTextModelWithProjection(_clip_config(clip_tokenizer)).eval()
    torch.manual_seed(1)
    text_encoder_2 = CLIPTextModelWithProjection(_clip_config(clip_tokenizer)).eval()
    torch.manual_seed(0)
    text_encoder_3 = _t5_encoder(t5_tokenizer, 2 * TEXT_WIDTH)
    torch.manual_seed(0)
    vae = _vae(latent_channels=4)
    # SD3's checkpoint scheduler: a fixed shift of 3.0, no dynamic shifting.
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=clip_tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=clip_tokenizer,
        text_encoder_3=text_encoder_3,
        tokenizer_3=t5_tokenizer,
    )
    pipe.save_pretrained(folder, safe_serialization=True)
    _write_studio_config(folder, studio_config)
    return folder
