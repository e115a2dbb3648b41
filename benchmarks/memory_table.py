"""Which memory plan each model family gets on 24, 16, 12 and 8 GB cards, on paper.

    python benchmarks/memory_table.py            # the table of docs/models.md, with its figures

The models are built on PyTorch's meta device from their released configs (no weights, no
download, under a second): their component sizes in bf16 and in float8 are read exactly as
`--memory auto` reads a loaded model's (pipelines/memory_placement.measure_modules), and
`choose_plan` (pipelines/memory_plan.py) picks as it does at start. What can't be read on paper
is the activations: they are taken as `activation_per_token` below (the loader's own estimate
before it measures: 4 vectors of the denoiser's widest layer input, in bf16), over the engine's
default token limit (8 requests at the default size, room for CFG rows). A card's free memory is
taken as its size less 0.6 GiB (the CUDA context; a desktop's display takes more).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from pipelines.memory_placement import estimated_activation_per_token, measure_modules  # noqa: E402
from pipelines.memory_plan import GIB, ModelBytes, PlanDoesNotFit, choose_plan  # noqa: E402

CARDS_GB = (24, 16, 12, 8)
CONTEXT_GIB = 0.6
BF16 = torch.bfloat16


@dataclass(frozen=True)
class Family:
    name: str
    build: Callable[[], tuple[list, list, list]]  # (denoisers, text encoders, VAEs), on the meta device
    tokens_per_request: int  # rows x latent tokens of one default request
    cfg: bool  # whether its default request has a negative row


def _t5_xxl(vocab: int = 32128):
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(vocab_size=vocab, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                                   feed_forward_proj="gated-gelu", is_encoder_decoder=False))


def _flux_dev():
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from benchmarks.gpu_stand_in import FLUX_DEV_TRANSFORMER

    clip = CLIPTextModel(CLIPTextConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                        num_attention_heads=12, projection_dim=768))
    vae = AutoencoderKL(down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
                        block_out_channels=[128, 256, 512, 512], layers_per_block=2, latent_channels=16)
    return [FluxTransformer2DModel(**FLUX_DEV_TRANSFORMER)], [clip, _t5_xxl()], [vae]


def _wan_14b():
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    umt5 = _t5_xxl(vocab=256384)  # UMT5-XXL: T5-XXL's shapes with a larger vocabulary
    return [WanTransformer3DModel()], [umt5], [AutoencoderKLWan()]  # the defaults are Wan 2.1 14B's


def _qwen_image():
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from transformers import Qwen2Config, Qwen2Model

    # Qwen2.5-VL-7B's language model (what encodes the prompt; its vision tower is 0.7B more).
    text = Qwen2Model(Qwen2Config(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                  num_attention_heads=28, num_key_value_heads=4))
    return [QwenImageTransformer2DModel()], [text], [AutoencoderKLQwenImage()]


FAMILIES = (
    Family("FLUX.1-dev / schnell (1024x1024)", _flux_dev, tokens_per_request=4096, cfg=False),
    Family("Wan 2.1 T2V 14B (832x480, 81 frames)", _wan_14b, tokens_per_request=2 * 21 * 60 * 104 // 4, cfg=True),
    Family("Qwen-Image (1328x1328)", _qwen_image, tokens_per_request=2 * (1328 // 16) ** 2, cfg=True),
)


def model_bytes(family: Family) -> ModelBytes:
    with torch.device("meta"):
        denoisers, text_encoders, vaes = family.build()
    for module in (*denoisers, *text_encoders, *vaes):
        module.to(BF16)
    return measure_modules(denoisers, text_encoders, vaes, estimated_activation_per_token(denoisers, BF16))


def engine_tokens(family: Family) -> int:
    """The engine's default token limit: 8 requests, room for CFG rows (engine/engine.py)."""
    per_row = family.tokens_per_request // (2 if family.cfg else 1)
    return 8 * 2 * per_row


def plan_on(sizes: ModelBytes, family: Family, card_gb: int) -> str:
    free = int((card_gb - CONTEXT_GIB) * GIB)
    try:
        choice = choose_plan(sizes, free, engine_tokens(family), family.tokens_per_request)
    except PlanDoesNotFit:
        return f"does not fit (lowvram needs {sizes.peak('lowvram', family.tokens_per_request) / GIB:.1f} GiB)"
    requests = choice.max_tokens // family.tokens_per_request
    lowered = f", {requests} request{'s' if requests > 1 else ''} a forward" if choice.lowered else ""
    return f"{choice.plan} ({choice.needed / GIB:.1f} GiB{lowered})"


def main() -> None:
    logging.disable(logging.WARNING)  # the meta models' construction notes
    print("| model | weights bf16 (denoiser / text encoders / VAE) | fp8 | " + " | ".join(f"{gb} GB" for gb in CARDS_GB) + " |")
    print("|---|---|---|" + "---|" * len(CARDS_GB))
    for family in FAMILIES:
        sizes = model_bytes(family)
        weights = f"{sizes.denoiser / GIB:.1f} / {sizes.text_encoders / GIB:.1f} / {sizes.vae / GIB:.2f} GiB"
        fp8 = f"{sizes.denoiser_fp8 / GIB:.1f} / {sizes.text_encoders_fp8 / GIB:.1f} GiB"
        cells = [plan_on(sizes, family, gb) for gb in CARDS_GB]
        print(f"| {family.name} | {weights} | {fp8} | " + " | ".join(cells) + " |")
    print(f"\nactivations taken as 4 x the widest layer input x 2 bytes per token; free memory = card - {CONTEXT_GIB} GiB")


if __name__ == "__main__":
    main()
