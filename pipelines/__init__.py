"""Model adapters that implement the step protocol (see pipelines/interface.py)."""

from pipelines.interface import Batch, ModelDefaults, PipelineInfo, RequestState, StepPipeline, resolve_defaults
from pipelines.params import GenerationParams

__all__ = [
    "Batch",
    "GenerationParams",
    "ModelDefaults",
    "PipelineInfo",
    "RequestState",
    "StepPipeline",
    "resolve_defaults",
]
