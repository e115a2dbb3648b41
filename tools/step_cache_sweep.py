"""Step caching's thresholds against the built-in models' evaluators, through stepstudio's engine.

`python -m tools.evaluate_builtin --step-cache 0.05 0.1 0.2` and
`python -m tools.evaluate_video --step-cache 0.05 0.1` call `sweep`: for each rule and threshold
(and caching off, the reference), every prompt is its own request, all submitted at once to one
engine in step mode (so requests co-batch as when serving), request i with seed + i. The table
says, per row: the share of model rows that skipped the later blocks (from the engine's own
counters: what caching saved, free of this machine's timing noise), the wall time and this
process's CPU time relative to caching off in the same run (the CPU time moves less when other
work shares the machine), and each evaluator score with its change from caching off (the
quality bar: every score within 0.02).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

QUALITY_BAR = 0.02  # the largest drop of any score from caching off that a default may cost


@dataclass(frozen=True)
class SweepRow:
    rule: str
    threshold: float
    seconds: float  # wall time of the whole run (submit to the last result)
    cpu_seconds: float  # this process's CPU time over the run: the work done, less moved by other load
    rows_skipped: float  # share of model rows that reused their cached residual
    scores: dict[str, float]


def engine_run(pipeline, requests: list, max_batch: int = 8) -> tuple[list, float, float, float]:
    """Every GenerationParams in `requests` through one engine in step mode, submitted at once:
    (the Completed events in order, wall seconds, CPU seconds, share of model rows skipped)."""
    from engine import Completed, Engine, ServingLimits

    limits = ServingLimits(max_queue=len(requests) + 1, max_per_session=len(requests) + 1)
    engine = Engine(pipeline, mode="step", max_batch_requests=max_batch, limits=limits).start()
    try:
        started, cpu_started = time.perf_counter(), time.process_time()
        handles = [engine.submit(params, session_id="eval") for params in requests]
        finals = [handle.result(timeout=3600) for handle in handles]
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        stats = engine.snapshot().stats
    finally:
        engine.close()
    failed = [final for final in finals if not isinstance(final, Completed)]
    if failed:
        raise RuntimeError(f"{len(failed)} evaluation requests did not complete, e.g. {failed[0]!r}")
    rows = stats.rows_computed + stats.rows_skipped
    return finals, seconds, cpu_seconds, stats.rows_skipped / rows if rows else 0.0


def sweep(pipeline, requests_for: Callable[[float], list], score: Callable[[list], dict[str, float]],
          thresholds: Sequence[float], rules: Sequence[str], max_batch: int = 8,
          report: Callable[[SweepRow], None] | None = None) -> list[SweepRow]:
    """Caching off, then each rule at each threshold. `requests_for(threshold)`: the GenerationParams
    of every prompt; `score(finals)`: the evaluator's scores of the Completed events."""
    runs = [("off", 0.0)] + [(rule, threshold) for rule in rules for threshold in thresholds if threshold]
    rows = []
    for rule, threshold in runs:
        if rule != "off":
            pipeline.step_cache.rule = rule
        finals, seconds, cpu_seconds, skipped = engine_run(pipeline, requests_for(threshold), max_batch)
        row = SweepRow(rule, threshold, seconds, cpu_seconds, skipped, score(finals))
        rows.append(row)
        if report is not None:
            report(row)
    return rows


def header(attributes: Sequence[str]) -> str:
    return ("| rule | threshold | rows skipped | wall s | x speed (wall) | CPU s | x speed (CPU) | "
            + " | ".join(attributes) + f" | within {QUALITY_BAR} |\n|" + "---|" * (len(attributes) + 8))


def table_row(row: SweepRow, reference: SweepRow, attributes: Sequence[str]) -> str:
    """One markdown row; each score with its change from caching off."""
    cells = []
    for attribute in attributes:
        change = row.scores[attribute] - reference.scores[attribute]
        cells.append(f"{row.scores[attribute]:.2f}" + ("" if row is reference else f" ({change:+.2f})"))
    within = all(row.scores[a] >= reference.scores[a] - QUALITY_BAR - 1e-9 for a in attributes)
    return (f"| {row.rule} | {row.threshold:g} | {row.rows_skipped:.0%} | {row.seconds:.1f} "
            f"| {reference.seconds / row.seconds:.2f} | {row.cpu_seconds:.1f} | {reference.cpu_seconds / row.cpu_seconds:.2f} | "
            + " | ".join(cells) + f" | {'yes' if within else 'no'} |")


def print_sweep(pipeline, requests_for, score, thresholds, rules, attributes, max_batch: int = 8) -> list[SweepRow]:
    """`sweep`, printing each row of the table as it is measured."""
    print(header(attributes), flush=True)
    rows: list[SweepRow] = []

    def report(row: SweepRow) -> None:
        rows.append(row)
        print(table_row(row, rows[0], attributes), flush=True)

    sweep(pipeline, requests_for, score, thresholds, rules, max_batch, report)
    return rows


def sweep_prompts(model, prompts: list[str], seed: int, steps: int | None, guidance: float | None,
                  score: Callable[[list], dict[str, float]], thresholds: Sequence[float], rules: Sequence[str],
                  attributes: Sequence[str], max_batch: int = 8) -> list[SweepRow]:
    """`print_sweep` over `prompts`, each its own request with seed + i (steps and guidance: None,
    the model's), on the step pipeline loaded from `model`; `score(pairs)` scores (prompt, Completed)."""
    from engine import GenerationParams
    from pipelines.loader import load_pipeline

    pipeline = load_pipeline(str(model))
    print(f"model {model}, {len(prompts)} prompts, noise seeds {seed} + i, {steps or 'default'} steps, through "
          f"stepstudio's engine (step mode, batch {max_batch})\n")

    def requests_for(threshold: float) -> list:
        return [GenerationParams(prompt=prompt, seed=seed + i, num_inference_steps=steps, guidance_scale=guidance,
                                 step_cache=threshold) for i, prompt in enumerate(prompts)]

    return print_sweep(pipeline, requests_for, lambda finals: score(list(zip(prompts, finals))), thresholds, rules,
                       attributes, max_batch)
