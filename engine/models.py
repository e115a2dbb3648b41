"""The models one engine serves: step pipelines by name, the first one the default.

One engine (one thread, one device) can hold several pipelines, e.g. the built-in image model
and the built-in video model. A request names its model in `GenerationParams.model` (None: the
default); the model is part of the batch key, so requests of different models never share a
forward, and their groups take turns like any other groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Mapping

from pipelines.interface import PipelineInfo, StepPipeline
from pipelines.validation import check_model_name


@dataclass(frozen=True)
class ModelBatchKey:
    """A pipeline's own batch key, scoped to its model."""

    model: str
    key: Hashable


class ModelSet:
    def __init__(self, pipelines: StepPipeline | Mapping[str, StepPipeline] | list[StepPipeline]) -> None:
        if isinstance(pipelines, Mapping):
            named = dict(pipelines)
        else:
            named = {}
            for pipeline in pipelines if isinstance(pipelines, list) else [pipelines]:
                name = pipeline.info.name
                suffix = 2
                while name in named:  # two folders of the same name: keep both, told apart
                    name = f"{pipeline.info.name}-{suffix}"
                    suffix += 1
                named[name] = pipeline
        if not named:
            raise ValueError("an engine needs at least one model.")
        self.pipelines: dict[str, StepPipeline] = named
        self.default: str = next(iter(named))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.pipelines)

    @property
    def infos(self) -> dict[str, PipelineInfo]:
        return {name: pipeline.info for name, pipeline in self.pipelines.items()}

    def resolve(self, model: str | None) -> str:
        """The name a request's `model` stands for (None: the default). ValueError for an unknown one."""
        if model is None:
            return self.default
        check_model_name(model, tuple(self.pipelines))
        return model

    def __getitem__(self, model: str | None) -> StepPipeline:
        return self.pipelines[self.resolve(model)]
