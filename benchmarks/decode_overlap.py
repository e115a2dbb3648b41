"""Would a second thread for VAE decodes help? And what does one batched decode save?

    python benchmarks/decode_overlap.py                       # the built-in video model
    python benchmarks/decode_overlap.py --model builtin       # the built-in image model

On one machine, in one run, with the pipeline's own calls (no engine):
- forward then decode, one after the other (what the engine thread does when requests finish)
  against the same decode in a second thread while the next forward runs;
- K finished requests decoded one by one against one batched call (`post_decode_many`).
Each timing is the median of `--trials` trials of `--repeats` rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _states(pipeline, count: int, steps: int = 20):
    from engine import Engine, GenerationParams
    from pipelines.interface import RequestState

    engine = Engine(pipeline)  # parameter resolution only
    prompts = list(pipeline.info.defaults.example_prompts) or ["a red circle"]
    states = []
    for i in range(count):
        params = engine.prepare_params(GenerationParams(prompt=prompts[i % len(prompts)], seed=i,
                                                        num_inference_steps=steps))
        state = RequestState(request_id=str(i), params=params)
        pipeline.prepare_encode(state)
        states.append(state)
    return states


def _median_time(run, trials: int, repeats: int) -> float:
    run()  # warm-up
    samples = []
    for _ in range(trials):
        started = time.perf_counter()
        for _ in range(repeats):
            run()
        samples.append((time.perf_counter() - started) / repeats)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin-video")
    parser.add_argument("--batch", type=int, default=8, help="requests in the forward")
    parser.add_argument("--finishing", type=int, default=2, help="requests decoded after it")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)

    import torch

    from pipelines.interface import Batch
    from pipelines.loader import load_pipeline

    if args.threads:
        torch.set_num_threads(args.threads)
    pipeline = load_pipeline(args.model)
    states = _states(pipeline, args.batch)
    batch, finishing = Batch(tuple(states)), states[: args.finishing]

    def forward():
        pipeline.denoise_step(batch)

    def decode_each():
        for state in finishing:
            pipeline.post_decode(state)

    def decode_batched():
        pipeline.post_decode_many(finishing)

    def one_after_the_other():
        forward()
        decode_batched()

    def overlapped():
        worker = threading.Thread(target=decode_batched)
        worker.start()
        forward()
        worker.join()

    with torch.no_grad():
        times = {name: _median_time(run, args.trials, args.repeats) for name, run in (
            ("forward", forward), ("decode one by one", decode_each), ("decode batched", decode_batched),
            ("forward, then decode", one_after_the_other), ("decode in a second thread", overlapped))}
    print(f"\n{args.model}: forward of {args.batch} requests, {args.finishing} of them decoded; torch threads "
          f"{torch.get_num_threads()}; median of {args.trials} trials x {args.repeats}\n")
    print("| what | ms |\n|---|---|")
    for name, seconds in times.items():
        print(f"| {name} | {1000 * seconds:.1f} |")
    print(f"\nbatched decode / one by one: {times['decode batched'] / times['decode one by one']:.2f}")
    print(f"second thread / one after the other: {times['decode in a second thread'] / times['forward, then decode']:.2f}")
    return times


if __name__ == "__main__":
    main()
