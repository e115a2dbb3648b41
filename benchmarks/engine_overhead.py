"""How much time does the engine itself spend per step? (scheduling + batching + event delivery)

A no-op pipeline does no tensor work, so everything measured is engine bookkeeping:
the scheduler's decisions, the runner's batch building, the events sent to each request's
handle and their delivery to an asyncio consumer (as the studio reads them), and the
snapshot the engine publishes after each step.

    python benchmarks/engine_overhead.py [--steps 300] [--running 1 8 32] [--repeats 3]

Target (issue: engine core): <= 1 ms per engine step with 32 running requests.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from PIL import Image  # noqa: E402

from engine import Completed, Engine, GenerationParams, ServingLimits  # noqa: E402
from pipelines.interface import Batch, ModelDefaults, PipelineInfo, RequestState  # noqa: E402

_TINY_IMAGE = Image.new("RGB", (8, 8))


class NoOpPipeline:
    """Follows the step protocol and does nothing else."""

    def __init__(self) -> None:
        self.info = PipelineInfo(
            name="no-op",
            family="no-op",
            output_kind="image",
            defaults=ModelDefaults(width=64, height=64, num_inference_steps=10, guidance_scale=1.0),
            uses_negative_prompt=False,
            size_multiple=8,
        )
        self.forwards = 0

    def validate(self, params) -> None:
        pass

    def batch_key(self, params):
        return (params.width, params.height)

    def prepare_encode(self, state: RequestState) -> None:
        state.timesteps = range(state.params.num_inference_steps)

    def denoise_step(self, batch: Batch):
        self.forwards += 1
        return [None] * len(batch)

    def step_scheduler(self, state: RequestState, prediction) -> None:
        state.step_index += 1

    def post_decode(self, state: RequestState):
        return [_TINY_IMAGE]

    def preview(self, state: RequestState):
        return None


def measure(running: int, steps: int) -> float:
    """Mean wall time per engine step with `running` requests co-batched, in ms."""
    pipeline = NoOpPipeline()
    engine = Engine(pipeline, max_batch_requests=running, limits=ServingLimits(max_steps=steps, max_per_session=running))
    params = [GenerationParams(prompt=f"request {i}", num_inference_steps=steps, seed=i) for i in range(running)]
    handles = [engine.submit(p, session_id="bench") for p in params]

    async def consume_all() -> list:
        async def consume(handle):
            final = None
            async for final in handle.stream():
                pass
            return final

        return await asyncio.gather(*(consume(h) for h in handles))

    results: list = []
    consumer = threading.Thread(target=lambda: results.extend(asyncio.run(consume_all())))
    consumer.start()
    started = time.perf_counter()
    engine.start()
    consumer.join()
    elapsed = time.perf_counter() - started
    engine.close()
    assert all(isinstance(r, Completed) for r in results), results
    assert pipeline.forwards == steps, (pipeline.forwards, steps)
    return elapsed / pipeline.forwards * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="denoise steps per request")
    parser.add_argument("--running", type=int, nargs="+", default=[1, 8, 32], help="requests running together")
    parser.add_argument("--repeats", type=int, default=3, help="runs per setting (the median is reported)")
    args = parser.parse_args()
    print("| running requests | engine ms/step (median) | min | max | per request-step (us) |")
    print("|---|---|---|---|---|")
    for running in args.running:
        samples = [measure(running, args.steps) for _ in range(args.repeats)]
        median = statistics.median(samples)
        print(
            f"| {running} | {median:.3f} | {min(samples):.3f} | {max(samples):.3f} | {median / running * 1000:.1f} |"
        )


if __name__ == "__main__":
    main()
