"""Load a model by name, folder or hub id and wrap it in the step pipeline of its family.

The family is chosen from `model_index.json`'s `_class_name`. Weights load with
`use_safetensors=True` only: a checkpoint is never unpickled.
"""

from __future__ import annotations

import importlib
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from pipelines.interface import StepPipeline
from pipelines.lora_files import BUILTIN_LORA_DIR, DEFAULT_LORA_DIR, LoraOption, adapter_files, check_lora_models
from pipelines.prompt_cache import DEFAULT_CAPACITY
from pipelines.quiet_loading import quiet_libraries

log = logging.getLogger(__name__)

# diffusers pipeline class -> "module:class" of our step pipeline for that family.
FAMILIES: dict[str, str] = {
    "FluxPipeline": "pipelines.flux:FluxStepPipeline",
    "StableDiffusion3Pipeline": "pipelines.sd3:SD3StepPipeline",
    "StableDiffusionPipeline": "pipelines.stable_diffusion:StableDiffusionStepPipeline",
    "StableDiffusionXLPipeline": "pipelines.sdxl:StableDiffusionXLStepPipeline",
    "QwenImagePipeline": "pipelines.qwen_image:QwenImageStepPipeline",
    "WanPipeline": "pipelines.wan:WanStepPipeline",
}

BUILTIN_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "shapes-flux"
BUILTIN_VIDEO_MODEL_DIR = BUILTIN_MODEL_DIR.parent / "shapes-wan"
# Every size from 48 to 128 px, shapes anywhere, prompts with parts left out (docs/models.md).
BUILTIN_V2_MODEL_DIR = BUILTIN_MODEL_DIR.parent / "shapes-flux-v2"
# Clips of 64x64 x 9 frames and 96x64 x 13 frames (docs/models.md).
BUILTIN_VIDEO_V2_MODEL_DIR = BUILTIN_MODEL_DIR.parent / "shapes-wan-v2"
# Names `--model` understands besides folders and hub ids.
BUILTIN_MODELS = {"builtin": BUILTIN_MODEL_DIR, "builtin-video": BUILTIN_VIDEO_MODEL_DIR, "builtin-v2": BUILTIN_V2_MODEL_DIR,
                  "builtin-video-v2": BUILTIN_VIDEO_V2_MODEL_DIR}


@dataclass(frozen=True)
class LoadOptions:
    device: str | None = None  # None: cuda when available, else cpu
    dtype: str | None = None  # None: bfloat16 on cuda, float32 on cpu
    scheduler: str | None = None  # default noise scheduler name (None: the checkpoint's)
    # torch.compile the denoiser (transformer or UNet). Off by default: the first forward of
    # each new batch size compiles (seconds for tiny models, minutes for 12B ones).
    compile_denoiser: bool = False
    # Prompt embeddings kept for reuse (pipelines/prompt_cache.py); 0 turns the cache off.
    prompt_cache_size: int = DEFAULT_CAPACITY
    # LoRA adapters (pipelines/lora_files.py): `--lora` options, and the folders of per-model
    # adapter subfolders read at start.
    loras: tuple[LoraOption, ...] = ()
    lora_folders: tuple[str, ...] = (str(BUILTIN_LORA_DIR), DEFAULT_LORA_DIR)
    # The step-caching threshold of requests that do not say, for every model that caches steps
    # (pipelines/step_cache.py; 0 = off); None: each model's own (its stepstudio.json's, else off).
    step_cache: float | None = None
    # Memory plan (pipelines/memory_plan.py): "auto", "resident", "offload", "fp8" or "lowvram".
    memory: str = "auto"
    # The engine's rows x tokens per forward that the plan must leave room for; None: the
    # engine's default (batch_requests requests of the model's default size, room for CFG rows).
    batch_tokens: int | None = None
    batch_requests: int = 8
    # A quantized single file (GGUF) to load the denoiser from instead of the folder's own
    # (pipelines/quantized_denoiser.py); None: the folder's.
    denoiser_file: str | None = None


def resolve_device_dtype(options: LoadOptions):
    import torch

    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if options.dtype is None:
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    elif options.dtype in names:
        dtype = names[options.dtype]
    else:
        raise ValueError(f"dtype={options.dtype!r} is not supported; use one of {sorted(names)}.")
    return torch.device(device), dtype


