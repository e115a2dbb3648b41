"""Engine replicas on Ray Serve behind the same studio and APIs (the optional `serve` extra).

    python app.py --replicas 2                         # a local Ray cluster, 2 engine replicas
    serve run serve/stepstudio.yaml                    # the same on an existing Ray cluster

One Serve replica (`serve.replica.EngineReplica`) wraps one `engine.Engine` on one device. The
studio talks to them through `serve.replicated_engine.ReplicatedEngine`, an `engine.EngineClient`
as one local `Engine` is, so `studio/` runs on it unchanged.
Requests are routed by `serve.router.BatchKeyRouter`, a Ray Serve request router: to a replica
that already runs their batch key and has room, otherwise to the least loaded one.

Nothing here is imported by `engine/`, `studio/` or the default code path of `app.py`; Ray is
only needed once `--replicas` is given (`pip install -e '.[serve]'`).
"""
