"""Memory plans on emulated cards (issue 44): which plans fit 24, 16 and 12 GB cards, how fast
each serves 8 users, what it keeps on the device, and how far its predictions are from resident's.

The model is the FLUX.1-dev-sized stand-in (benchmarks/gpu_stand_in.py: the real transformer,
random weights), given what `place()` (pipelines/memory_placement.py) moves: text-encoder
stand-ins with T5-XXL's encoder's and CLIP-L's text model's layers (a token embedding first,
attention and MLP projections of the real widths: 4.76B + 0.12B parameters, 9.1 GiB in bf16;
random weights, a forward that uses every weight and gives the transformer its prompt
embeddings) and a VAE stand-in of FLUX's VAE's bytes (0.16 GiB) that moves for the decode stage
but decodes nothing (the stand-in has no VAE): a VAE decode's own activations are not in these
peaks. The engine's stages are followed: one encode stage for the 8 requests (an offloaded text
encoder group moves once), the co-batched steps, one decode stage.

Each plan in PLANS is placed once, in order, each from the previous one's state (resident: all on
the device; offload sends text encoders and VAE to pinned host memory; fp8 casts what offload
placed; lowvram starts from fresh weights in host memory, the same seed, as the loader holds a
model before placing it). Then:

- uncapped (the whole card): the 8 requests' encode stage, `plans_steps` steps at 1024x1024 (the
  first warms up; its predictions are the parity sample: the same prompts, seeds and weights
  for every plan, compared with resident's: max abs diff, relative RMS), the decode stage;
- under each cap, largest first: `torch.cuda.set_per_process_memory_fraction` limits the
  caching allocator to the card's size less CONTEXT_GIB (what a real card has free after its
  CUDA context, as benchmarks/memory_table.py takes it), and the same run with one step: an
  out-of-memory error (caught) means the plan does not fit that card, and it is not tried on the
  smaller ones. Peaks are `torch.cuda.max_memory_allocated` (and reserved) of the run.

Beside each measurement: what `choose_plan`'s arithmetic (pipelines/memory_plan.py) says for the
same figures (`measure()` of this model; the activation per token measured on the device by
`measured_activation_per_token`, as the loader does after placing), and what `--memory auto`
would pick for each card at load (with its estimate, before anything ran). images/s are for
requests of FULL_STEPS steps: 8 / (encode + FULL_STEPS x s/step + decode), from the measured parts.

This section changes the weights (fp8): the shared stand-in is released first, and the sections
after it build theirs again. On the CPU (the dry run) the same code runs at the tiny size and
float32, with no cap ("no cap on cpu") and no allocator figures.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import time

import torch
import torch.nn.functional as F

from benchmarks.gpu_budget import Section
from benchmarks.gpu_memory import synchronize
from benchmarks.gpu_stand_in import StandInFluxPipeline, TextRows, build_transformer, image_tokens
from benchmarks.memory_table import CONTEXT_GIB
from pipelines.component_placement import ComponentPlacement
from pipelines.interface import Batch, RequestState
from pipelines.loader import LoadOptions
from pipelines.memory_placement import (default_tokens, estimated_activation_per_token, measure,
                                        measured_activation_per_token, place)
from pipelines.memory_plan import GIB, PLANS, PlanDoesNotFit, choose_plan, usable
from pipelines.params import GenerationParams

FULL_STEPS = 28  # FLUX.1-dev's default: the schedule every request follows, and images/s are for
T5_VOCAB, CLIP_VOCAB, CLIP_TOKENS = 32128, 49408, 77
# A float8 (e4m3) plan's prediction of one step against resident's, relative RMS: the dry run's
# bound (its tiny float32 model measured 0.024); on the GPU it is reported, not judged.
FP8_RELATIVE_TOLERANCE = 0.1


# ---------------------------------------------------------------------------- the model's parts
class _EncoderLayer(torch.nn.Module):
    def __init__(self, width: int, ff: int, gated: bool) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(width, width, bias=False) for _ in range(4))
        self.wi = torch.nn.ModuleList(torch.nn.Linear(width, ff, bias=False) for _ in range(2 if gated else 1))
        self.wo = torch.nn.Linear(ff, width, bias=False)
        self.heads = max(1, width // 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        h = F.rms_norm(x, (width,))
        q, k, v = (p(h).view(batch, tokens, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
        x = x + self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, tokens, width))
        h = F.rms_norm(x, (width,))
        up = F.gelu(self.wi[0](h))
        if len(self.wi) > 1:
            up = up * self.wi[1](h)  # T5's gated-gelu
        return x + self.wo(up)


class TextEncoderStandIn(torch.nn.Module):
    """A text encoder's parameter count and layer shapes (embedding first, as transformers' models
    have it: the fp8 plans keep it and cast the projections), random weights."""

    def __init__(self, vocab: int, width: int, layers: int, ff: int, gated: bool, keep: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.vocab = vocab
        self._keep_in_fp32_modules = list(keep)  # as transformers' T5 has it: the fp8 plans keep `wo`
        self.shared = torch.nn.Embedding(vocab, width)
        self.layers = torch.nn.ModuleList(_EncoderLayer(width, ff, gated) for _ in range(layers))

    @property
    def dtype(self) -> torch.dtype:  # what place() computes a float8 text encoder in
        return self.shared.weight.dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.shared(ids)
        for layer in self.layers:
            x = layer(x)
        return F.rms_norm(x, (x.shape[-1],))


class VaeStandIn(torch.nn.Module):
    """A VAE's bytes, for the decode stage to move; it decodes nothing."""

    def __init__(self, parameters: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(parameters), requires_grad=False)


