"""Memory plans: how a model's components share one device's memory, and which plan fits.

    resident   every component on the device (fastest; what a large card runs)
    offload    the denoiser on the device; text encoders and VAE in host memory, brought to the
               device for each batched encode or decode (pipelines/component_placement.py)
    fp8        offload, and the weights of the denoiser and the text encoders stored in float8
               (e4m3), computed in the serving dtype layer by layer (diffusers' layerwise
               casting): half the bytes
    lowvram    fp8, and the denoiser's blocks in host memory too, each brought to the device for
               its turn in the forward (diffusers' block-level group offloading): the slowest

`auto` picks the fastest plan whose device memory fits the free memory with room for the
activations of the engine's token limit, lowering that limit when it must (`choose_plan`, pure
arithmetic on the figures read at load: tested as a table).
"""

from __future__ import annotations

from dataclasses import dataclass

PLANS = ("resident", "offload", "fp8", "lowvram")  # fastest first
MEMORY_CHOICES = ("auto", *PLANS)
GIB = 2**30
# Kept free besides what the arithmetic counts: the CUDA context's own share, allocator
# fragmentation, kernels' workspaces.
RESERVE_FRACTION = 0.08
RESERVE_MIN_BYTES = GIB // 2


@dataclass(frozen=True)
class ModelBytes:
    """One model's figures, in bytes (at the serving dtype unless said)."""

    denoiser: int  # every denoiser (Wan 2.2: both experts)
    denoiser_fp8: int  # the same with its castable layers' weights in float8
    largest_block_fp8: int  # the largest transformer block in float8 (lowvram holds two at a time)
    denoiser_outside_blocks_fp8: int  # embedders, norms, projections: on the device under lowvram
    text_encoders: int
    text_encoders_fp8: int
    vae: int
    activation_per_token: int  # a denoise forward's peak above the weights, per latent token
    encode_peak: int = 0  # a batched encode's activations
    decode_peak: int = 0  # a batched decode's activations

    def weights_on_device(self, plan: str) -> int:
        """The bytes the plan keeps on the device between uses."""
        if plan == "resident":
            return self.denoiser + self.text_encoders + self.vae
        if plan == "offload":
            return self.denoiser
        if plan == "fp8":
            return self.denoiser_fp8
        if plan == "lowvram":
            return self.denoiser_outside_blocks_fp8 + 2 * self.largest_block_fp8  # one running, one arriving
        raise ValueError(f"memory plan {plan!r} is not one of {', '.join(PLANS)}.")

    def peak(self, plan: str, tokens: int) -> int:
        """The device memory the plan needs at its busiest with `tokens` latent tokens per forward:
        the kept weights plus the largest of a forward, an encode group (text encoders, and the
        VAE for init images) and a decode group (never at once: the engine runs them in turn)."""
        forward = self.activation_per_token * tokens
        if plan == "resident":
            return self.weights_on_device(plan) + max(forward, self.encode_peak, self.decode_peak)
        text_encoders = self.text_encoders if plan == "offload" else self.text_encoders_fp8
        return self.weights_on_device(plan) + max(
            forward, text_encoders + self.vae + self.encode_peak, self.vae + self.decode_peak)


@dataclass(frozen=True)
class PlanChoice:
    plan: str
    max_tokens: int  # the engine's token limit under the plan (lowered when it had to be)
    needed: int  # the plan's peak at that limit, in bytes
    free: int  # the free device memory it was chosen for
    lowered: bool  # the limit had to be lowered below the one asked for

    def describe(self) -> str:
        lowered = " (lowered to fit)" if self.lowered else ""
        return (f"memory plan {self.plan}: needs {self.needed / GIB:.1f} GiB of {self.free / GIB:.1f} GiB free, "
                f"up to {self.max_tokens} tokens per forward{lowered}")


class PlanDoesNotFit(ValueError):
    """No plan fits even one request (or the plan asked for does not fit): the message says what would."""


def token_limit(asked: int | None, pipelines) -> int | None:
    """The engine's token limit: the one asked for (None: the engine's default), lowered to the
    least a memory plan chosen at load left room for (`pipeline.memory_choice`)."""
    lowered = [choice.max_tokens for choice in (getattr(p, "memory_choice", None) for p in pipelines)
               if choice is not None and choice.lowered]
    return min([*lowered, *([asked] if asked else [])]) if lowered else asked


def usable(free: int) -> int:
    return free - max(int(free * RESERVE_FRACTION), RESERVE_MIN_BYTES)


def choose_plan(sizes: ModelBytes, free: int, max_tokens: int, min_tokens: int, plan: str = "auto") -> PlanChoice:
    """The plan for a model with `sizes` on a device with `free` bytes free, and the token limit
    it leaves (at most `max_tokens`, at least `min_tokens`: one request at the model's defaults).
    auto: the fastest plan that holds at least half of `max_tokens` (a faster plan with a somewhat
    smaller batch beats a slower one: lowvram streams the denoiser's weights every step); failing
    that, the fastest that holds one request. Another `plan`: that one, its limit lowered if it
    must. PlanDoesNotFit names the smallest plan that would fit and what it needs."""
    if plan not in MEMORY_CHOICES:
        raise ValueError(f"--memory {plan!r} is not one of {', '.join(MEMORY_CHOICES)}.")
    room = usable(free)
    candidates = PLANS if plan == "auto" else (plan,)
    for enough in (max(min_tokens, max_tokens // 2), min_tokens):
        for name in candidates:
            tokens = _most_tokens(sizes, name, room, max_tokens)
            if tokens >= enough:
                return PlanChoice(name, tokens, sizes.peak(name, tokens), free, lowered=tokens < max_tokens)
    smallest = PLANS[-1]
    needs = sizes.peak(smallest, min_tokens)
    if plan not in ("auto", smallest):
        fits = next((name for name in PLANS if sizes.peak(name, min_tokens) <= room), None)
        hint = f"--memory {fits} fits" if fits else f"the smallest plan, lowvram, needs {_gib(needs)}"
        raise PlanDoesNotFit(
            f"--memory {plan} needs {_gib(sizes.peak(plan, min_tokens))} of device memory for one request, and "
            f"{_gib(free)} is free ({_gib(room)} usable): {hint}.")
    raise PlanDoesNotFit(
        f"no memory plan fits this model in {_gib(free)} of free device memory ({_gib(room)} usable): the smallest, "
        f"--memory lowvram, needs {_gib(needs)} for one request at the default size. Free the device, or serve a "
        f"smaller (quantized) checkpoint.")


def _most_tokens(sizes: ModelBytes, plan: str, room: int, ceiling: int) -> int:
    """The largest token count up to `ceiling` whose peak fits `room` (0 when none does)."""
    if sizes.peak(plan, 0) > room:
        return 0
    if sizes.activation_per_token <= 0:
        return ceiling
    return min(ceiling, (room - sizes.weights_on_device(plan)) // sizes.activation_per_token)


def _gib(value: int) -> str:
    return f"{value / GIB:.1f} GiB"
