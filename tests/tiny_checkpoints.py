"""Tiny random-weight checkpoints of every family, built offline in about a second each.

`build_tiny_<family>(folder, studio_config=None) -> Path` writes a normal diffusers folder
(`save_pretrained`, safetensors) that both `pipelines.loader.load_pipeline` and the stock
diffusers pipeline load; `studio_config` becomes the folder's stepstudio.json.

    flux        FLUX.1-schnell-like (no guidance embedding), dynamic shifting
    flux_dev    FLUX.1-dev-like (guidance_embeds=True)
    sd3         Stable Diffusion 3: two CLIPs with projection + T5, patch size 2, fixed shift
    sd          Stable Diffusion 1.x: one CLIP, UNet, PNDM (as SD 1.5)
    sdxl        SDXL: two CLIPs, pooled embeddings and added time ids, Euler
    qwen_image  Qwen-Image: a 2-layer Qwen2.5-VL text encoder, dynamic exponential shifting
    wan         Wan 2.1-like: UMT5, one WanTransformer3DModel, flow UniPC (as the real checkpoints)
    wan22       Wan 2.2-like: two experts (transformer_2, boundary_ratio), flow-match Euler

The configs follow diffusers' own fast tests (`get_dummy_components`), a little wider where
the tiny sizes would hide a bug (two VAE levels so the VAE scale factor is not 1, dynamic
shifting so `mu` depends on the image size, latent statistics that are not the identity).
Tokenizers are built in memory instead of downloaded: CLIP is a character-level BPE without
merges, T5 a word-level unigram vocabulary with single letters as fallback, Qwen a byte-level
BPE without merges.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch
from diffusers import (
    AutoencoderKL,
    AutoencoderKLQwenImage,
    AutoencoderKLWan,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    PNDMScheduler,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
    UniPCMultistepScheduler,
    WanPipeline,
    WanTransformer3DModel,
)
from tokenizers import pre_tokenizers
from transformers import (
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPTokenizer,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2Tokenizer,
    T5Config,
    T5EncoderModel,
    T5Tokenizer,
    UMT5Config,
    UMT5EncoderModel,
)

CLIP_LENGTH = 32  # tokens: character-level pieces, so a short prompt fits
T5_LENGTH = 16  # the max_sequence_length the tests serve FLUX, SD3 and Wan with
TEXT_WIDTH = 32
WORDS = ("a", "red", "green", "blue", "circle", "square", "triangle", "on", "the", "left", "right", "blurry",
         "moving", "up", "down")
WAN_BOUNDARY_RATIO = 0.875  # Wan 2.2 A14B's: the high-noise expert runs timesteps >= 875


# ---------------------------------------------------------------------------- text
def tiny_clip_tokenizer() -> CLIPTokenizer:
    """Every lowercase letter, digit and punctuation mark is a token, alone and word-final.

    The special tokens go last: CLIPTextModel treats eos_token_id == 2 as a legacy
    checkpoint and pools at argmax(input_ids) instead of at the first end-of-text token."""
    vocab: dict[str, int] = {}
    for char in string.ascii_lowercase + string.digits + string.punctuation:
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


def _clip(tokenizer: CLIPTokenizer, model_class=CLIPTextModel, seed: int = 0):
    torch.manual_seed(seed)
    config = CLIPTextConfig(
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
    return model_class(config).eval()


def _t5(tokenizer: T5Tokenizer, width: int, config_class=T5Config, model_class=T5EncoderModel):
    """A 2-layer T5 encoder (UMT5 for Wan: the same config fields)."""
    torch.manual_seed(0)
    config = config_class(
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
    return model_class(config).eval()  # eval: T5 dropout would make outputs random


QWEN_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN_VOCAB_SIZE = 300  # 256 byte symbols + the special tokens, rounded up
QWEN_HIDDEN = 16


def tiny_qwen_tokenizer() -> Qwen2Tokenizer:
    vocab = {symbol: index for index, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for token in QWEN_SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None)
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN_SPECIAL_TOKENS[1:])})
    return tokenizer


def _qwen_text_encoder(tokenizer: Qwen2Tokenizer) -> Qwen2_5_VLForConditionalGeneration:
    pad, _, im_end = tokenizer.convert_tokens_to_ids(list(QWEN_SPECIAL_TOKENS))
    torch.manual_seed(0)
    # Vision token ids are unused by text-only prompts; they just have to fit the vocabulary.
    config = Qwen2_5_VLConfig(
        text_config={
            "hidden_size": QWEN_HIDDEN,
            "intermediate_size": QWEN_HIDDEN,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
            "rope_theta": 1000000.0,
            "vocab_size": QWEN_VOCAB_SIZE,
            "bos_token_id": pad,
            "eos_token_id": im_end,
            "pad_token_id": pad,
        },
        vision_config={"depth": 2, "hidden_size": QWEN_HIDDEN, "intermediate_size": QWEN_HIDDEN, "num_heads": 2,
                       "out_hidden_size": QWEN_HIDDEN},
        hidden_size=QWEN_HIDDEN,
        vocab_size=QWEN_VOCAB_SIZE,
        bos_token_id=pad,
        eos_token_id=im_end,
        pad_token_id=pad,
        vision_start_token_id=QWEN_VOCAB_SIZE - 4,
        vision_end_token_id=QWEN_VOCAB_SIZE - 3,
        vision_token_id=QWEN_VOCAB_SIZE - 2,
        image_token_id=QWEN_VOCAB_SIZE - 1,
        video_token_id=QWEN_VOCAB_SIZE - 5,
    )
    return Qwen2_5_VLForConditionalGeneration(config).eval()


# ---------------------------------------------------------------------------- autoencoders
def _vae(**normalization) -> AutoencoderKL:
    """Two levels: 1 latent cell = 2x2 pixels (vae_scale_factor 2), 4 latent channels."""
    torch.manual_seed(0)
    return AutoencoderKL(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(4, 8),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
        **normalization,
    )


def _flow_vae() -> AutoencoderKL:
    # FLUX and SD3 shift and scale their latents; values close to SD3's.
    return _vae(shift_factor=0.0609, scaling_factor=1.5035)


def _wan_vae(vae_class=AutoencoderKLWan, base_dim: int = 8, temperal_downsample=(True, True), **extra):
    """Causal 3D VAE with 4 latent channels and 4x spatial compression (Wan: also 4x temporal,
    9 frames -> 3 latent frames). Latent statistics are not the identity, so the
    normalisation is exercised."""
    torch.manual_seed(0)
    return vae_class(
        base_dim=base_dim,
        z_dim=4,
        dim_mult=[1, 2, 4],
        num_res_blocks=1,
        temperal_downsample=list(temperal_downsample),
        latents_mean=[0.1, -0.2, 0.3, 0.0],
        latents_std=[1.5, 0.8, 1.2, 1.0],
        **extra,
    )


# ---------------------------------------------------------------------------- helpers
def _save(pipe, folder: Path, studio_config: dict | None) -> Path:
    folder = Path(folder)
    pipe.save_pretrained(folder, safe_serialization=True)
    if studio_config is not None:
        (folder / "stepstudio.json").write_text(json.dumps(studio_config, indent=2) + "\n")
    return folder


def _sd_noise_schedule() -> dict:
    # The noise-schedule settings every SD 1.x/2.x and SDXL checkpoint ships with.
    return dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1)


def _unet(**extra) -> UNet2DConditionModel:
    torch.manual_seed(0)
    return UNet2DConditionModel(
        block_out_channels=(4, 8),
        layers_per_block=1,
        sample_size=16,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=2,
        **extra,
    )


# ---------------------------------------------------------------------------- families
def build_tiny_flux(folder: Path, studio_config: dict | None = None, guidance_embeds: bool = False) -> Path:
    """FLUX.1-schnell-like by default. Latents: 4 channels, packed 2x2 -> 16 transformer
    channels; a 32x32 image is 64 tokens."""
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
    # Dynamic shifting as in the real FLUX.1 configs, with sequence lengths fitted to tiny images.
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=16,
        max_image_seq_len=256,
    )
    pipe = FluxPipeline(
        scheduler=scheduler,
        vae=_flow_vae(),
        text_encoder=_clip(clip_tokenizer),
        tokenizer=clip_tokenizer,
        text_encoder_2=_t5(t5_tokenizer, TEXT_WIDTH),
        tokenizer_2=t5_tokenizer,
        transformer=transformer,
    )
    return _save(pipe, folder, studio_config)


def build_tiny_flux_dev(folder: Path, studio_config: dict | None = None) -> Path:
    """FLUX.1-dev-like: the guidance scale is embedded per row (guidance_embeds=True)."""
    return build_tiny_flux(folder, studio_config, guidance_embeds=True)


def build_tiny_sd3(folder: Path, studio_config: dict | None = None) -> Path:
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
    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),  # SD3's: a fixed shift, no dynamic shifting
        vae=_flow_vae(),
        text_encoder=_clip(clip_tokenizer, CLIPTextModelWithProjection, seed=0),
        tokenizer=clip_tokenizer,
        text_encoder_2=_clip(clip_tokenizer, CLIPTextModelWithProjection, seed=1),
        tokenizer_2=clip_tokenizer,
        text_encoder_3=_t5(t5_tokenizer, 2 * TEXT_WIDTH),
        tokenizer_3=t5_tokenizer,
    )
    return _save(pipe, folder, studio_config)


def build_tiny_sd3_16_channels(folder: Path, studio_config: dict | None = None) -> Path:
    """build_tiny_sd3 with 16 latent channels, as real SD3: StableDiffusion3InpaintPipeline
    takes only a 16-channel (or 33-channel inpainting) transformer."""
    torch.manual_seed(0)
    transformer = SD3Transformer2DModel(
        sample_size=32, patch_size=2, in_channels=16, num_layers=2, attention_head_dim=8, num_attention_heads=4,
        caption_projection_dim=32, joint_attention_dim=2 * TEXT_WIDTH, pooled_projection_dim=2 * TEXT_WIDTH,
        out_channels=16,
    )
    torch.manual_seed(0)
    vae = AutoencoderKL(
        sample_size=32, in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(4, 8), layers_per_block=1, latent_channels=16,
        norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035,
    )
    clip_tokenizer, t5_tokenizer = tiny_clip_tokenizer(), tiny_t5_tokenizer()
    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=vae,
        text_encoder=_clip(clip_tokenizer, CLIPTextModelWithProjection, seed=0),
        tokenizer=clip_tokenizer,
        text_encoder_2=_clip(clip_tokenizer, CLIPTextModelWithProjection, seed=1),
        tokenizer_2=clip_tokenizer,
        text_encoder_3=_t5(t5_tokenizer, 2 * TEXT_WIDTH),
        tokenizer_3=t5_tokenizer,
    )
    return _save(pipe, folder, studio_config)


def build_tiny_sd(folder: Path, studio_config: dict | None = None) -> Path:
    """Stable Diffusion 1.x-shaped, with SD 1.5's default scheduler (PNDM)."""
    tokenizer = tiny_clip_tokenizer()
    pipe = StableDiffusionPipeline(
        vae=_vae(),
        text_encoder=_clip(tokenizer),
        tokenizer=tokenizer,
        unet=_unet(cross_attention_dim=TEXT_WIDTH),
        scheduler=PNDMScheduler(**_sd_noise_schedule(), skip_prk_steps=True, set_alpha_to_one=False),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    return _save(pipe, folder, studio_config)


def build_tiny_sdxl(folder: Path, studio_config: dict | None = None) -> Path:
    """SDXL-shaped: two CLIP encoders, pooled embeddings, added time ids, Euler."""
    tokenizer = tiny_clip_tokenizer()
    unet = _unet(
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        transformer_layers_per_block=(1, 2),
        projection_class_embeddings_input_dim=6 * 8 + TEXT_WIDTH,  # 6 time ids x 8 + the pooled text
        cross_attention_dim=2 * TEXT_WIDTH,  # both CLIPs' hidden states, concatenated
    )
    pipe = StableDiffusionXLPipeline(
        vae=_vae(),
        text_encoder=_clip(tokenizer, seed=0),
        tokenizer=tokenizer,
        text_encoder_2=_clip(tokenizer, CLIPTextModelWithProjection, seed=1),
        tokenizer_2=tokenizer,
        unet=unet,
        scheduler=EulerDiscreteScheduler(**_sd_noise_schedule(), timestep_spacing="leading"),
        add_watermarker=False,
    )
    return _save(pipe, folder, studio_config)


def build_tiny_qwen_image(folder: Path, studio_config: dict | None = None) -> Path:
    """Qwen-Image with its real scheduler settings (dynamic, exponential shifting); the VAE
    packs 2x2 latent patches, so sizes are multiples of 8."""
    torch.manual_seed(0)
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=3,
        joint_attention_dim=QWEN_HIDDEN,
        guidance_embeds=False,
        axes_dims_rope=(8, 4, 4),
    )
    scheduler = FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=256, base_shift=0.5, max_image_seq_len=8192, max_shift=0.9, shift=1.0,
        shift_terminal=0.02, time_shift_type="exponential", use_dynamic_shifting=True,
    )
    tokenizer = tiny_qwen_tokenizer()
    vae = _wan_vae(AutoencoderKLQwenImage, base_dim=24, temperal_downsample=[False, True])
    pipe = QwenImagePipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=_qwen_text_encoder(tokenizer),
        tokenizer=tokenizer,
        transformer=transformer,
    )
    return _save(pipe, folder, studio_config)


