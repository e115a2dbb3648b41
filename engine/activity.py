"""What the engine has been doing lately: counters and moving averages for the views.

Written by the engine thread only; read through the snapshots it publishes."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field


@dataclass
class EngineActivity:
    forwards_by_batch_size: Counter = field(default_factory=Counter)
    finished: Counter = field(default_factory=Counter)  # final status -> count
    completed_by_model: Counter = field(default_factory=Counter)  # model -> completed requests
    recent_steps: deque = field(default_factory=lambda: deque(maxlen=256))  # (time, rows)
    stage_means: dict = field(default_factory=lambda: {"encode_s": None, "denoise_step_s": None, "decode_s": None})

    def record_forward(self, rows: int, now: float) -> None:
        self.forwards_by_batch_size[rows] += 1
        self.recent_steps.append((now, rows))

    def record_stage(self, name: str, samples: list[float]) -> None:
        for sample in samples:
            previous = self.stage_means[name]
            # Exponential moving average: recent work matters most, noise is smoothed.
            self.stage_means[name] = sample if previous is None else 0.8 * previous + 0.2 * sample

    def steps_per_s(self, now: float, window_s: float = 5.0) -> float:
        """Request-steps per second over the last few seconds."""
        recent = [(t, rows) for t, rows in self.recent_steps if now - t <= window_s]
        if len(recent) < 2:
            return 0.0
        span = max(now - recent[0][0], 1e-6)
        return sum(rows for _, rows in recent) / span
