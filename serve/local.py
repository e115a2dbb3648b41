"""`python app.py --replicas N`: a local Ray cluster serving the studio over N engine replicas.

Ray starts in this process, Serve's HTTP proxy listens on --host/--port, and the application
of serve/application.py runs until SIGTERM or Ctrl-C; then Serve and Ray are shut down, so no
Ray process outlives the command. Start-up takes Ray and Serve several seconds, then each
replica loads the model.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
from typing import Iterator

from serve.application import (
    APP_NAME,
    ENGINE_DEPLOYMENT,
    build_application,
    engine_deployment,
)
from serve.replicated_engine import ReplicatedEngine
from serve.settings import ServeSettings
from serve.settings import serve_settings_for as settings_for_deployment
from studio.config import StudioOptions

log = logging.getLogger("stepstudio")


def serve_settings_for(options: StudioOptions, replicas: int, torch_threads: int | None = None) -> ServeSettings:
    """app.py's replicas: one GPU each when the model runs on CUDA (--device cuda, or unset on a
    machine with as many GPUs as replicas), else the CPU cores shared out."""
    gpus = 0.0
    if options.device is None or options.device.startswith("cuda"):
        import torch

        if torch.cuda.device_count() >= replicas or (options.device or "").startswith("cuda"):
            gpus = 1.0
    return settings_for_deployment(options, replicas, torch_threads=torch_threads, gpus_per_replica=gpus)


def start_ray(settings: ServeSettings, log_to_driver: bool = True) -> None:
    """A local Ray instance with room for every replica (its CPUs may be oversubscribed)."""
    import ray

    cores = len(os.sched_getaffinity(0))
    ray.init(num_cpus=max(cores, math.ceil(settings.replicas * settings.cpus_per_replica)),
             include_dashboard=False, log_to_driver=log_to_driver)


def stop_ray() -> None:
    """The application first (its studio and engines end while the proxy still answers), then
    Serve's own actors, then Ray itself."""
    import ray
    from ray import serve

    try:
        try:
            serve.delete(APP_NAME)
        finally:
            serve.shutdown()
    finally:
        ray.shutdown()


@contextlib.contextmanager
def local_replicas(settings: ServeSettings, log_to_driver: bool = False) -> Iterator[ReplicatedEngine]:
    """The engine replicas alone on a local Ray cluster (no HTTP proxy, no studio), and a started
    facade over them; everything is shut down on exit. For tests and benchmarks."""
    from ray import serve

    start_ray(settings, log_to_driver=log_to_driver)
    try:
        serve.start(proxy_location="Disabled")
        serve.run(engine_deployment(settings).bind(settings.replica), name=APP_NAME, route_prefix=None)
        engine = ReplicatedEngine(serve.get_deployment_handle(ENGINE_DEPLOYMENT, APP_NAME),
                                  refresh_s=settings.refresh_s).start()
        try:
            yield engine
        finally:
            engine.close()
    finally:
        stop_ray()


def run_local(options: StudioOptions, settings: ServeSettings) -> int:
    """Serve until SIGTERM / Ctrl-C; 0 after a normal stop, 1 when the application failed to start."""
    from ray import serve

    stop = threading.Event()
    start_ray(settings)
    # After ray.init, which installs handlers of its own: ours must be the ones that act.
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        serve.start(http_options={"host": options.host, "port": options.port})
        try:
            serve.run(build_application(options, settings), name=APP_NAME, route_prefix="/")
        except RuntimeError as error:
            log.critical("the application did not start: %s", error)
            return 1
        log.info("model %s on %d engine replicas, serving on http://%s:%d/", options.model, settings.replicas,
                 options.host, options.port)
        stop.wait()
        log.info("stopping: Serve and Ray shut down")
        return 0
    finally:
        stop_ray()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