class StandInParts:
    """What `place()` reads of a diffusers pipeline: `components`, `vae` and `to()`."""

    def __init__(self, transformer, text_encoder, text_encoder_2, vae) -> None:
        self.components = {"transformer": transformer, "text_encoder": text_encoder,
                           "text_encoder_2": text_encoder_2, "vae": vae}
        self.vae = vae

    def to(self, device) -> StandInParts:
        for module in self.components.values():
            module.to(device)
        return self


class PlannedStandIn(StandInFluxPipeline):
    """The stand-in whose prompt embeddings come from its text-encoder stand-ins, used where its
    placement has them (`pipe`, `placement`, `memory_plan`, `name`: what place() reads and sets)."""

    def __init__(self, transformer, config, text_encoders, vae, device: torch.device) -> None:
        super().__init__(transformer, config)
        self.device = device  # the transformer may be in host memory until placed
        self.name = f"{config.label}, text encoder and VAE stand-ins"
        self.pipe = StandInParts(transformer, *text_encoders, vae)
        self.placement = ComponentPlacement(device)
        self.memory_plan = None

    @torch.no_grad()
    def text_rows(self, prompt: str) -> TextRows:
        seed = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "little")
        generator = torch.Generator().manual_seed(seed)
        clip, t5 = self.pipe.components["text_encoder"], self.pipe.components["text_encoder_2"]
        t5_ids = torch.randint(t5.vocab, (1, self.config.text_tokens), generator=generator).to(self.device)
        clip_ids = torch.randint(clip.vocab, (1, CLIP_TOKENS), generator=generator).to(self.device)
        with self.placement.using("text_encoders"):
            embeds, pooled = t5(t5_ids), clip(clip_ids).mean(dim=1)
        return TextRows(embeds.to(self.dtype), pooled.to(self.dtype))


@contextlib.contextmanager
def _built_on(device: torch.device, dtype: torch.dtype, seed: int):
    default_dtype = torch.get_default_dtype()
    torch.manual_seed(seed)
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), torch.no_grad():
            yield
    finally:
        torch.set_default_dtype(default_dtype)


def build_pipeline(settings, device: torch.device, dtype: torch.dtype, transformer=None,
                   host: bool = False) -> PlannedStandIn:
    """The stand-in with its parts, built on `device` (fast random init), then moved to host memory
    when `host`. The same seeds every time: the same weights."""
    config = settings.stand_in
    if transformer is None:
        transformer = build_transformer(config, device, dtype)
    width, pooled = config.transformer["joint_attention_dim"], config.transformer["pooled_projection_dim"]
    t5_layers, clip_layers = settings.plans_text_layers
    with _built_on(device, dtype, seed=1):
        clip = TextEncoderStandIn(CLIP_VOCAB, pooled, clip_layers, 4 * pooled, gated=False).eval().requires_grad_(False)
        t5 = TextEncoderStandIn(T5_VOCAB, width, t5_layers, 5 * width // 2, gated=True,
                                keep=("wo",)).eval().requires_grad_(False)
        vae = VaeStandIn(settings.plans_vae_parameters)
    pipeline = PlannedStandIn(transformer, config, (clip, t5), vae, device)
    if host:
        pipeline.pipe.to("cpu")
    synchronize(device)
    return pipeline


# ---------------------------------------------------------------------------- one run
@contextlib.contextmanager
def memory_cap(device: torch.device, card_gib: int | None):
    """The caching allocator limited to what a `card_gib` card has free (None: the whole card)."""
    if device.type != "cuda":
        yield "no cap on cpu"
        return
    total = torch.cuda.get_device_properties(device).total_memory
    if card_gib is None:
        yield f"none ({total / GIB:.1f} GiB card)"
        return
    limit = (card_gib - CONTEXT_GIB) * GIB
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), device)
    try:
        yield f"{limit / GIB:.1f} GiB"
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)


