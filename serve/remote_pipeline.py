"""A model the replicas serve, as the studio reads it from `engine.models[name]`."""

from __future__ import annotations

import logging
from typing import Callable

from pipelines.interface import PipelineInfo

log = logging.getLogger(__name__)


class RemotePipeline:
    """A model as the studio sees it through `engine.models[name]`: its `info` and, when the
    replicas' pipeline has it, `unknown_words` (`ask(prompt, name)`: answered by a replica)."""

    def __init__(self, name: str, info: PipelineInfo, ask: Callable[[str, str], tuple[str, ...]] | None) -> None:
        self._name, self.info, self._ask = name, info, ask
        if ask is not None:
            self.unknown_words = self._unknown_words

    def _unknown_words(self, prompt: str) -> tuple[str, ...]:
        try:
            return self._ask(prompt, self._name)
        except Exception:  # noqa: BLE001 - a hint under the prompt box; never an error for the user
            log.warning("no replica answered unknown_words", exc_info=True)
            return ()
