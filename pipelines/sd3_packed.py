"""Stable Diffusion 3 / 3.5's transformer over a packed forward (pipelines/packing.py): images of
different sizes in one forward, each row as its own solo forward computes it.

It runs diffusers' own SD3Transformer2DModel modules in the order of `SD3Transformer2DModel.forward`,
`JointTransformerBlock.forward` and `JointAttnProcessor2_0`; what differs is only the layout:

- each row is patchified with its own positional embedding (PatchEmbed crops the embedding to the
  row's size); the image tokens of every row end to end, the text tokens likewise;
- each AdaLayerNorm's modulation is computed per row and spread to that row's tokens;
- joint attention within each row's document (its text tokens, then its image tokens: SD3 has no
  rotary positions, so the order inside a document changes nothing but the summation order);
- SD3.5's second, image-only attention (`use_dual_attention`) within each row's image tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from pipelines.packing import PackedModel, PackedStreams, Packing, TokenScope, no_token_scope, segment_attention


@dataclass(frozen=True)
class SD3Row:
    latents: torch.Tensor  # [1, channels, height, width]
    timestep: torch.Tensor  # scalar, on the scheduler's 0..1000 scale
    embeds: torch.Tensor  # [1, text tokens, joint_attention_dim]
    pooled: torch.Tensor  # [1, pooled_projection_dim]


def packs(model: nn.Module) -> bool:
    attentions = [m for m in model.modules() if hasattr(m, "processor")]
    return all(type(m.processor).__name__ == "JointAttnProcessor2_0" and not getattr(m, "fused_projections", False)
               for m in attentions) and all(block._chunk_size is None for block in model.transformer_blocks)


def _heads(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x.unflatten(1, (attn.heads, -1))


def _normed(norm: nn.Module | None, x: torch.Tensor) -> torch.Tensor:
    return x if norm is None else norm(x)


def joint_attention(attn: nn.Module, image: torch.Tensor, text: torch.Tensor, packing: Packing, scope: TokenScope):
    """JointAttnProcessor2_0 with a text stream: (image output, text output or None when the
    block's context is pre-only)."""
    with scope(packing.image_row):
        query, key, value = (_heads(attn, proj(image)) for proj in (attn.to_q, attn.to_k, attn.to_v))
    with scope(packing.text_row):
        text_q, text_k, text_v = (_heads(attn, proj(text)) for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))
    query, key = _normed(attn.norm_q, query), _normed(attn.norm_k, key)
    text_q, text_k = _normed(attn.norm_added_q, text_q), _normed(attn.norm_added_k, text_k)
    query, key, value = (packing.join(t, i) for t, i in ((text_q, query), (text_k, key), (text_v, value)))
    out = packing.attention(query, key, value).flatten(1, 2).to(query.dtype)
    text_out, image_out = packing.split(out)
    with scope(packing.image_row):
        image_out = attn.to_out[1](attn.to_out[0](image_out))
    if attn.context_pre_only:
        return image_out, None
    with scope(packing.text_row):
        return image_out, attn.to_add_out(text_out)


def image_attention(attn: nn.Module, image: torch.Tensor, packing: Packing, scope: TokenScope) -> torch.Tensor:
    """JointAttnProcessor2_0 without a text stream (SD3.5's attn2): within each row's image tokens."""
    with scope(packing.image_row):
        query, key, value = (_heads(attn, proj(image)) for proj in (attn.to_q, attn.to_k, attn.to_v))
    query, key = _normed(attn.norm_q, query), _normed(attn.norm_k, key)
    out = segment_attention(query, key, value, packing.image_lengths, packing.image_lengths).flatten(1, 2)
    with scope(packing.image_row):
        return attn.to_out[1](attn.to_out[0](out.to(query.dtype)))


def _spread(norm_linear_out: torch.Tensor, chunks: int, token_rows: torch.Tensor, packing: Packing):
    return tuple(packing.spread(m, token_rows) for m in norm_linear_out.chunk(chunks, dim=1))


