"""What a replica runs (`ReplicaSettings`) and how many run where (`ServeSettings`).

Both are plain frozen values: they travel to the replicas as deployment arguments, and a Serve
config's `args` (serve/stepstudio.yaml) become them through `settings_from_args`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from engine import ServingLimits
from studio.config import MODES, StudioOptions

# Serve counts every open stream and every report call against a replica's limit; the engine
# refuses past its own queue limit, so Serve's must never be the one that bites first.
REPORT_HEADROOM = 16
REFRESH_S = 0.5  # how often the facade gathers every replica's snapshot and metrics


@dataclass(frozen=True)
class ReplicaSettings:
    """One engine replica: its model, device, engine settings and CPU threads."""

    model: str = "builtin"  # as app.py's --model: "builtin", "toy", a folder or a hub id
    more_models: tuple[str, ...] = ()  # further models the same engine serves (the first is the default)
    device: str | None = None  # None: cuda when the replica sees a GPU, else cpu
    dtype: str | None = None
    compile: bool = False
    memory: str = "auto"  # pipelines.loader.LoadOptions.memory (each replica chooses for its own GPU)
    denoiser_file: str | None = None  # pipelines.loader.LoadOptions.denoiser_file
    prompt_cache: int = 32
    step_cache: float | None = None  # pipelines.loader.LoadOptions.step_cache
    mode: str = "step"
    max_batch: int = 8
    max_tokens: int | None = None  # engine.Engine's max_batch_tokens
    limits: ServingLimits = ServingLimits()
    # CPU: torch threads of this replica (None: torch's own choice).
    torch_threads: int | None = None
    # CPU: pin the replica's process to its own cores (local rank x torch_threads, wrapping
    # around the cores it may use), so replicas on one machine don't trade cores.
    pin_cpus: bool = False
    # "module:callable" that builds the pipeline instead of `model` (custom adapters, tests),
    # called with `pipeline_kwargs`.
    pipeline_factory: str | None = None
    pipeline_kwargs: tuple[tuple[str, object], ...] = ()
    # LoRA adapters, as app.py's --lora and --loras (pipelines/lora_files.py).
    loras: tuple = ()
    lora_folder: str = "loras"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is not supported: use one of {', '.join(MODES)}.")
        _check_positive_int("max_batch", self.max_batch)
        if self.torch_threads is not None:
            _check_positive_int("torch_threads", self.torch_threads)
        if self.pipeline_factory is not None and ":" not in self.pipeline_factory:
            raise ValueError(f"pipeline_factory={self.pipeline_factory!r} must be 'module:callable'.")


@dataclass(frozen=True)
class ServeSettings:
    """The engine deployment: how many replicas, and what each one takes from the cluster."""

    replica: ReplicaSettings = field(default_factory=ReplicaSettings)
    replicas: int = 2
    cpus_per_replica: float = 1.0  # Ray's resource accounting (a GPU replica needs few)
    gpus_per_replica: float = 0.0  # 1 on a GPU cluster: one replica per GPU
    refresh_s: float = REFRESH_S

    def __post_init__(self) -> None:
        _check_positive_int("replicas", self.replicas)
        for name in ("cpus_per_replica", "gpus_per_replica"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}.")
        if not self.refresh_s > 0:
            raise ValueError(f"refresh_s must be > 0, got {self.refresh_s!r}.")

    @property
    def max_ongoing_requests(self) -> int:
        return self.replica.limits.max_queue + REPORT_HEADROOM


def replica_settings_for(options: StudioOptions, torch_threads: int | None = None, pin_cpus: bool = False) -> ReplicaSettings:
    """The replica side of the studio's options (model, device, engine, limits)."""
    return ReplicaSettings(
        model=options.model, more_models=tuple(getattr(options, "more_models", ())), device=options.device, dtype=options.dtype, compile=options.compile,
        memory=getattr(options, "memory", "auto"), denoiser_file=getattr(options, "denoiser_file", None),
        prompt_cache=options.prompt_cache, step_cache=getattr(options, "step_cache", None), mode=options.mode, max_batch=options.max_batch, max_tokens=getattr(options, "max_tokens", None), limits=options.limits,
        torch_threads=torch_threads, pin_cpus=pin_cpus, loras=tuple(getattr(options, "loras", ())),
        lora_folder=getattr(options, "lora_folder", "loras"),
    )


def cpu_threads_per_replica(replicas: int, cores: int | None = None) -> int:
    """On CPU, the machine's cores shared out: at least one thread each."""
    cores = cores or len(os.sched_getaffinity(0))
    return max(1, cores // replicas)


def serve_settings_for(
    options: StudioOptions,
    replicas: int,
    *,
    torch_threads: int | None = None,
    gpus_per_replica: float = 0.0,
    pin_cpus: bool | None = None,
    cpus_per_replica: float | None = None,
    refresh_s: float = REFRESH_S,
) -> ServeSettings:
    """The deployment for the studio's options. On CPU (no GPUs per replica) each replica gets
    its share of the cores as torch threads, pinned to them when there are several replicas."""
    _check_positive_int("replicas", replicas)
    on_gpu = gpus_per_replica > 0
    if torch_threads is None and not on_gpu:
        torch_threads = cpu_threads_per_replica(replicas)
    pin = (not on_gpu and replicas > 1) if pin_cpus is None else pin_cpus
    if cpus_per_replica is None:
        cpus_per_replica = 1.0 if on_gpu else float(torch_threads)
    return ServeSettings(
        replica=replica_settings_for(options, torch_threads, pin), replicas=replicas,
        cpus_per_replica=cpus_per_replica, gpus_per_replica=gpus_per_replica, refresh_s=refresh_s,
    )


# Keys of a Serve config's `args` that are not StudioOptions fields (serve_settings_for's).
SERVE_ARGS = ("replicas", "torch_threads", "pin_cpus", "cpus_per_replica", "gpus_per_replica", "refresh_s")


def settings_from_args(args: dict) -> tuple[StudioOptions, ServeSettings]:
    """A Serve config's `args`: StudioOptions fields (model, max_batch, ...) plus SERVE_ARGS.
    Unknown keys are refused by name."""
    args = dict(args or {})
    option_names = {f.name for f in dataclasses.fields(StudioOptions)}
    unknown = sorted(set(args) - option_names - set(SERVE_ARGS))
    if unknown:
        allowed = ", ".join(sorted(option_names | set(SERVE_ARGS)))
        raise ValueError(f"unknown args {unknown} in the Serve config; allowed are: {allowed}.")
    serve_args = {name: args.pop(name) for name in SERVE_ARGS if name in args}
    if "more_models" in args:  # YAML gives lists
        args["more_models"] = tuple(args["more_models"])
    if args.get("auth") is not None:
        args["auth"] = tuple(args["auth"])
    if "api_keys" in args:
        args["api_keys"] = tuple(tuple(pair) for pair in args["api_keys"])
    options = StudioOptions(**args)
    return options, serve_settings_for(options, serve_args.pop("replicas", 2), **serve_args)


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
