"""Draw a captioned grid of the built-in model's images (its serving defaults, stock FluxPipeline).

    python -m tools.contact_sheet --model assets/shapes-flux --out assets/shapes-flux/contact_sheet.png
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from tools.evaluate_builtin import generate, load_serving_defaults, score_image
from tools.shapes_world import example_prompts, parse_caption

TILE = 192  # 64 px images shown 3x, nearest-neighbour, so single pixels stay visible
CAPTION_HEIGHT = 58
COLUMNS = 4


def caption_lines(prompt: str, verdict: dict[str, bool]) -> list[str]:
    misses = [attribute for attribute, correct in verdict.items() if not correct]
    return textwrap.wrap(prompt, width=30) + [("wrong: " + ", ".join(misses)) if misses else "all attributes right"]


def contact_sheet(prompts: list[str], images: list[Image.Image]) -> Image.Image:
    rows = (len(images) + COLUMNS - 1) // COLUMNS
    sheet = Image.new("RGB", (COLUMNS * TILE, rows * (TILE + CAPTION_HEIGHT)), "white")
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    for index, (prompt, image) in enumerate(zip(prompts, images)):
        x = (index % COLUMNS) * TILE
        y = (index // COLUMNS) * (TILE + CAPTION_HEIGHT)
        sheet.paste(image.resize((TILE, TILE), Image.Resampling.NEAREST), (x, y))
        verdict = score_image(parse_caption(prompt), image)
        for line_number, line in enumerate(caption_lines(prompt, verdict)):
            color = "black" if line_number < 2 or all(verdict.values()) else "firebrick"
            draw.text((x + 4, y + TILE + 3 + 13 * line_number), line, fill=color, font=font)
    return sheet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("assets/shapes-flux"))
    parser.add_argument("--out", type=Path, default=None, help="default: <model>/contact_sheet.png")
    parser.add_argument("--count", type=int, default=16)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()

    import torch
    from diffusers import FluxPipeline

    torch.set_num_threads(2)
    defaults = load_serving_defaults(args.model)
    pipe = FluxPipeline.from_pretrained(args.model, use_safetensors=True)
    pipe.set_progress_bar_config(disable=True)
    prompts = example_prompts(args.count, seed=args.seed)
    images = generate(
        pipe, prompts, defaults, defaults["num_inference_steps"], defaults["guidance_scale"], args.seed, batch=8
    )
    out = args.out or args.model / "contact_sheet.png"
    contact_sheet(prompts, images).save(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
