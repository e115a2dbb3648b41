"""`EngineClient` is the one engine interface of the studio: `Engine` and the Ray Serve facade
both offer every member of it, with signatures a caller can use the same way on either."""

from __future__ import annotations

import inspect

import pytest

from engine import ClientMetrics, Engine, EngineClient, GenerationParams, PreparedRequest
from engine.cost import request_cost
from engine.models import ModelBatchKey
from pipelines.toy import ToyPipeline


def protocol_members(protocol: type) -> dict[str, object]:
    """The members a protocol declares (methods and properties), by name."""
    return {name: value for name, value in vars(protocol).items()
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))}


def incompatibilities(protocol: type, implementation: object) -> list[str]:
    """What `implementation` (a made, not necessarily started, instance) lacks of `protocol`."""
    problems = []
    cls = type(implementation)
    for name, declared in protocol_members(protocol).items():
        found = inspect.getattr_static(cls, name, None)
        if isinstance(declared, property):
            # A property, or a plain attribute the constructor sets.
            if not isinstance(found, property) and name not in vars(implementation):
                problems.append(f"{name}: missing (a property or attribute)")
            continue
        if not inspect.isfunction(found):
            problems.append(f"{name}: missing (a method)")
            continue
        problems += [f"{name}: {problem}" for problem in _signature_problems(declared, found)]
    return problems


def _signature_problems(declared, found) -> list[str]:
    wanted = list(inspect.signature(declared).parameters.values())[1:]  # without self
    offered = list(inspect.signature(found).parameters.values())[1:]
    by_name = {p.name: p for p in offered}
    problems = []
    for position, param in enumerate(wanted):
        mine = by_name.get(param.name)
        if mine is None:
            problems.append(f"no parameter {param.name!r}")
            continue
        if mine.kind != param.kind:
            problems.append(f"{param.name!r} is {mine.kind.description}, not {param.kind.description}")
        if param.kind is param.POSITIONAL_OR_KEYWORD and offered.index(mine) != position:
            problems.append(f"{param.name!r} is at position {offered.index(mine)}, not {position}")
        if param.default is not param.empty and mine.default is param.empty:
            problems.append(f"{param.name!r} has no default")
    extra = [p.name for p in offered if p.name not in {w.name for w in wanted}
             and p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    problems += [f"requires {name!r}, which callers never pass" for name in extra]
    return problems


def test_the_interface_lists_what_the_studio_uses():
    assert set(protocol_members(EngineClient)) == {
        "models", "info", "infos", "limits", "limits_for", "mode", "max_batch_requests",
        "prepare_params", "prepare", "submit", "cancel",
        "pause_queue", "resume_queue", "move_request", "clear_queue", "pause_engine", "resume_engine",
        "pause_reason", "pause_state", "watch_pauses",
        "snapshot", "metrics", "is_alive", "accepting", "failure",
        "shutdown", "wait_stopped", "close",
    }


def test_the_engine_implements_the_interface():
    engine = Engine(ToyPipeline())
    assert incompatibilities(EngineClient, engine) == []
    assert isinstance(engine, EngineClient) and isinstance(engine.metrics, ClientMetrics)


def test_the_ray_serve_facade_implements_the_interface():
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install -e '.[serve]')")
    from serve.replicated_engine import ReplicatedEngine

    facade = ReplicatedEngine(handle=None)  # never started: only its members are looked at
    assert incompatibilities(EngineClient, facade) == []
    assert isinstance(facade.metrics, ClientMetrics)
    facade.close(timeout=5)
    assert not facade.accepting and facade.wait_stopped(0)


def test_a_missing_member_or_an_incompatible_signature_is_named():
    class Partial:
        def __init__(self) -> None:
            self.models = None

        def submit(self, params, session_id="default"):  # no from_waiting_queue
            return None

        def cancel(self, session_id, request_id, *, admin=False):  # swapped
            return False

        def shutdown(self, reason, force):  # no default; a required extra
            return None

    problems = incompatibilities(EngineClient, Partial())
    assert "submit: no parameter 'from_waiting_queue'" in problems
    assert "cancel: 'request_id' is at position 1, not 0" in problems
    assert "shutdown: 'reason' has no default" in problems
    assert "shutdown: requires 'force', which callers never pass" in problems
    assert "info: missing (a property or attribute)" in problems
    assert "snapshot: missing (a method)" in problems
    assert not any(problem.startswith("models:") for problem in problems)


def test_prepare_gives_the_complete_params_the_batch_key_and_the_cost_that_submit_uses():
    pipeline = ToyPipeline()
    engine = Engine(pipeline)
    prepared = engine.prepare(GenerationParams(prompt="a red circle", seed=5, width=32, height=48))
    assert isinstance(prepared, PreparedRequest)
    assert prepared.params == engine.prepare_params(GenerationParams(prompt="a red circle", seed=5, width=32, height=48))
    assert (prepared.params.model, prepared.params.num_inference_steps, prepared.params.seed) == ("toy", 8, 5)
    assert prepared.batch_key == ModelBatchKey("toy", pipeline.batch_key(prepared.params))
    assert prepared.cost == request_cost(pipeline, pipeline.info, prepared.params)
    assert (prepared.cost.rows, prepared.cost.tokens, prepared.cost.steps) == (1, 4 * 6, 8)
    with pytest.raises(ValueError, match="width=33"):
        engine.prepare(GenerationParams(prompt="x", width=33))
    # submit admits exactly what prepare answers: the same seed-complete params and cost.
    handle = engine.submit(GenerationParams(prompt="a red circle", seed=5, width=32, height=48), session_id="s")
    assert handle.params == prepared.params
    engine.close()
