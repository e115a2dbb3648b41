"""Wan's transformer over a packed forward (pipelines/packing.py): videos of different sizes and
frame counts (and prompts of different lengths) in one forward, each row exactly as its own solo
forward computes it.

It runs diffusers' own WanTransformer3DModel modules in the order of `WanTransformer3DModel.forward`,
`WanTransformerBlock.forward` and `WanAttnProcessor` (text-to-video: no image context); what differs
is only the layout:

- the video tokens of every row end to end ([tokens, dim]), each row patchified on its own grid;
  the text tokens likewise, in their own stream (Wan reads text through cross-attention only);
- each block's modulation (its scale-shift table plus the row's timestep projection) is computed
  per row, then spread to the row's video tokens;
- self-attention within each row's video tokens; cross-attention from each row's video tokens to
  that row's text tokens (`segment_attention`);
- the rotary embedding is each row's own (its grid), in the layout of the video stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from pipelines.packing import (
    PackedModel,
    PackedStreams,
    Packing,
    TokenScope,
    no_token_scope,
    segment_attention,
)


@dataclass(frozen=True)
class WanRow:
    """One row of a Wan forward, as WanTransformer3DModel takes it for a batch of one."""

    latents: torch.Tensor  # [1, channels, latent frames, height, width], in the transformer's dtype
    timestep: torch.Tensor  # scalar
    text: torch.Tensor  # [1, text tokens, text_dim]


def packs(model: nn.Module) -> bool:
    """Whether `model` can run packed: stock text-to-video attention, unfused, one timestep per row."""
    attentions = [m for m in model.modules() if hasattr(m, "processor")]
    return all(type(m.processor).__name__ == "WanAttnProcessor" and getattr(m, "add_k_proj", None) is None
               and not getattr(m, "fused_projections", False) for m in attentions)


def _rotate(x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """WanAttnProcessor's apply_rotary_emb for [tokens, heads, dim], per-token cos/sin (the same
    operations, so the same bits)."""
    freqs_cos, freqs_sin = rotary
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = freqs_cos[:, None, 0::2], freqs_sin[:, None, 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out


def _heads(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x.unflatten(1, (attn.heads, -1))


def self_attention(attn: nn.Module, video: torch.Tensor, rotary, packing: Packing, scope: TokenScope) -> torch.Tensor:
    with scope(packing.image_row):
        query, key, value = attn.to_q(video), attn.to_k(video), attn.to_v(video)
    query, key, value = _heads(attn, attn.norm_q(query)), _heads(attn, attn.norm_k(key)), _heads(attn, value)
    query, key = _rotate(query, rotary), _rotate(key, rotary)
    out = segment_attention(query, key, value, packing.image_lengths, packing.image_lengths).flatten(1, 2)
    with scope(packing.image_row):
        return attn.to_out[1](attn.to_out[0](out.type_as(query)))


def cross_attention(attn: nn.Module, video: torch.Tensor, text: torch.Tensor, packing: Packing,
                    scope: TokenScope) -> torch.Tensor:
    with scope(packing.image_row):
        query = attn.to_q(video)
    with scope(packing.text_row):
        key, value = attn.to_k(text), attn.to_v(text)
    query, key, value = _heads(attn, attn.norm_q(query)), _heads(attn, attn.norm_k(key)), _heads(attn, value)
    out = segment_attention(query, key, value, packing.image_lengths, packing.text_lengths).flatten(1, 2)
    with scope(packing.image_row):
        return attn.to_out[1](attn.to_out[0](out.type_as(query)))


def _block_modulation(block: nn.Module, temb: torch.Tensor, packing: Packing) -> tuple[torch.Tensor, ...]:
    """The block's six modulations (shift, scale, gate; then the feed-forward's), per video token."""
    return tuple(packing.spread(m[:, 0], packing.image_row) for m in (block.scale_shift_table + temb.float()).chunk(6, dim=1))


def block_forward(block: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                  temb: torch.Tensor, rotary_emb, packing: Packing, scope: TokenScope = no_token_scope) -> torch.Tensor:
    """WanTransformerBlock.forward on the packed streams; returns the video stream."""
    video = hidden_states
    shift, scale, gate, c_shift, c_scale, c_gate = _block_modulation(block, temb, packing)
    normed = (block.norm1(video.float()) * (1 + scale) + shift).type_as(video)
    video = (video.float() + self_attention(block.attn1, normed, rotary_emb, packing, scope) * gate).type_as(video)
    normed = block.norm2(video.float()).type_as(video)
    video = video + cross_attention(block.attn2, normed, encoder_hidden_states, packing, scope)
    normed = (block.norm3(video.float()) * (1 + c_scale) + c_shift).type_as(video)
    with scope(packing.image_row):
        feed_forward = block.ffn(normed)
    return (video.float() + feed_forward.float() * c_gate).type_as(video)


def modulated_input(block: nn.Module, values: dict) -> torch.Tensor:
    """The first block's video tokens after their timestep modulation (TeaCache's signal)."""
    shift, scale = _block_modulation(block, values["temb"], values["packing"])[:2]
    return block.norm1(values["hidden_states"].float()) * (1 + scale) + shift


def packed_inputs(model: nn.Module, rows: Sequence[WanRow], scope: TokenScope = no_token_scope) -> tuple[dict, torch.Tensor]:
    """Everything before the blocks of WanTransformer3DModel.forward, for the packed rows: the block
    inputs by name (hidden_states, encoder_hidden_states, temb, rotary_emb, packing), and the
    rows' time embedding for the output norm."""
    videos, cosines, sines = [], [], []
    for row in rows:
        cos, sin = model.rope(row.latents)  # [1, tokens, 1, dim], the row's own grid
        cosines.append(cos[0, :, 0])
        sines.append(sin[0, :, 0])
        videos.append(model.patch_embedding(row.latents).flatten(2).transpose(1, 2)[0])
    packing = Packing([row.text.shape[1] for row in rows], [len(video) for video in videos], videos[0].device)
    hidden = torch.cat(videos).contiguous()
    embedder = model.condition_embedder
    with scope(packing.text_row):
        text = embedder.text_embedder(torch.cat([row.text[0] for row in rows]))
    timestep = embedder.timesteps_proj(torch.stack([row.timestep for row in rows]))
    time_dtype = next(iter(embedder.time_embedder.parameters())).dtype
    if timestep.dtype != time_dtype and time_dtype != torch.int8:
        timestep = timestep.to(time_dtype)
    temb = embedder.time_embedder(timestep).type_as(text)
    projection = embedder.time_proj(embedder.act_fn(temb)).unflatten(1, (6, -1))
    values = {"hidden_states": hidden, "encoder_hidden_states": text, "temb": projection,
              "rotary_emb": (torch.cat(cosines), torch.cat(sines)), "packing": packing}
    return values, temb


