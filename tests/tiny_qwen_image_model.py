"""A tiny random-weight Qwen-Image checkpoint, built offline in about a second.

The transformer and VAE configs follow diffusers' own fast tests; the Qwen2.5-VL text
encoder is a 2-layer, 16-wide model, and its tokenizer a byte-level BPE built in memory
(all 256 byte symbols, no merges, plus the chat-template special tokens), so nothing is
downloaded. The scheduler uses Qwen-Image's real settings (dynamic, exponential shifting).
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import (
    AutoencoderKLQwenImage,
    FlowMatchEulerDiscreteScheduler,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
)
from tokenizers import pre_tokenizers
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 300  # 256 byte symbols + the special tokens, rounded up
HIDDEN = 16


def tiny_qwen_tokenizer() -> Qwen2Tokenizer:
    vocab = {symbol: index for index, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for token in SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None)
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[1:])})
    return tokenizer


def tiny_qwen_text_encoder(tokenizer: Qwen2Tokenizer) -> Qwen2_5_VLForConditionalGeneration:
    pad, _, im_end = tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS))
    # Vision token ids are unused by text-only prompts; they just have to fit the vocabulary.
    config = Qwen2_5_VLConfig(
        text_config={
            "hidden_size": HIDDEN,
            "intermediate_size": HIDDEN,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
            "rope_theta": 1000000.0,
            "vocab_size": VOCAB_SIZE,
            "bos_token_id": pad,
            "eos_token_id": im_end,
            "pad_token_id": pad,
        },
        vision_config={"depth": 2, "hidden_size": HIDDEN, "intermediate_size": HIDDEN, "num_heads": 2,
                       "out_hidden_size": HIDDEN},
        hidden_size=HIDDEN,
        vocab_size=VOCAB_SIZE,
        bos_token_id=pad,
        eos_token_id=im_end,
        pad_token_id=pad,
        vision_start_token_id=VOCAB_SIZE - 4,
        vision_end_token_id=VOCAB_SIZE - 3,
        vision_token_id=VOCAB_SIZE - 2,
        image_token_id=VOCAB_SIZE - 1,
        video_token_id=VOCAB_SIZE - 5,
    )
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def build_tiny_qwen_image(folder: Path) -> Path:
    torch.manual_seed(0)
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=3,
        joint_attention_dim=HIDDEN,
        guidance_embeds=False,
        axes_dims_rope=(8, 4, 4),
    )
    torch.manual_seed(0)
    z_dim = 4
    vae = AutoencoderKLQwenImage(
        base_dim=z_dim * 6,
        z_dim=z_dim,
        dim_mult=[1, 2, 4],
        num_res_blocks=1,
        temperal_downsample=[False, True],
        latents_mean=[0.1, -0.2, 0.3, 0.0],  # not the identity, so the normalisation is exercised
        latents_std=[1.5, 0.8, 1.2, 1.0],
    )
    scheduler = FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=256,
        base_shift=0.5,
        max_image_seq_len=8192,
        max_shift=0.9,
        shift=1.0,
        shift_terminal=0.02,
        time_shift_type="exponential",
        use_dynamic_shifting=True,
    )
    torch.manual_seed(0)
    tokenizer = tiny_qwen_tokenizer()
    pipeline = QwenImagePipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=tiny_qwen_text_encoder(tokenizer),
        tokenizer=tokenizer,
        transformer=transformer,
    )
    pipeline.save_pretrained(folder, safe_serialization=True)
    return Path(folder)
