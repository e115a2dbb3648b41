"""The Serve application: the studio as ingress in front of N engine replicas.

    StudioIngress (1 replica)  the studio's FastAPI app: HTTP API, Gradio page and API, over a
                               ReplicatedEngine
         |  DeploymentHandle (routed by serve.router.BatchKeyRouter)
    EngineReplica (N)          one engine each, one per GPU (or a share of the CPU cores)

`build_application(options, settings)` is what `python app.py --replicas N` runs on a local
Ray cluster; `app_builder(args)` is the same for a Serve config on an existing cluster
(serve/stepstudio.yaml). The ingress has one replica: Gradio keeps each page's session (its
queue and event streams) in the process that serves it.
"""

from __future__ import annotations

import asyncio
import dataclasses

from ray import serve
from ray.serve.config import RequestRouterConfig

from serve.replica import EngineReplica
from serve.replicated_engine import ReplicatedEngine
from serve.settings import ServeSettings, settings_from_args
from studio.config import StudioOptions

APP_NAME = "stepstudio"
ENGINE_DEPLOYMENT = "EngineReplica"
STUDIO_DEPLOYMENT = "StudioIngress"
# Every open page, Gradio event stream and HTTP call is an ongoing request of the ingress.
STUDIO_MAX_ONGOING = 4096
# How long a stopping replica waits for its ongoing calls (an open page's event stream never ends).
STOP_GRACE_S = 5.0


@serve.ingress()
class StudioIngress:
    """The studio app over the replicas (built once the facade knows the model)."""

    async def __init__(self, engines, options: StudioOptions, refresh_s: float) -> None:
        self.options = options
        self.engine = ReplicatedEngine(engines, refresh_s=refresh_s)
        await asyncio.to_thread(self.engine.start)  # waits for a replica to load its model

    def __serve_build_asgi_app__(self):
        from studio.app import build_app

        return build_app(self.engine, self.options)

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()


def engine_deployment(settings: ServeSettings):
    """The EngineReplica deployment: N replicas, each with its CPUs/GPUs, routed by batch key."""
    return serve.deployment(
        EngineReplica,
        name=ENGINE_DEPLOYMENT,
        num_replicas=settings.replicas,
        max_ongoing_requests=settings.max_ongoing_requests,
        ray_actor_options={"num_cpus": settings.cpus_per_replica, "num_gpus": settings.gpus_per_replica},
        request_router_config=RequestRouterConfig(
            request_router_class="serve.router.BatchKeyRouter",
            request_router_kwargs={"max_batch_requests": settings.replica.max_batch},
        ),
        health_check_period_s=5,
        # Stopping: requests still running get this long, then the engine aborts them (Aborted).
        graceful_shutdown_timeout_s=STOP_GRACE_S,
    )


def build_application(options: StudioOptions, settings: ServeSettings):
    """The bound application (`serve.run(build_application(...))`)."""
    if options.share:
        raise ValueError("share=True is not available with replicas: put the Serve proxy behind your own tunnel.")
    engines = engine_deployment(settings).bind(settings.replica)
    studio = serve.deployment(
        StudioIngress, name=STUDIO_DEPLOYMENT, num_replicas=1, max_ongoing_requests=STUDIO_MAX_ONGOING,
        ray_actor_options={"num_cpus": 0}, graceful_shutdown_timeout_s=STOP_GRACE_S,
    )
    return studio.bind(engines, dataclasses.replace(options, share=False), settings.refresh_s)


def app_builder(args: dict):
    """For a Serve config: `import_path: serve.application:app_builder` (see serve/stepstudio.yaml)."""
    options, settings = settings_from_args(args)
    return build_application(options, settings)