def packed_blocks(model: nn.Module, scope: TokenScope = no_token_scope) -> list:
    def bound(block):
        return lambda **values: block_forward(block, scope=scope, **values)
    return [bound(block) for block in model.blocks]


def run_blocks(blocks: Sequence, values: dict) -> dict:
    for block in blocks:
        values["hidden_states"] = block(**values)
    return values


def packed_output(model: nn.Module, rows: Sequence[WanRow], values: dict, temb: torch.Tensor,
                  scope: TokenScope = no_token_scope) -> list[torch.Tensor]:
    """WanTransformer3DModel.forward after its blocks: one [1, C, frames, height, width] per row."""
    packing, video = values["packing"], values["hidden_states"]
    shift, scale = (packing.spread(m[:, 0], packing.image_row)
                    for m in (model.scale_shift_table.to(temb.device) + temb.unsqueeze(1)).chunk(2, dim=1))
    video = (model.norm_out(video.float()) * (1 + scale) + shift).type_as(video)
    with scope(packing.image_row):
        video = model.proj_out(video)
    p_t, p_h, p_w = model.config.patch_size
    outputs = []
    for row, tokens in zip(rows, video.split(packing.image_lengths)):
        _, _, frames, height, width = row.latents.shape
        tokens = tokens.reshape(1, frames // p_t, height // p_h, width // p_w, p_t, p_h, p_w, -1)
        outputs.append(tokens.permute(0, 7, 1, 4, 2, 5, 3, 6).flatten(6, 7).flatten(4, 5).flatten(2, 3))
    return outputs


def packed_forward(model: nn.Module, rows: Sequence[WanRow], scope: TokenScope = no_token_scope,
                   blocks_runner=run_blocks) -> list[torch.Tensor]:
    """WanTransformer3DModel.forward over videos of any sizes and frame counts: one prediction per row."""
    values, temb = packed_inputs(model, rows, scope)
    values = blocks_runner(packed_blocks(model, scope), values)
    return packed_output(model, rows, values, temb, scope)


WAN = PackedModel(forward=packed_forward, run_blocks=run_blocks, modulated_input=modulated_input,
                  first_block=lambda model: model.blocks[0],
                  streams=PackedStreams(per_joint_token=(), per_image_token=("rotary_emb",)))
