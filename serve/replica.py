"""One engine replica: a Ray Serve replica that owns one `engine.Engine` on one device.

Methods are what the facade (serve/replicated_engine.py) calls through Serve:

    describe()                 the model, limits and engine settings (the same on every replica)
    prepare(params)            the engine's `prepare`: a `PreparedRequest` (its batch key as the
                               repr the router groups by) or `Rejected`
    generate(params, ...)      an async generator: `Admitted` or `Rejected`, then one item per
                               engine event until the final one
    report()                   this replica now: snapshot, metrics, liveness (`ReplicaReport`)
    pause_queue, resume_queue, pause_engine, resume_engine, move_request, clear_queue
                               the engine's own queue calls, broadcast to every replica by the
                               facade (serve/queue_control.py), with this engine's request ids
    apply_pauses(state)        make this engine's pauses `state` (a replica that missed a change)
    unknown_words(prompt, model)  the prompt words a model never learned (when it can tell)
    check_health()             Serve's probe: an engine whose thread stopped fails it, and Serve
                               replaces the replica

`generate` is an async generator so that a cancelled downstream stream (a Cancel click, a
closed tab, a dropped HTTP connection, all arrive as `DeploymentResponseGenerator.cancel()`)
reaches it as CancelledError within milliseconds; its `finally` then aborts the request at the
engine's next step boundary. (A sync generator would only notice at its next yield.)
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections import OrderedDict
from dataclasses import replace
from typing import AsyncIterator

from ray import serve

from engine import AdmissionError, Engine, GenerationParams, PauseState, PreparedRequest, warm_up
from pipelines.memory_plan import token_limit
from serve.settings import ReplicaSettings
from serve.wire import (
    Admitted,
    Answered,
    Rejected,
    ReplicaDescription,
    ReplicaReport,
    event_to_wire,
)

log = logging.getLogger(__name__)

ANSWERS_KEPT = 64  # the latest queue-control answers a replica remembers, to repeat when asked again


def apply_cpu_settings(settings: ReplicaSettings, local_rank: int) -> tuple[int, ...]:
    """Torch threads and, with `pin_cpus`, this process's own cores; returns the cores it may use."""
    cores = tuple(sorted(os.sched_getaffinity(0)))
    if settings.torch_threads is not None:
        import torch

        torch.set_num_threads(settings.torch_threads)
        if settings.pin_cpus:
            count = min(settings.torch_threads, len(cores))
            start = (local_rank * count) % len(cores)
            mine = {cores[(start + i) % len(cores)] for i in range(count)}
            os.sched_setaffinity(0, mine)
            cores = tuple(sorted(mine))
    return cores


def build_pipelines(settings: ReplicaSettings) -> list:
    """The replica's models: `pipeline_factory` when set, else the loader (as app.py loads them)."""
    if settings.pipeline_factory is not None:
        module, _, name = settings.pipeline_factory.partition(":")
        factory = getattr(importlib.import_module(module), name)
        return [factory(**dict(settings.pipeline_kwargs))]
    from pipelines.loader import BUILTIN_LORA_DIR, LoadOptions, load_models

    options = LoadOptions(device=settings.device, dtype=settings.dtype, compile_denoiser=settings.compile,
                          memory=settings.memory, batch_tokens=settings.max_tokens, batch_requests=settings.max_batch,
                          denoiser_file=settings.denoiser_file,
                          prompt_cache_size=settings.prompt_cache, loras=settings.loras,
                          lora_folders=(str(BUILTIN_LORA_DIR), settings.lora_folder), step_cache=settings.step_cache)
    return load_models((settings.model, *settings.more_models), options)


