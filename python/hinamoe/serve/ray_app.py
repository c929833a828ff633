"""hina-serve's app as a Ray Serve deployment: one replica per slice of a
machine or per machine, Ray's HTTP proxy in front, Ray's autoscaler deciding
how many.

    import ray
    from ray import serve
    from hinamoe.serve import ServeOptions
    from hinamoe.serve.ray_app import application

    ray.init()                                    # or ray.init(address="auto") on a cluster
    serve.run(application("/models/qwen3-int4", ServeOptions(parallel=8), num_replicas=2, num_cpus=8))

or from the shell, with Ray's own CLI::

    serve run hinamoe.serve.ray_app:app_builder model_dir=/models/qwen3-int4 num_replicas=2 num_cpus=8

Each replica loads the folder itself (the path must exist on every node)
and runs ONNX Runtime on as many threads as the CPUs Ray gives it.
"""

from __future__ import annotations

import dataclasses

from .server import ServeOptions, build_app


def application(model_dir: str, opts: ServeOptions | None = None, *, num_replicas: int = 1,
                autoscaling_config: dict | None = None, num_cpus: float = 1, name: str = "hina-serve"):
    """A Ray Serve application (``serve.run`` it) serving ``model_dir`` with
    ``opts``; ``num_replicas`` or an ``autoscaling_config`` (Ray's
    dict: ``min_replicas``, ``max_replicas``, ``target_ongoing_requests``
    ...), each replica reserving ``num_cpus`` CPUs and running ONNX Runtime
    on that many threads (unless ``opts.threads`` says otherwise)."""
    from ray import serve

    opts = opts or ServeOptions()
    if num_cpus <= 0:
        raise ValueError(f"num_cpus {num_cpus} must be > 0")
    opts = dataclasses.replace(opts, threads=opts.threads or max(1, int(num_cpus)))
    model_dir = str(model_dir)

    def build():  # runs in each replica
        return build_app(model_dir, opts)

    scaling = {"autoscaling_config": autoscaling_config} if autoscaling_config else {"num_replicas": num_replicas}
    deployment = serve.deployment(
        serve.ingress(build)(), name=name, ray_actor_options={"num_cpus": num_cpus},
        # beyond its slots and queue a replica would answer 429; let Ray route elsewhere first
        max_ongoing_requests=opts.parallel + opts.max_queue, **scaling)
    return deployment.bind()


def app_builder(args: dict):
    """For ``serve run hinamoe.serve.ray_app:app_builder model_dir=... [num_replicas=N]
    [num_cpus=C] [parallel=P] [max_queue=Q] [context_length=T] [isa=...]``."""
    args = dict(args)
    if "model_dir" not in args:
        raise ValueError("serve run ... model_dir=PATH is required")
    model_dir = args.pop("model_dir")
    replicas = int(args.pop("num_replicas", 1))
    cpus = float(args.pop("num_cpus", 1))
    provider = {k: str(args.pop(k)) for k in ("isa", "numa") if k in args}
    fields = {f.name: f.type for f in dataclasses.fields(ServeOptions)}
    unknown = sorted(set(args) - set(fields))
    if unknown:
        raise ValueError(f"unknown argument(s) {unknown}; known: model_dir, num_replicas, num_cpus, isa, numa, "
                         f"{', '.join(k for k in fields if k != 'provider_options')}")
    kw = {}
    for k, v in args.items():
        default = getattr(ServeOptions(), k)
        kw[k] = (str(v).lower() in ("1", "true", "yes")) if isinstance(default, bool) else \
            int(v) if isinstance(default, int) else v
    return application(model_dir, ServeOptions(provider_options=provider, **kw), num_replicas=replicas,
                       num_cpus=cpus)