def block_forward(block: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                  temb: torch.Tensor, packing: Packing, scope: TokenScope = no_token_scope):
    """JointTransformerBlock.forward on the packed streams: (text stream or None, image stream)."""
    image, text = hidden_states, encoder_hidden_states
    emb = block.norm1.linear(block.norm1.silu(temb))
    normed_image = block.norm1.norm(image)
    if block.use_dual_attention:
        (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp, shift_msa2, scale_msa2,
         gate_msa2) = _spread(emb, 9, packing.image_row, packing)
        norm_image2 = normed_image * (1 + scale_msa2) + shift_msa2
    else:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = _spread(emb, 6, packing.image_row, packing)
    norm_image = normed_image * (1 + scale_msa) + shift_msa
    context = block.norm1_context
    if block.context_pre_only:  # AdaLayerNormContinuous: scale, then shift
        c_scale, c_shift = _spread(context.linear(context.silu(temb).to(text.dtype)), 2, packing.text_row, packing)
    else:
        c_shift, c_scale, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = _spread(
            context.linear(context.silu(temb)), 6, packing.text_row, packing)
    norm_text = context.norm(text) * (1 + c_scale) + c_shift
    attn_image, attn_text = joint_attention(block.attn, norm_image, norm_text, packing, scope)
    image = image + gate_msa * attn_image
    if block.use_dual_attention:
        image = image + gate_msa2 * image_attention(block.attn2, norm_image2, packing, scope)
    with scope(packing.image_row):
        image = image + gate_mlp * block.ff(block.norm2(image) * (1 + scale_mlp) + shift_mlp)
    if block.context_pre_only:
        return None, image
    text = text + c_gate_msa * attn_text
    with scope(packing.text_row):
        text = text + c_gate_mlp * block.ff_context(block.norm2_context(text) * (1 + c_scale_mlp) + c_shift_mlp)
    return text, image


def packed_inputs(model: nn.Module, rows: Sequence[SD3Row], scope: TokenScope = no_token_scope) -> dict:
    images = [model.pos_embed(row.latents)[0] for row in rows]  # each row's patches and positions
    packing = Packing([row.embeds.shape[1] for row in rows], [len(image) for image in images], images[0].device)
    temb = model.time_text_embed(torch.stack([row.timestep for row in rows]), torch.cat([row.pooled for row in rows]))
    with scope(packing.text_row):
        text = model.context_embedder(torch.cat([row.embeds[0] for row in rows]))
    return {"hidden_states": torch.cat(images).contiguous(), "encoder_hidden_states": text, "temb": temb,
            "packing": packing}


def packed_blocks(model: nn.Module, scope: TokenScope = no_token_scope) -> list:
    def bound(block):
        return lambda **values: block_forward(block, scope=scope, **values)
    return [bound(block) for block in model.transformer_blocks]


def run_blocks(blocks: Sequence, values: dict) -> dict:
    for block in blocks:
        values["encoder_hidden_states"], values["hidden_states"] = block(**values)
    return values


def packed_output(model: nn.Module, rows: Sequence[SD3Row], values: dict, scope: TokenScope = no_token_scope):
    """SD3Transformer2DModel.forward after its blocks: one [1, C, height, width] per row."""
    packing, image = values["packing"], values["hidden_states"]
    norm = model.norm_out
    scale, shift = _spread(norm.linear(norm.silu(values["temb"]).to(image.dtype)), 2, packing.image_row, packing)
    image = norm.norm(image) * (1 + scale) + shift
    with scope(packing.image_row):
        image = model.proj_out(image)
    patch = model.config.patch_size
    outputs = []
    for row, tokens in zip(rows, image.split(packing.image_lengths)):
        height, width = row.latents.shape[2] // patch, row.latents.shape[3] // patch
        tokens = torch.einsum("nhwpqc->nchpwq", tokens.reshape(1, height, width, patch, patch, model.out_channels))
        outputs.append(tokens.reshape(1, model.out_channels, height * patch, width * patch))
    return outputs


def packed_forward(model: nn.Module, rows: Sequence[SD3Row], scope: TokenScope = no_token_scope,
                   blocks_runner=run_blocks) -> list[torch.Tensor]:
    values = packed_inputs(model, rows, scope)
    values = blocks_runner(packed_blocks(model, scope), values)
    return packed_output(model, rows, values, scope)


SD3 = PackedModel(forward=packed_forward, run_blocks=run_blocks, modulated_input=None,
                  first_block=lambda model: model.transformer_blocks[0], streams=PackedStreams(per_joint_token=()))
