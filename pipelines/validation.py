"""Model-specific checks every family makes, with one wording for their errors.

Each rule raises a ParamError naming the GenerationParams field it is about. The rules on one
value (`check_side`, `check_still_frames`, ...) are also what the workflow compiler calls to
check a node's value against a loaded model before anything runs.
"""

from __future__ import annotations

from pipelines.errors import ParamError
from pipelines.params import GenerationParams


def check_scheduler_name(field_name: str, name: str, offered: tuple[str, ...]) -> None:
    if name not in offered:
        raise ParamError(
            field_name,
            f"{field_name}={name!r} is not a noise scheduler this model offers; "
            f"allowed are: {', '.join(offered)} (or leave it unset for the default).",
        )


def check_side(name: str, value: int, model: str, size_multiple: int) -> None:
    """A width or height the model's latents divide evenly."""
    if value % size_multiple:
        lower = max(size_multiple, value - value % size_multiple)
        raise ParamError(
            name,
            f"{name}={value} is not allowed: {model} needs a multiple of {size_multiple} "
            f"(e.g. {lower} or {lower + size_multiple}).",
        )


def check_still_frames(frames: int, model: str) -> None:
    if frames != 1:
        raise ParamError("num_frames", f"num_frames={frames} is not allowed: {model} makes still images, use 1.")


def check_frame_count(frames: int, model: str, temporal_factor: int) -> None:
    """A frame count the temporal VAE takes: k * factor + 1."""
    if (frames - 1) % temporal_factor:
        lower = frames - (frames - 1) % temporal_factor
        examples = ", ".join(str(k * temporal_factor + 1) for k in range(4))
        raise ParamError(
            "num_frames",
            f"num_frames={frames} is not allowed: {model} needs {temporal_factor}k+1 frames "
            f"({examples}, ...; e.g. {lower} or {lower + temporal_factor}).",
        )


def check_size_in(width: int, height: int, name: str, sizes: tuple[tuple[int, int], ...]) -> None:
    """The model's card names the only sizes it makes well: refuse the others, naming them."""
    if sizes and (width, height) not in sizes:
        allowed = ", ".join(f"{w}x{h}" for w, h in sizes)
        raise ParamError("width", f"width={width}, height={height} is not a size {name} makes: "
                                  f"allowed {'sizes are' if len(sizes) > 1 else 'is'} {allowed}.")


def check_frame_count_in(frames: int, model: str, counts: tuple[int, ...]) -> None:
    """The video model's card names the only frame counts it makes well: refuse the others, naming them."""
    if counts and frames not in counts:
        raise ParamError("num_frames", f"num_frames={frames} is not a length {model} makes: allowed "
                                       f"{'are' if len(counts) > 1 else 'is'} {', '.join(map(str, counts))}.")


def check_side_in(name: str, value: int, model: str, size_range: tuple[int, int] | None, size_multiple: int) -> None:
    """A width or height within the model's card's range (PipelineInfo.size_range)."""
    if size_range is not None and not size_range[0] <= value <= size_range[1]:
        low, high = size_range
        raise ParamError(name, f"{name}={value} is not a size {model} makes: each side from {low} to {high} "
                               f"pixels, in steps of {size_multiple}.")


def check_model_name(model: str, loaded: tuple[str, ...]) -> None:
    if model not in loaded:
        raise ParamError("model", f"model={model!r:.60} is not loaded here; the loaded models are: "
                                  f"{', '.join(loaded)}.")


def check_image_params(params: GenerationParams, model: str, size_multiple: int, schedulers: tuple[str, ...]) -> None:
    """Width/height multiples, a single frame, and a scheduler the model offers."""
    check_size_and_scheduler(params, model, size_multiple, schedulers)
    check_still_frames(params.num_frames, model)


def check_video_params(
    params: GenerationParams, model: str, size_multiple: int, schedulers: tuple[str, ...], temporal_factor: int
) -> None:
    """Width/height multiples, a frame count the temporal VAE takes (k * factor + 1), a scheduler."""
    check_size_and_scheduler(params, model, size_multiple, schedulers)
    check_frame_count(params.num_frames, model, temporal_factor)


def check_size_and_scheduler(
    params: GenerationParams, model: str, size_multiple: int, schedulers: tuple[str, ...]
) -> None:
    for name in ("width", "height"):
        check_side(name, getattr(params, name), model, size_multiple)
    if params.scheduler is not None:
        check_scheduler_name("scheduler", params.scheduler, schedulers)


def check_image_inputs(params: GenerationParams, name: str, image_inputs: tuple[str, ...]) -> None:
    """Image fields the model takes (PipelineInfo.image_inputs), and a strength that runs a step."""
    for field_name in ("init_image", "mask_image"):
        if getattr(params, field_name) is not None and field_name not in image_inputs:
            takes = f"it takes {', '.join(image_inputs)}" if image_inputs else "it makes media from text only"
            raise ParamError(field_name, f"{name} does not take {field_name}: {takes}.")
    if params.init_image is not None and params.denoise_steps is not None and params.denoise_steps < 1:
        raise ParamError(
            "strength",
            f"strength={params.strength} with num_inference_steps={params.num_inference_steps} runs no denoise "
            "step: raise the strength or the steps (steps x strength is the number of steps that run).",
        )


def check_step_cache(params: GenerationParams, name: str, supported: bool) -> None:
    """A request may ask for step caching only from a model that caches steps (PipelineInfo.step_cache)."""
    if params.step_cache and not supported:
        raise ParamError("step_cache", f"step_cache={params.step_cache:g}: {name} does not cache steps "
                                       "(FLUX and Wan models do); send 0 or leave it out.")


def check_supported_size(params: GenerationParams, name: str, sizes: tuple[tuple[int, int], ...],
                         size_range: tuple[int, int] | None = None, size_multiple: int = 1,
                         frame_counts: tuple[int, ...] = ()) -> None:
    """The model's card names the only sizes (and frame counts) it makes well, or the range of its
    sides: refuse the others, naming what it makes."""
    check_size_in(params.width, params.height, name, sizes)
    check_frame_count_in(params.num_frames, name, frame_counts)
    for field_name in ("width", "height"):
        check_side_in(field_name, getattr(params, field_name), name, size_range, size_multiple)
