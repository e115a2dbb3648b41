"""What the GPU check runs, at two scales: the real one (CUDA, bf16, FLUX.1-dev-sized) and the
dry run (CPU, float32, a 2-block FLUX), which runs the very same code in well under a minute."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from benchmarks.gpu_stand_in import FLUX_DEV, TINY, StandInConfig

SECTIONS = ("parity", "memory", "plans", "serving", "caching", "packing", "compile")


@dataclass(frozen=True)
class CheckSettings:
    name: str
    device: str
    dtype: str
    stand_in: StandInConfig
    memory_sizes: tuple[int, ...]  # square images, pixels
    memory_batches: tuple[int, ...]
    # Memory plans (benchmarks/gpu_plans.py): `plans_requests` requests at this size under each
    # plan, uncapped (`plans_steps` steps, the first a warm-up) and then under an allocator cap
    # emulating each card (one step); text-encoder stand-ins of T5-XXL's and CLIP-L's layer
    # counts (their widths are the transformer's text widths) and a VAE of this many parameters.
    plans_caps_gib: tuple[int, ...]
    plans_size: int
    plans_requests: int
    plans_steps: int
    plans_text_layers: tuple[int, int]
    plans_vae_parameters: int
    serving_size: int  # step vs request vs one-at-a-time
    serving_requests: int
    serving_steps: tuple[int, ...]  # the workload's step counts
    curve_size: int  # the batching curve
    curve_batches: tuple[int, ...]
    curve_steps: int
    # Step caching (benchmarks/gpu_caching.py): requests side by side at this size, caching off
    # then each threshold.
    caching_size: int
    caching_requests: int
    caching_steps: int
    caching_thresholds: tuple[float, ...]
    # Packed forwards (benchmarks/gpu_packing.py): rows of these square sizes, `packing_per_size` each.
    packing_sizes: tuple[int, ...]
    packing_per_size: int
    packing_repeats: int
    # torch.compile backend of the compile section: "inductor" is what the studio's --compile
    # uses (pipelines.loader.compile_denoiser); "eager" only traces (proves the plumbing fast);
    # None: the section is recorded as skipped.
    compile_backend: str | None
    budget_s: float  # the default --time-budget
    plan_s: dict  # section -> planned seconds (see benchmarks/gpu_budget.py)
    torch_threads: int | None = None  # None: torch's default

    def to_json(self) -> dict:
        data = asdict(self)
        data["stand_in"] = {"label": self.stand_in.label, "text_tokens": self.stand_in.text_tokens,
                            **self.stand_in.transformer}
        return data


GPU = CheckSettings(
    name="gpu",
    device="cuda",
    dtype="bfloat16",
    stand_in=FLUX_DEV,
    memory_sizes=(512, 1024),
    memory_batches=(1, 2, 4, 8, 16),
    plans_caps_gib=(24, 16, 12),
    plans_size=1024,
    plans_requests=8,
    plans_steps=2,
    plans_text_layers=(24, 12),  # T5-XXL's encoder, CLIP-L's text model
    plans_vae_parameters=83_821_011,  # FLUX.1-dev's AutoencoderKL
    serving_size=1024,
    serving_requests=8,
    serving_steps=(4, 8),
    curve_size=512,
    curve_batches=(1, 2, 4, 8, 12, 16),
    curve_steps=8,
    caching_size=1024,
    caching_requests=4,
    caching_steps=12,
    caching_thresholds=(0.1, 0.3),
    packing_sizes=(512, 768, 1024),
    packing_per_size=2,
    packing_repeats=3,
    compile_backend="inductor",
    budget_s=450.0,  # 8 minutes less a margin for estimates that run over
    # Startup (imports, CUDA) comes out of the first section's share.
    # plans' 65 s came from compile (30), serving (15), parity (10), caching and packing (5 each).
    plan_s={"parity": 60.0, "memory": 45.0, "plans": 65.0, "serving": 120.0, "caching": 45.0, "packing": 45.0,
            "compile": 70.0},
)

DRY_RUN = CheckSettings(
    name="dry-run",
    device="cpu",
    dtype="float32",
    stand_in=TINY,
    memory_sizes=(64, 128),
    memory_batches=(1, 2),
    plans_caps_gib=(24, 16, 12),  # not applied on the CPU: the same code runs, uncapped
    plans_size=64,
    plans_requests=8,
    plans_steps=2,
    plans_text_layers=(1, 1),
    plans_vae_parameters=4096,
    serving_size=128,
    serving_requests=4,
    serving_steps=(2, 4),
    curve_size=64,
    curve_batches=(1, 2),
    curve_steps=3,
    caching_size=64,
    caching_requests=2,
    caching_steps=4,
    caching_thresholds=(1.0,),
    packing_sizes=(64, 96, 128),
    packing_per_size=2,
    packing_repeats=2,
    # Inductor needs minutes on this CPU even for the 2-block model (measured: about 4 min).
    compile_backend=None,
    # A cap, not a target: it runs in 30 to 45 s here, but imports alone took 20 s on this
    # shared machine under load, and a 60 s cap then skipped the Wan families.
    budget_s=90.0,
    plan_s={"parity": 35.0, "memory": 5.0, "plans": 5.0, "serving": 15.0, "caching": 5.0, "packing": 5.0, "compile": 5.0},
    # Tiny tensors: one thread beats a thread pool on a shared, busy CPU (measured 7x faster here).
    torch_threads=1,
)
