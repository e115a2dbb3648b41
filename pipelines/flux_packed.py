"""FLUX's transformer over a packed forward (pipelines/packing.py): rows of different image sizes
and prompt lengths in one forward, each row exactly as its own solo forward computes it.

It runs diffusers' own FluxTransformer2DModel modules (every Linear, norm and feed-forward, so
LoRA hooks and compiled kernels see the same layers), in the order of
`FluxTransformer2DModel.forward`, `FluxTransformerBlock.forward`,
`FluxSingleTransformerBlock.forward` and `FluxAttnProcessor`; what differs is only the layout:

- streams are [tokens, dim] (no batch dimension): every row's tokens end to end;
- each AdaLayerNorm's modulation is computed per row from its `temb`, then spread to the row's
  tokens (`Packing.spread`) where diffusers broadcasts it over a row's sequence (`[:, None]`);
- the rotary embedding is computed from the rows' own ids, laid out like the joint sequence;
- attention runs within each row's document (`Packing.attention`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from diffusers.models.embeddings import apply_rotary_emb
from torch import nn

from pipelines.packing import Packing, PackedModel, PackedStreams, TokenScope, no_token_scope


@dataclass(frozen=True)
class FluxRow:
    """One row of a FLUX forward, as FluxTransformer2DModel takes it for a batch of one."""

    latents: torch.Tensor  # [1, image tokens, in_channels] (packed 2x2 latents)
    timestep: torch.Tensor  # scalar, already / 1000 as FluxPipeline passes it
    pooled: torch.Tensor  # [1, pooled_projection_dim]
    embeds: torch.Tensor  # [1, text tokens, joint_attention_dim]
    text_ids: torch.Tensor  # [text tokens, 3]
    image_ids: torch.Tensor  # [image tokens, 3]
    guidance: float | None = None  # embedded guidance (guidance-distilled checkpoints)


def _modulation(norm: nn.Module, temb: torch.Tensor, chunks: int) -> tuple[torch.Tensor, ...]:
    """An AdaLayerNorm's per-row modulation: linear(silu(temb)) cut in `chunks`, each [rows, dim]."""
    return norm.linear(norm.silu(temb)).chunk(chunks, dim=1)