class EngineReplica:
    def __init__(self, settings: ReplicaSettings) -> None:
        context = serve.get_replica_context()
        self.replica_id = context.replica_id.unique_id
        rank = getattr(context, "rank", None)
        self.label = f"replica {rank.rank}" if rank is not None else f"replica {self.replica_id}"
        self.answered: OrderedDict[str, object] = OrderedDict()  # queue-control call id -> answer, the latest
        self.cores = apply_cpu_settings(settings, rank.local_rank if rank is not None else 0)
        pipelines = build_pipelines(settings)
        self.device = str(getattr(pipelines[0], "device", settings.device or "cpu"))
        self.engine = Engine(pipelines, mode=settings.mode, max_batch_requests=settings.max_batch,
                             limits=settings.limits, max_batch_tokens=token_limit(settings.max_tokens, pipelines)).start()
        if settings.compile:
            defaults = self.engine.info.defaults
            warm_up(self.engine, [(defaults.width, defaults.height)])
        log.info("%s: %s on %s, cores %s", self.label, self.engine.info.name, self.device, self.cores)

    async def describe(self) -> ReplicaDescription:
        engine = self.engine
        names = engine.models.names
        return ReplicaDescription(
            infos=dict(engine.infos), limits={name: engine.limits_for(name) for name in names}, mode=engine.mode,
            max_batch_requests=engine.max_batch_requests, unit_cost=engine.unit_cost,
            with_unknown_words=frozenset(n for n in names if callable(getattr(engine.models[n], "unknown_words", None))),
        )

    async def prepare(self, params: GenerationParams) -> PreparedRequest | Rejected:
        try:
            prepared = self.engine.prepare(params)  # names the model: params.model is set from here on
        except ValueError as error:
            return Rejected.of(error, self.replica_id)
        # The router compares keys as text across processes: equal keys have equal reprs.
        return replace(prepared, batch_key=repr(prepared.batch_key))

    async def generate(
        self, params: GenerationParams, session_id: str, batch_key: str | None = None, avoid: tuple[str, ...] = ()
    ) -> AsyncIterator[object]:
        # batch_key and avoid are for the router (serve/router.py); the engine keys by itself.
        try:
            handle = self.engine.submit(params, session_id=session_id)
        except (ValueError, AdmissionError) as error:
            yield Rejected.of(error, self.replica_id)
            return
        yield Admitted(handle.request_id, self.replica_id, self.label)
        try:
            async for event in handle.stream():
                yield event_to_wire(event)
        finally:
            handle.cancel()  # cancelled or closed early: abort at the next step boundary (a no-op once ended)

    async def report(self) -> ReplicaReport:
        engine = self.engine
        return ReplicaReport(
            replica_id=self.replica_id, replica=self.label, pid=os.getpid(), device=self.device,
            clock=time.perf_counter(), snapshot=engine.snapshot(), metrics=engine.metrics.exposition(),
            alive=engine.is_alive, failure=engine.failure,
        )

    # ------------------------------------------------------------------ queue control (broadcast)
    # Each answers `Answered(replica id, value)`, or None when `only` names other replicas (the
    # facade asking again the ones a broadcast missed: the others already did it once). `call_id`
    # names the facade's call: asked again for one it already did (its answer was lost on the
    # way), a replica repeats that answer instead of doing it twice (a second clear would count 0).
    async def pause_queue(self, session_id: str, abort_running: bool = False, until: float | None = None,
                          only: frozenset[str] | None = None, call_id: str | None = None) -> Answered | None:
        return self._answer(only, call_id,
                            lambda: self.engine.pause_queue(session_id, abort_running=abort_running, until=until))

    async def resume_queue(self, session_id: str, only: frozenset[str] | None = None,
                           call_id: str | None = None) -> Answered | None:
        return self._answer(only, call_id, lambda: self.engine.resume_queue(session_id))

    async def pause_engine(self, only: frozenset[str] | None = None, call_id: str | None = None) -> Answered | None:
        return self._answer(only, call_id, self.engine.pause_engine)

    async def resume_engine(self, only: frozenset[str] | None = None, call_id: str | None = None) -> Answered | None:
        return self._answer(only, call_id, self.engine.resume_engine)

    async def move_request(self, request_id: str, session_id: str, before: str | None = None,
                           only: frozenset[str] | None = None, call_id: str | None = None) -> Answered | None:
        """False on the replicas that don't hold the request (all but one)."""
        return self._answer(only, call_id, lambda: self.engine.move_request(request_id, session_id, before=before))

    async def clear_queue(self, session_id: str, include_running: bool = False,
                          only: frozenset[str] | None = None, call_id: str | None = None) -> Answered | None:
        return self._answer(only, call_id,
                            lambda: self.engine.clear_queue(session_id, include_running=include_running))

    def _answer(self, only: frozenset[str] | None, call_id: str | None, call) -> Answered | None:
        if only is not None and self.replica_id not in only:
            return None
        answered = self.answered
        if call_id is not None and call_id in answered:
            return Answered(self.replica_id, answered[call_id])
        value = call()
        if call_id is not None:
            answered[call_id] = value
            while len(answered) > ANSWERS_KEPT:
                answered.popitem(last=False)
        return Answered(self.replica_id, value)

    async def apply_pauses(self, state: PauseState) -> None:
        """Make this engine's pauses `state`: the facade's, told whole when this replica missed a change."""
        engine = self.engine
        (engine.pause_engine if state.engine else engine.resume_engine)()
        for session in engine.pause_state.sessions - state.sessions:
            engine.resume_queue(session)
        for session in sorted(state.sessions):
            engine.pause_queue(session, until=state.ends_at(session))

    async def unknown_words(self, prompt: str, model: str | None = None) -> tuple[str, ...]:
        finder = getattr(self.engine.models[model], "unknown_words", None)
        return tuple(finder(prompt)) if finder is not None else ()

    async def check_health(self) -> None:
        if not self.engine.is_alive:
            raise RuntimeError(f"the engine of {self.label} stopped: {self.engine.failure or 'closed'}")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown("this engine replica is stopping")