def load_diffusers_pipeline(pipeline_class, path: Path, options: LoadOptions, family: str, extra_kwargs=None):
    """`pipeline_class.from_pretrained` from safetensors only, on the chosen device and dtype,
    progress bars off. `extra_kwargs(path, dtype)` gives more from_pretrained arguments (components
    a family loads itself). Any unreadable checkpoint gets the same clear ValueError.
    Returns (pipe, device)."""
    device, dtype = resolve_device_dtype(options)
    kwargs = {}
    if options.denoiser_file is not None:  # ValueError of its own for a file that doesn't fit
        from pipelines.quantized_denoiser import load_denoiser_file

        component, denoiser = load_denoiser_file(options.denoiser_file, path, read_model_index(path), dtype)
        kwargs[component] = denoiser
    try:
        kwargs.update(extra_kwargs(path, dtype) if extra_kwargs is not None else {})
        pipe = pipeline_class.from_pretrained(path, use_safetensors=True, dtype=dtype, **kwargs)
    except Exception as exc:  # noqa: BLE001 - corrupt, partial or pickle-only folders alike
        raise ValueError(
            f"could not load {path} as a {family} checkpoint ({type(exc).__name__}: {exc}). The folder must be "
            f"a complete {pipeline_class.__name__}.save_pretrained() folder with safetensors weights."
        ) from exc
    pipe.set_progress_bar_config(disable=True)
    return pipe, device  # in host memory: `place_by_plan` puts it on the device