def _wan_transformer(seed: int) -> WanTransformer3DModel:
    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=4,
        out_channels=4,
        text_dim=TEXT_WIDTH,
        freq_dim=32,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )


def _wan(folder: Path, studio_config: dict | None, scheduler, two_experts: bool) -> Path:
    tokenizer = tiny_t5_tokenizer()
    pipe = WanPipeline(
        tokenizer=tokenizer,
        text_encoder=_t5(tokenizer, TEXT_WIDTH, UMT5Config, UMT5EncoderModel),
        vae=_wan_vae(scale_factor_spatial=4, scale_factor_temporal=4),  # set: they are not derived
        scheduler=scheduler,
        transformer=_wan_transformer(seed=0),
        transformer_2=_wan_transformer(seed=1) if two_experts else None,
        boundary_ratio=WAN_BOUNDARY_RATIO if two_experts else None,
    )
    return _save(pipe, folder, studio_config)


def build_tiny_wan(folder: Path, studio_config: dict | None = None) -> Path:
    """Wan 2.1-like: one transformer, the flow UniPC scheduler real Wan checkpoints ship.
    A 9-frame 32x32 video is 3 latent frames of 8x8 (48 tokens at patch (1, 2, 2))."""
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    return _wan(folder, studio_config, scheduler, two_experts=False)


def build_tiny_wan22(folder: Path, studio_config: dict | None = None) -> Path:
    """Wan 2.2-like: a high-noise `transformer` and a low-noise `transformer_2`, switched at
    boundary_ratio x 1000; flow-match Euler with a fixed shift."""
    return _wan(folder, studio_config, FlowMatchEulerDiscreteScheduler(shift=3.0), two_experts=True)