@torch.no_grad()
def run_requests(pipeline: PlannedStandIn, size: int, requests: int, steps: int) -> dict:
    """`requests` requests encoded in one stage, `steps` co-batched steps, decoded in one stage;
    an out-of-memory error is the answer "does not fit" (and in which phase)."""
    device, on_cuda = pipeline.device, pipeline.device.type == "cuda"
    gc.collect()
    if on_cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    trips = pipeline.placement.moves["text_encoders"]
    phase, step_times, first = "encoding", [], None
    try:
        started = time.perf_counter()
        with pipeline.placement.stage():
            states = []
            for index in range(requests):
                params = GenerationParams(prompt=f"user {index}", width=size, height=size, num_inference_steps=FULL_STEPS,
                                          guidance_scale=3.5, seed=index)
                states.append(RequestState(request_id=str(index), params=params))
                pipeline.prepare_encode(states[-1])
        synchronize(device)
        encode_s = time.perf_counter() - started
        phase = "denoising"
        for _ in range(steps):
            started = time.perf_counter()
            predictions = pipeline.denoise_step(Batch(tuple(states)))
            for state, prediction in zip(states, predictions):
                pipeline.step_scheduler(state, prediction)
            synchronize(device)
            step_times.append(time.perf_counter() - started)
            if first is None:
                first = torch.cat(predictions).float().cpu()
        phase = "decoding"
        started = time.perf_counter()
        with pipeline.placement.stage(), pipeline.placement.using("vae"):
            for state in states:
                pipeline.post_decode(state)
        decode_s = time.perf_counter() - started
    except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:
        if not isinstance(exc, torch.cuda.OutOfMemoryError) and not any(
                sign in str(exc) for sign in ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED")):
            raise
        return {"fits": False, "error": f"out of memory while {phase}"}
    step_s = sum(step_times[1:]) / (steps - 1) if steps > 1 else step_times[0]  # the first one warms up
    return {
        "fits": True, "encode_s": encode_s, "step_s": step_s, "decode_s": decode_s,
        "images_per_s": requests / (encode_s + FULL_STEPS * step_s + decode_s),
        "text_encoder_trips": pipeline.placement.moves["text_encoders"] - trips,
        "peak_gib": torch.cuda.max_memory_allocated(device) / GIB if on_cuda else None,
        "reserved_gib": torch.cuda.max_memory_reserved(device) / GIB if on_cuda else None,
        "finite": bool(torch.isfinite(first).all()), "first_step": first,
    }


def parity(got: torch.Tensor, want: torch.Tensor) -> dict:
    difference = got - want
    return {"max_abs_diff": float(difference.abs().max()), "relative_rms": float(difference.norm() / want.norm()),
            "exact": bool(torch.equal(got, want))}


# ---------------------------------------------------------------------------- the section
def _auto_pick(sizes, free: int, max_tokens: int, one: int) -> str:
    try:
        choice = choose_plan(sizes, free, max_tokens, one)
    except PlanDoesNotFit:
        return "none fits"
    requests = choice.max_tokens // one
    return f"{choice.plan} ({choice.needed / GIB:.1f} GiB, {requests} request{'s' if requests > 1 else ''} a forward)"


class PlansCheck:
    def __init__(self, settings, section: Section) -> None:
        self.settings, self.section = settings, section
        self.device, self.dtype = torch.device(settings.device), getattr(torch, settings.dtype)
        self.pipeline: PlannedStandIn | None = None
        self.first_steps: dict[str, torch.Tensor] = {}

    def free_pipeline(self) -> None:
        self.pipeline = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def prepare(self, model) -> dict:
        """The shared stand-in's transformer with the parts, and the figures the plans are chosen by."""
        settings = self.settings
        started = time.perf_counter()
        stand_in, _ = model.get()
        transformer = stand_in.transformer
        model.release()  # this section casts the weights to float8: the later sections build their own again
        self.pipeline = build_pipeline(settings, self.device, self.dtype, transformer)
        build_s = time.perf_counter() - started
        place(self.pipeline, "resident")
        estimated = estimated_activation_per_token(self.pipeline.denoisers, self.pipeline.dtype)
        on_cuda = self.device.type == "cuda"
        per_token = measured_activation_per_token(self.pipeline) if on_cuda else estimated
        self.sizes = measure(self.pipeline, per_token)
        self.tokens = settings.plans_requests * image_tokens(settings.plans_size, settings.plans_size)
        one = default_tokens(self.pipeline)  # one request at the model's defaults
        engine_tokens = LoadOptions().batch_requests * 2 * one  # the engine's default token limit
        auto_sizes = measure(self.pipeline, estimated)
        cards = []
        for card in settings.plans_caps_gib:
            free = int((card - CONTEXT_GIB) * GIB)
            cards.append({"card_gib": card, "free_gib": free / GIB, "usable_gib": usable(free) / GIB,
                          "auto_at_load": _auto_pick(auto_sizes, free, engine_tokens, one),
                          "auto_measured": _auto_pick(self.sizes, free, engine_tokens, one)})
        sizes = {name: getattr(self.sizes, name) / GIB for name in
                 ("denoiser", "denoiser_fp8", "largest_block_fp8", "text_encoders", "text_encoders_fp8", "vae")}
        return {"model": self.pipeline.name, "dtype": settings.dtype, "size": settings.plans_size,
                "requests": settings.plans_requests, "tokens_per_forward": self.tokens, "build_s": build_s,
                "activation_per_token": per_token, "activation_source": "measured" if on_cuda else "estimated",
                "activation_per_token_estimated": estimated, "context_gib": CONTEXT_GIB, "sizes_gib": sizes,
                "cards": cards, "full_steps": FULL_STEPS, "fp8_relative_tolerance": FP8_RELATIVE_TOLERANCE}

    def predicted(self, plan: str, card: int) -> dict:
        free = int((card - CONTEXT_GIB) * GIB)
        peak = self.sizes.peak(plan, self.tokens)
        return {"predicted_fits": peak <= usable(free), "predicted_peak_gib": peak / GIB}

    def run_plan(self, plan: str) -> tuple[dict, list[dict]]:
        settings, device = self.settings, self.device
        started = time.perf_counter()
        if plan == "lowvram":  # from fresh weights in host memory, as the loader holds a model
            self.free_pipeline()
            self.pipeline = build_pipeline(settings, device, self.dtype, host=True)
        if plan != "resident":
            place(self.pipeline, plan)
        synchronize(device)
        on_cuda = device.type == "cuda"
        summary = {"plan": plan, "place_s": time.perf_counter() - started,
                   "allocated_after_placing_gib": torch.cuda.memory_allocated(device) / GIB if on_cuda else None,
                   "predicted_on_device_gib": self.sizes.weights_on_device(plan) / GIB}
        with memory_cap(device, None) as cap:
            uncapped = run_requests(self.pipeline, settings.plans_size, settings.plans_requests, settings.plans_steps)
        first = uncapped.pop("first_step", None)
        summary["uncapped"] = {"cap": cap, **uncapped}
        if first is not None:
            self.first_steps[plan] = first
            resident = self.first_steps.get("resident")
            summary["against_resident"] = None if resident is None else parity(first, resident)
            if plan == "lowvram" and "fp8" in self.first_steps:  # the same float8 weights, streamed block by block
                summary["against_fp8"] = parity(first, self.first_steps["fp8"])
        rows, failed_at = [], None if uncapped["fits"] else "the whole card"
        for card in settings.plans_caps_gib:
            row = {"card_gib": card, "plan": plan, **self.predicted(plan, card)}
            if failed_at is not None:
                rows.append({**row, "fits": False, "measured": False, "error": f"did not fit {failed_at}"})
                continue
            estimate = 1.3 * (uncapped["encode_s"] + uncapped["step_s"] + uncapped["decode_s"])
            if not self.section.fits(estimate):
                self.section.skip(f"plan {plan} on a {card} GB card", estimate)
                continue
            with memory_cap(device, card) as cap:
                run = run_requests(self.pipeline, settings.plans_size, settings.plans_requests, 1)
            run.pop("first_step", None)
            rows.append({**row, "cap": cap, "measured": True, **run})
            if not run["fits"]:
                failed_at = f"{card} GB"
        summary["seconds"] = time.perf_counter() - started
        return summary, rows


def measure_plans(settings, section: Section, model) -> dict:
    check = PlansCheck(settings, section)
    try:
        result = check.prepare(model)
        plans, rows, last_s = [], [], 0.0
        for plan in PLANS:
            estimate = 1.5 * last_s + (2 * result["build_s"] if plan == "lowvram" else 0.0)
            done = section.run_if_it_fits(f"plan {plan}: placed, {settings.plans_requests} requests uncapped and under "
                                          f"each cap", estimate, lambda plan=plan: check.run_plan(plan))
            if done is None:
                continue
            summary, plan_rows = done
            plans.append(summary)
            rows.extend(plan_rows)
            last_s = summary.get("seconds", summary["place_s"])
        return {**result, "plans": plans, "rows": rows}
    finally:
        check.free_pipeline()