def read_model_index(path: Path) -> dict:
    index_file = path / "model_index.json"
    if not index_file.is_file():
        raise ValueError(
            f"{path} is not a diffusers model folder: it has no model_index.json. "
            "Point --model at a folder saved with DiffusionPipeline.save_pretrained()."
        )
    try:
        return json.loads(index_file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{index_file} is not valid JSON ({exc}); the checkpoint looks corrupt.") from exc


def family_class(class_name: str):
    if class_name not in FAMILIES:
        raise ValueError(
            f"model class {class_name!r} is not supported by stepstudio; supported classes are: "
            f"{', '.join(sorted(FAMILIES))}."
        )
    module_name, _, attr = FAMILIES[class_name].partition(":")
    return getattr(importlib.import_module(module_name), attr)


def load_pipeline(model: str | None = None, options: LoadOptions | None = None) -> StepPipeline:
    """`model`: None or "builtin" (the shipped shapes model), "builtin-video" (the shipped video
    model), "builtin-v2" (the shipped shapes model of every size), "builtin-video-v2" (the shipped
    video model of two sizes and lengths), "toy", a local folder, or a hub id. Placed on the device by `options.memory`."""
    from pipelines.cpu_memory import keep_freed_cpu_memory

    keep_freed_cpu_memory()  # activations reuse touched pages, forward after forward
    options = options or LoadOptions()
    pipeline = _load_in_host_memory(model, options)
    _place(pipeline, options)
    return pipeline


def _load_in_host_memory(model: str | None, options: LoadOptions) -> StepPipeline:
    """The pipeline, before its memory plan places it (a model of one's own is placed already)."""
    if options.prompt_cache_size < 0:
        raise ValueError(f"prompt_cache_size={options.prompt_cache_size} must be 0 (no cache) or more.")
    if model == "toy":
        from pipelines.toy import ToyPipeline

        pipeline = ToyPipeline()
    else:
        if model is None or model in BUILTIN_MODELS:
            model = str(BUILTIN_MODELS[model or "builtin"])
        path = Path(model).expanduser()
        if not path.exists():
            path = _download(model)
        class_name = read_model_index(path).get("_class_name")
        with quiet_libraries():  # the family's import and from_pretrained: the libraries' noise
            pipeline = family_class(class_name).from_pretrained(path, options)
    if options.step_cache is not None:
        set_default_step_cache(pipeline, options.step_cache)
    prompt_cache = getattr(pipeline, "prompt_cache", None)  # a pipeline of one's own may have none
    if prompt_cache is not None:
        prompt_cache.resize(options.prompt_cache_size)
    return pipeline


def options_for_model(options: LoadOptions, first: bool) -> LoadOptions:
    """The options one model loads with: `denoiser_file` is the first model's only."""
    return options if first else replace(options, denoiser_file=None)


def load_models(models: tuple[str, ...], options: LoadOptions | None = None) -> list[StepPipeline]:
    """Every model, in order (the first is the engine's default, the one `denoiser_file` is for),
    each with its LoRA adapters."""
    options = options or LoadOptions()
    pipelines = [load_pipeline(model, options_for_model(options, first=index == 0))
                 for index, model in enumerate(models)]
    attach_adapters(pipelines, options)
    return pipelines


def _place(pipeline: StepPipeline, options: LoadOptions) -> None:
    place_by_plan(pipeline, options)
    if options.compile_denoiser and hasattr(pipeline, "placement"):  # after the plan's hooks
        compile_denoiser(pipeline)


def place_by_plan(pipeline: StepPipeline, options: LoadOptions) -> None:
    """Place a diffusers family's components by `options.memory` (`pipeline.memory_choice`: the
    plan and token limit chosen on CUDA, else None). A pipeline without components to place
    (toy, one's own) takes only "auto" or "resident"."""
    from pipelines.memory_plan import MEMORY_CHOICES

    if options.memory not in MEMORY_CHOICES:
        raise ValueError(f"memory={options.memory!r} is not one of {', '.join(MEMORY_CHOICES)}.")
    if not hasattr(pipeline, "placement"):
        if options.memory not in ("auto", "resident"):
            raise ValueError(f"{pipeline.info.name} keeps its own memory: only --memory auto or resident applies.")
        pipeline.memory_choice = None
        return
    from pipelines.memory_placement import default_tokens, plan_and_place

    batch_tokens = options.batch_tokens or options.batch_requests * 2 * default_tokens(pipeline)  # the engine's default
    pipeline.memory_choice = plan_and_place(pipeline, options.memory, batch_tokens)


def attach_adapters(pipelines: list[StepPipeline], options: LoadOptions) -> None:
    """Give each loaded model (the first is the default) its LoRA adapters: `options.loras` and
    the adapter folders (pipelines/lora_files.py). ValueError for one that does not fit."""
    names = [pipeline.info.name for pipeline in pipelines]
    check_lora_models(options.loras, names)
    for index, pipeline in enumerate(pipelines):
        files = adapter_files(names[index], index == 0, options.loras, options.lora_folders)
        if files and options.compile_denoiser:
            # The per-row hooks change with every forward's rows: a compiled graph would recompile.
            if adapter_files(names[index], index == 0, options.loras, ()):
                raise ValueError(f"--compile does not serve LoRA adapters yet ({', '.join(files)} for "
                                 f"{names[index]}): drop --compile, or the --lora options.")
            log.warning("--compile: the LoRA adapters %s of %s are not served", ", ".join(files), names[index])
            continue
        load_adapters(pipeline, files)


def load_adapters(pipeline: StepPipeline, files: dict[str, Path]) -> None:
    """Serve each adapter file under its name (ValueError: a file that does not fit the model)."""
    if files and not hasattr(pipeline, "load_lora"):
        raise ValueError(f"{pipeline.info.name} takes no LoRA adapters ({', '.join(files)} given).")
    for name, path in files.items():
        pipeline.load_lora(name, path)


def compile_denoiser(pipeline: StepPipeline) -> None:
    """`torch.compile` the pipeline's transformer(s) or UNet in place (dynamic batch dimension).
    A compiled model does not cache steps: the per-row cache changes its block loop every forward."""
    denoisers = getattr(pipeline, "denoisers", ())
    if not denoisers:
        raise ValueError(f"{type(pipeline).__name__} has no transformer or unet to compile.")
    for denoiser in denoisers:
        denoiser.compile(dynamic=True)
    if getattr(pipeline, "step_cache", None) is not None:
        pipeline.step_cache = None
        pipeline.info = replace(pipeline.info, step_cache=False,
                                defaults=replace(pipeline.info.defaults, step_cache=0.0))


def set_default_step_cache(pipeline: StepPipeline, threshold: float) -> None:
    """`threshold` becomes the step caching of the model's requests that do not say; a model that
    does not cache steps is served without (a warning says so)."""
    from pipelines.params import GenerationParams

    GenerationParams(prompt="a check of the threshold", step_cache=threshold)  # ParamError for a bad one
    if threshold and not pipeline.info.step_cache:
        log.warning("%s does not cache steps (--step-cache %g): its requests run every step in full",
                    pipeline.info.name, threshold)
        return
    pipeline.info = replace(pipeline.info, defaults=replace(pipeline.info.defaults, step_cache=float(threshold)))


def _download(model_id: str) -> Path:
    """Fetch a hub model id into the local cache (safetensors and configs only)."""
    if model_id.count("/") != 1:
        raise ValueError(f"model {model_id!r} is neither an existing folder nor a hub id like 'org/name'.")
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(model_id, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"])
    except Exception as exc:  # noqa: BLE001 - any hub/network failure gets the same advice
        raise ValueError(
            f"could not download {model_id!r} from the model hub ({type(exc).__name__}: {exc}). "
            "If this machine is offline, download the model elsewhere and pass its local folder to --model."
        ) from exc
    return Path(folder)
