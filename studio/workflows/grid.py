"""Draw an X/Y plot: the branch images of a grid layout, with the swept values as axis labels.

Cells whose branch has no image yet show a grey placeholder with the branch's state, so the
grid can be drawn again each time a branch finishes and fills in as the run goes.
"""

from __future__ import annotations

from typing import Mapping

from PIL import Image, ImageDraw, ImageFont

from studio.workflows.compiler import GridLayout

CELL_MIN_PX = 128  # small images are enlarged (nearest neighbour) so labels stay readable
PAD = 4
LABEL_PX = 12
BACKGROUND = (255, 255, 255)
PLACEHOLDER = (222, 222, 222)
INK = (20, 20, 20)


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: one bitmap size only
        return ImageFont.load_default()


def _text_width(draw: ImageDraw.ImageDraw, text: str, font) -> int:
    left, _, right, _ = draw.textbbox((0, 0), text, font=font)
    return right - left


def _fit(draw: ImageDraw.ImageDraw, text: str, font, width: int) -> str:
    """Shorten `text` with an ellipsis until it fits in `width` pixels."""
    if _text_width(draw, text, font) <= width:
        return text
    while text and _text_width(draw, text + "…", font) > width:
        text = text[:-1]
    return text + "…"


def cell_size(images: Mapping[int, Image.Image]) -> tuple[int, int]:
    """The size of one cell: the largest image, scaled up by a whole factor to at least CELL_MIN_PX."""
    if not images:
        return CELL_MIN_PX, CELL_MIN_PX
    width = max(image.width for image in images.values())
    height = max(image.height for image in images.values())
    factor = max(1, -(-CELL_MIN_PX // max(width, height)))
    return width * factor, height * factor


def render_grid(layout: GridLayout, images: Mapping[int, Image.Image], states: Mapping[int, str] | None = None) -> Image.Image:
    """The grid as one RGB image. `images`: branch index -> finished image; `states`: branch
    index -> a word shown on cells without an image ("queued", "running 3/20", "aborted")."""
    states = states or {}
    cell_w, cell_h = cell_size(images)
    font = _font(LABEL_PX)
    scratch = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    row_label_w = min(180, max([_text_width(scratch, r, font) for r in layout.rows] + [0]) + 2 * PAD)
    if not any(layout.rows):
        row_label_w = 0
    header_h = LABEL_PX + 2 * PAD
    title_h = LABEL_PX + 2 * PAD
    width = row_label_w + len(layout.columns) * (cell_w + PAD) + PAD
    height = title_h + header_h + len(layout.rows) * (cell_h + PAD) + PAD
    canvas = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(canvas)

    title = f"X: {layout.x_axis or '-'}    Y: {layout.y_axis or '-'}"
    draw.text((PAD, PAD), _fit(draw, title, font, width - 2 * PAD), fill=INK, font=font)
    for col, label in enumerate(layout.columns):
        x = row_label_w + PAD + col * (cell_w + PAD)
        text = _fit(draw, label, font, cell_w)
        draw.text((x + (cell_w - _text_width(draw, text, font)) // 2, title_h + PAD), text, fill=INK, font=font)
    for row, label in enumerate(layout.rows):
        y = title_h + header_h + row * (cell_h + PAD)
        if row_label_w:
            text = _fit(draw, label, font, row_label_w - 2 * PAD)
            draw.text((PAD, y + (cell_h - LABEL_PX) // 2), text, fill=INK, font=font)
        for col, branch in enumerate(layout.cells[row]):
            x = row_label_w + PAD + col * (cell_w + PAD)
            image = images.get(branch) if branch is not None else None
            if image is not None:
                canvas.paste(image.convert("RGB").resize((cell_w, cell_h), Image.NEAREST), (x, y))
                continue
            draw.rectangle((x, y, x + cell_w - 1, y + cell_h - 1), fill=PLACEHOLDER)
            word = _fit(draw, states.get(branch, "") if branch is not None else "", font, cell_w - 2 * PAD)
            draw.text((x + PAD, y + (cell_h - LABEL_PX) // 2), word, fill=INK, font=font)
    return canvas
