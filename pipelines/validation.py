"""Model-specific checks every family makes, with one wording for their errors."""

from __future__ import annotations

from pipelines.params import GenerationParams


def check_scheduler_name(field_name: str, name: str, offered: tuple[str, ...]) -> None:
    if name not in offered:
        raise ValueError(
            f"{field_name}={name!r} is not a noise scheduler this model offers; "
            f"allowed are: {', '.join(offered)} (or leave it unset for the default)."
        )


def check_image_params(params: GenerationParams, model: str, size_multiple: int, schedulers: tuple[str, ...]) -> None:
    """Width/height multiples, a single frame, and a scheduler the model offers."""
    check_size_and_scheduler(params, model, size_multiple, schedulers)
    if params.num_frames != 1:
        raise ValueError(f"num_frames={params.num_frames} is not allowed: {model} makes still images, use 1.")


def check_video_params(
    params: GenerationParams, model: str, size_multiple: int, schedulers: tuple[str, ...], temporal_factor: int
) -> None:
    """Width/height multiples, a frame count the temporal VAE takes (k * factor + 1), a scheduler."""
    check_size_and_scheduler(params, model, size_multiple, schedulers)
    frames = params.num_frames
    if (frames - 1) % temporal_factor:
        lower = frames - (frames - 1) % temporal_factor
        examples = ", ".join(str(k * temporal_factor + 1) for k in range(4))
        raise ValueError(
            f"num_frames={frames} is not allowed: {model} needs {temporal_factor}k+1 frames "
            f"({examples}, ...; e.g. {lower} or {lower + temporal_factor})."
        )


def check_size_and_scheduler(
    params: GenerationParams, model: str, size_multiple: int, schedulers: tuple[str, ...]
) -> None:
    for name in ("width", "height"):
        value = getattr(params, name)
        if value % size_multiple:
            lower = max(size_multiple, value - value % size_multiple)
            raise ValueError(
                f"{name}={value} is not allowed: {model} needs a multiple of {size_multiple} "
                f"(e.g. {lower} or {lower + size_multiple})."
            )
    if params.scheduler is not None:
        check_scheduler_name("scheduler", params.scheduler, schedulers)


def check_supported_size(params: GenerationParams, name: str, sizes: tuple[tuple[int, int], ...]) -> None:
    """The model's card names the only sizes it makes well: refuse the others, naming them."""
    if sizes and (params.width, params.height) not in sizes:
        allowed = ", ".join(f"{w}x{h}" for w, h in sizes)
        raise ValueError(f"width={params.width}, height={params.height} is not a size {name} makes: "
                         f"allowed {'sizes are' if len(sizes) > 1 else 'is'} {allowed}.")
