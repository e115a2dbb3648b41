"""Configs of the built-in video model's components: stock diffusers/transformers classes, all tiny.

WanPipeline reads everything it needs from these configs, so the traps are set right here:
- `scale_factor_spatial` / `scale_factor_temporal` are not derived from `dim_mult` /
  `temperal_downsample`; the pipeline sizes its latents from them, so they must agree.
- `latents_mean` / `latents_std` need one value per latent channel; they are measured on the
  encoded training clips (tools/train_video.py) and written into the VAE config before export.
- The tokenizer is built in memory from the moving-shapes vocabulary (word-level pieces).
"""

from __future__ import annotations

from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel
from transformers import T5Tokenizer, UMT5Config, UMT5EncoderModel

from tools.moving_shapes_world import vocabulary

TEXT_LENGTH = 16  # tokens; the longest caption needs 10 (9 words + </s>)
TEXT_WIDTH = 64
LATENT_CHANNELS = 16
SPATIAL_COMPRESSION = 4  # 64x64 frames -> 16x16 latents
TEMPORAL_COMPRESSION = 2  # 9 frames -> 5 latent frames (1 + 8/2); 4x made moving shapes ghost
FLOW_SHIFT = 3.0  # the Wan convention: sigmas shifted towards noise


def build_vae(latents_mean: list[float] | None = None, latents_std: list[float] | None = None) -> AutoencoderKLWan:
    """9x64x64 RGB <-> 16x5x16x16 latents (0.49M params).

    patch_size 2 folds 2x2 pixels into 12 channels first (the VAE then works at 32x32, four times
    cheaper), and one down block halves space and time once more.
    """
    return AutoencoderKLWan(
        base_dim=16,
        z_dim=LATENT_CHANNELS,
        dim_mult=[1, 2],
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=[True],
        patch_size=2,
        in_channels=12,  # 3 colours x 2x2 patch
        out_channels=12,
        scale_factor_spatial=SPATIAL_COMPRESSION,
        scale_factor_temporal=TEMPORAL_COMPRESSION,
        latents_mean=latents_mean or [0.0] * LATENT_CHANNELS,
        latents_std=latents_std or [1.0] * LATENT_CHANNELS,
    )


def build_transformer(patch: int = 2) -> WanTransformer3DModel:
    """Wan architecture: 4 heads x 32, ffn 512, 6 blocks (1.8M params). Patch (1, 2, 2) makes each
    token an 8x8-pixel square of one latent frame (5 x 8 x 8 = 320 tokens per clip), fine enough
    for the token's output projection to draw a circle, square or triangle apart; with patch
    (1, 4, 4) (80 tokens, about three times cheaper per step) a shape fills about two tokens and
    the model learned colour, background and motion but barely the shape."""
    return WanTransformer3DModel(
        patch_size=(1, patch, patch),
        num_attention_heads=4,
        attention_head_dim=32,
        in_channels=LATENT_CHANNELS,
        out_channels=LATENT_CHANNELS,
        text_dim=TEXT_WIDTH,
        freq_dim=64,
        ffn_dim=512,
        num_layers=6,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=64,
    )


def build_scheduler() -> UniPCMultistepScheduler:
    """Wan's released scheduler: UniPC on flow-matching sigmas, shifted by FLOW_SHIFT."""
    return UniPCMultistepScheduler(
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        num_train_timesteps=1000,
        flow_shift=FLOW_SHIFT,
    )


def model_words() -> list[str]:
    return sorted(vocabulary())


def build_tokenizer() -> T5Tokenizer:
    """Word-level unigram pieces; single letters let an unknown word still tokenize (to pieces the
    model never learned) instead of collapsing to <unk>."""
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [("\u2581" + word, -1.0) for word in model_words()]
    pieces += [(letter, -10.0) for letter in "abcdefghijklmnopqrstuvwxyz"] + [("\u2581", -10.0)]
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=TEXT_LENGTH)


def build_text_encoder(tokenizer: T5Tokenizer) -> UMT5EncoderModel:
    """UMT5 encoder, d_model 64, 2 layers. No dropout: WanPipeline runs it as constructed."""
    config = UMT5Config(
        vocab_size=len(tokenizer),
        d_model=TEXT_WIDTH,
        d_kv=16,
        d_ff=TEXT_WIDTH * 2,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=TEXT_LENGTH,
        dropout_rate=0.0,
        feed_forward_proj="gated-gelu",
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    return UMT5EncoderModel(config)
