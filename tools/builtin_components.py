"""Configs of the built-in model's components: stock diffusers/transformers classes, all tiny.

Tokenizers are built in memory from the shapes world's vocabulary (word-level pieces), so
the checkpoint needs no download to be reproduced.
"""

from __future__ import annotations

from collections import Counter

from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5Tokenizer

from tools.shapes_world import IMAGE_SIZE, vocabulary

TEXT_LENGTH = 16  # tokens, for both text encoders (captions need 11-13)
TEXT_WIDTH = 64
LATENT_CHANNELS = 16
PUNCTUATION: tuple[str, ...] = (",",)


def build_vae() -> AutoencoderKL:
    """64x64 RGB <-> 16x16x16 latents (0.67M params)."""
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(16, 32, 64),
        layers_per_block=1,
        latent_channels=LATENT_CHANNELS,
        norm_num_groups=1,
        sample_size=IMAGE_SIZE,
        use_quant_conv=False,
        use_post_quant_conv=False,
        mid_block_add_attention=False,
        scaling_factor=1.0,  # measured from the latents after VAE training
        shift_factor=0.0,
    )


V1_BLOCKS = (2, 4)  # v1's double-stream and single-stream blocks (2.3M parameters)


def build_transformer(num_layers: int = V1_BLOCKS[0], num_single_layers: int = V1_BLOCKS[1]) -> FluxTransformer2DModel:
    """FLUX architecture, width 128; by default v1's blocks."""
    return FluxTransformer2DModel(
        patch_size=1,
        in_channels=LATENT_CHANNELS * 4,  # 2x2 packed latents
        num_layers=num_layers,
        num_single_layers=num_single_layers,
        attention_head_dim=32,
        num_attention_heads=4,
        joint_attention_dim=TEXT_WIDTH,
        pooled_projection_dim=TEXT_WIDTH,
        guidance_embeds=False,
        axes_dims_rope=(8, 12, 12),
    )


def build_scheduler() -> FlowMatchEulerDiscreteScheduler:
    """FLUX.1-style dynamic shifting; mu = 0.5 at 64 image tokens (64x64), 1.15 at 256 (128x128)."""
    return FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000,
        shift=1.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=64,
        max_image_seq_len=256,
    )


def model_words(words: set[str] | None = None) -> list[str]:
    """The model's words, sorted: `words` (a world's vocabulary) or the v1 shapes world's."""
    return sorted(vocabulary() if words is None else words)


def bpe_merges(words: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Train byte-pair merges until every word is one token (CLIP marks word ends with </w>)."""
    sequences = [list(word[:-1]) + [word[-1] + "</w>"] for word in words]
    tokens = {piece for sequence in sequences for piece in sequence}
    merges: list[tuple[str, str]] = []
    while any(len(sequence) > 1 for sequence in sequences):
        pairs = Counter(
            (sequence[i], sequence[i + 1]) for sequence in sequences for i in range(len(sequence) - 1)
        )
        best = max(sorted(pairs), key=lambda pair: pairs[pair])
        merges.append(best)
        tokens.add(best[0] + best[1])
        for sequence in sequences:
            i = 0
            while i < len(sequence) - 1:
                if (sequence[i], sequence[i + 1]) == best:
                    sequence[i : i + 2] = [best[0] + best[1]]
                i += 1
    return sorted(tokens), merges


def build_clip_tokenizer(words: set[str] | None = None) -> CLIPTokenizer:
    words = model_words(words) + list(PUNCTUATION)
    pieces, merges = bpe_merges(words)
    # Single letters let any unknown lower-case word still tokenize (to pieces the model never
    # learned) instead of to <|endoftext|>, where CLIP would pool too early.
    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    pieces = sorted(set(pieces) | set(letters) | {letter + "</w>" for letter in letters})
    # Special tokens go last: CLIPTextModel treats eos_token_id == 2 as a legacy checkpoint
    # and pools at argmax(input_ids) instead of at the first end-of-text token.
    vocab = {piece: index for index, piece in enumerate(pieces)}
    for special in ("<|unknown|>", "<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    return CLIPTokenizer(
        vocab=vocab,
        merges=merges,
        unk_token="<|unknown|>",
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=TEXT_LENGTH,
    )


def build_t5_tokenizer(words: set[str] | None = None) -> T5Tokenizer:
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [("\u2581" + word, -1.0) for word in model_words(words)]
    pieces += [(mark, -1.0) for mark in PUNCTUATION]
    # Single letters let any unknown word still tokenize (to pieces the model never learned).
    pieces += [(letter, -10.0) for letter in "abcdefghijklmnopqrstuvwxyz"] + [("\u2581", -10.0)]
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=TEXT_LENGTH)


def build_clip_text_encoder(tokenizer: CLIPTokenizer) -> CLIPTextModel:
    config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=TEXT_WIDTH,
        intermediate_size=TEXT_WIDTH * 2,
        projection_dim=TEXT_WIDTH,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=TEXT_LENGTH,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if config.eos_token_id == 2:
        raise ValueError("CLIP eos_token_id must not be 2 (legacy pooling); reorder the vocabulary")
    return CLIPTextModel(config)


def build_t5_text_encoder(tokenizer: T5Tokenizer) -> T5EncoderModel:
    config = T5Config(
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
    return T5EncoderModel(config)