def _rotate(x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """diffusers' own apply_rotary_emb (use_real, unbind -1) for [tokens, heads, dim] with per-token
    cos/sin: the packed stream is its one sequence (bitwise what a stacked forward computes)."""
    return apply_rotary_emb(x.unsqueeze(0), rotary, sequence_dim=1)[0]


def _heads(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x.unflatten(-1, (-1, attn.head_dim))


def joint_attention(attn: nn.Module, image: torch.Tensor, text: torch.Tensor, rotary, packing: Packing,
                    scope: TokenScope) -> tuple[torch.Tensor, torch.Tensor]:
    """FluxAttnProcessor for a double-stream block: (image output, text output)."""
    with scope(packing.image_row):
        query, key, value = (_heads(attn, proj(image)) for proj in (attn.to_q, attn.to_k, attn.to_v))
    with scope(packing.text_row):
        text_q, text_k, text_v = (_heads(attn, proj(text)) for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))
    query, key = attn.norm_q(query), attn.norm_k(key)
    text_q, text_k = attn.norm_added_q(text_q), attn.norm_added_k(text_k)
    query, key, value = (packing.join(t, i) for t, i in ((text_q, query), (text_k, key), (text_v, value)))
    query, key = _rotate(query, rotary), _rotate(key, rotary)
    out = packing.attention(query, key, value).flatten(1, 2).to(query.dtype)
    text_out, image_out = packing.split(out)
    with scope(packing.image_row):
        image_out = attn.to_out[1](attn.to_out[0](image_out.contiguous()))
    with scope(packing.text_row):
        text_out = attn.to_add_out(text_out.contiguous())
    return image_out, text_out


def double_block(block: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                 temb: torch.Tensor, image_rotary_emb, packing: Packing, scope: TokenScope = no_token_scope):
    """FluxTransformerBlock.forward on the packed streams; returns (text stream, image stream)."""
    image, text = hidden_states, encoder_hidden_states
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (
        packing.spread(m, packing.image_row) for m in _modulation(block.norm1, temb, 6))
    c_shift_msa, c_scale_msa, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = (
        packing.spread(m, packing.text_row) for m in _modulation(block.norm1_context, temb, 6))
    norm_image = block.norm1.norm(image) * (1 + scale_msa) + shift_msa
    norm_text = block.norm1_context.norm(text) * (1 + c_scale_msa) + c_shift_msa
    attn_image, attn_text = joint_attention(block.attn, norm_image, norm_text, image_rotary_emb, packing, scope)

    image = image + gate_msa * attn_image
    with scope(packing.image_row):
        image = image + gate_mlp * block.ff(block.norm2(image) * (1 + scale_mlp) + shift_mlp)
    text = text + c_gate_msa * attn_text
    with scope(packing.text_row):
        text = text + c_gate_mlp * block.ff_context(block.norm2_context(text) * (1 + c_scale_mlp) + c_shift_mlp)
    if text.dtype == torch.float16:
        text = text.clip(-65504, 65504)
    return text, image


def single_block(block: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                 temb: torch.Tensor, image_rotary_emb, packing: Packing, scope: TokenScope = no_token_scope):
    """FluxSingleTransformerBlock.forward on the packed streams; returns (text stream, image stream)."""
    joint = packing.join(encoder_hidden_states, hidden_states)
    shift, scale, gate = (packing.spread(m, packing.joint_row) for m in _modulation(block.norm, temb, 3))
    normed = block.norm.norm(joint) * (1 + scale) + shift
    attn = block.attn
    with scope(packing.joint_row):
        mlp = block.act_mlp(block.proj_mlp(normed))
        query, key, value = (_heads(attn, proj(normed)) for proj in (attn.to_q, attn.to_k, attn.to_v))
    query, key = _rotate(attn.norm_q(query), image_rotary_emb), _rotate(attn.norm_k(key), image_rotary_emb)
    attended = packing.attention(query, key, value).flatten(1, 2).to(query.dtype)
    with scope(packing.joint_row):
        joint = joint + gate * block.proj_out(torch.cat([attended, mlp], dim=1))
    if joint.dtype == torch.float16:
        joint = joint.clip(-65504, 65504)
    return packing.split(joint)


def modulated_input(block: nn.Module, values: dict) -> torch.Tensor:
    """The first double block's image tokens after their timestep modulation (TeaCache's signal)."""
    packing = values["packing"]
    shift, scale = (packing.spread(m, packing.image_row) for m in _modulation(block.norm1, values["temb"], 6)[:2])
    return block.norm1.norm(values["hidden_states"]) * (1 + scale) + shift


def packed_inputs(model: nn.Module, rows: Sequence[FluxRow], scope: TokenScope = no_token_scope) -> dict:
    """Everything before the blocks of FluxTransformer2DModel.forward, for the packed rows: the block
    inputs by name (hidden_states, encoder_hidden_states, temb, image_rotary_emb, packing)."""
    device = rows[0].latents.device
    packing = Packing([row.embeds.shape[1] for row in rows], [row.latents.shape[1] for row in rows], device)
    with scope(packing.image_row):
        hidden = model.x_embedder(torch.cat([row.latents[0] for row in rows]))
    timestep = torch.stack([row.timestep for row in rows]).to(hidden.dtype) * 1000
    pooled = torch.cat([row.pooled for row in rows])
    if model.config.guidance_embeds:
        guidance = torch.tensor([row.guidance for row in rows], device=device, dtype=torch.float32)
        temb = model.time_text_embed(timestep, guidance.to(hidden.dtype) * 1000, pooled)
    else:
        temb = model.time_text_embed(timestep, pooled)
    with scope(packing.text_row):
        text = model.context_embedder(torch.cat([row.embeds[0] for row in rows]))
    ids = packing.join(torch.cat([row.text_ids for row in rows]), torch.cat([row.image_ids for row in rows]))
    return {"hidden_states": hidden, "encoder_hidden_states": text, "temb": temb,
            "image_rotary_emb": model.pos_embed(ids), "packing": packing}


def packed_blocks(model: nn.Module, scope: TokenScope = no_token_scope) -> list:
    """Every block of the model as a callable over the packed block inputs, in the order they run."""
    def bound(run, block):
        return lambda **values: run(block, scope=scope, **values)
    return ([bound(double_block, block) for block in model.transformer_blocks]
            + [bound(single_block, block) for block in model.single_transformer_blocks])


def packed_output(model: nn.Module, values: dict, scope: TokenScope = no_token_scope) -> list[torch.Tensor]:
    """FluxTransformer2DModel.forward after its blocks (norm_out, proj_out): one [1, tokens, C] per row."""
    packing, image = values["packing"], values["hidden_states"]
    emb = model.norm_out.linear(model.norm_out.silu(values["temb"]).to(image.dtype))
    scale, shift = (packing.spread(m, packing.image_row) for m in torch.chunk(emb, 2, dim=1))
    image = model.norm_out.norm(image) * (1 + scale) + shift
    with scope(packing.image_row):
        return packing.image_rows(model.proj_out(image))


def run_blocks(blocks: Sequence, values: dict) -> dict:
    """The blocks one after the other (what a step cache replaces by its per-row runner)."""
    for block in blocks:
        values["encoder_hidden_states"], values["hidden_states"] = block(**values)
    return values


def packed_forward(model: nn.Module, rows: Sequence[FluxRow], scope: TokenScope = no_token_scope,
                   blocks_runner=run_blocks) -> list[torch.Tensor]:
    """FluxTransformer2DModel.forward over rows of any sizes: one prediction [1, tokens, C] per row."""
    values = packed_inputs(model, rows, scope)
    values = blocks_runner(packed_blocks(model, scope), values)
    return packed_output(model, values, scope)


FLUX = PackedModel(forward=packed_forward, run_blocks=run_blocks, modulated_input=modulated_input,
                   first_block=lambda model: model.transformer_blocks[0], streams=PackedStreams())
