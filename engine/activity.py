"""What the engine has been doing lately: counters and moving averages for the views.

Written by the engine thread only; read through the snapshots it publishes."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

STAGES = ("encode_s", "denoise_step_s", "decode_s")


@dataclass
class EngineActivity:
    forwards_by_batch_size: Counter = field(default_factory=Counter)
    finished: Counter = field(default_factory=Counter)  # final status -> count
    completed_by_model: Counter = field(default_factory=Counter)  # model -> completed requests
    recent_steps: deque = field(default_factory=lambda: deque(maxlen=256))  # (time, rows)
    stage_means: dict = field(default_factory=lambda: dict.fromkeys(STAGES))  # the whole engine's
    stage_means_by_model: dict = field(default_factory=dict)  # model -> its own stage means (models differ)
    rows_computed: int = 0  # model rows that ran every block
    rows_skipped: int = 0  # model rows that reused their request's cached residual (step caching)

    def record_forward(self, rows: int, now: float, model_rows: int = 0, skipped_rows: int = 0) -> None:
        self.forwards_by_batch_size[rows] += 1
        self.recent_steps.append((now, rows))
        self.rows_computed += model_rows - skipped_rows
        self.rows_skipped += skipped_rows

    def record_stage(self, name: str, samples: list[float], model: str | None = None) -> None:
        """Fold samples of one stage into the engine's means and, when given, `model`'s own."""
        for sample in samples:
            self.stage_means[name] = _moving_mean(self.stage_means[name], sample)
            if model is not None:
                means = self.stage_means_by_model.setdefault(model, dict.fromkeys(STAGES))
                means[name] = _moving_mean(means[name], sample)

    def steps_per_s(self, now: float, window_s: float = 5.0) -> float:
        """Request-steps per second over the last few seconds."""
        recent = [(t, rows) for t, rows in self.recent_steps if now - t <= window_s]
        if len(recent) < 2:
            return 0.0
        span = max(now - recent[0][0], 1e-6)
        return sum(rows for _, rows in recent) / span


def _moving_mean(previous: float | None, sample: float) -> float:
    # Exponential moving average: recent work matters most, noise is smoothed.
    return sample if previous is None else 0.8 * previous + 0.2 * sample
