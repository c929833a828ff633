"""hina-serve: an OpenAI-compatible server with continuous batching on
HinaMoE (``hina-serve MODEL_DIR``), and the same app as a Ray Serve
deployment (``hinamoe.serve.ray_app``).

    from hinamoe.serve import ServeOptions, build_app
    app = build_app("qwen3-int4/", ServeOptions(parallel=8, threads=2))   # FastAPI
    uvicorn.run(app)

Pieces: ``model_folder`` (what a folder holds), ``runner`` (one session, a
step at a time), ``kv_batch`` (the running sequences' caches), ``engine``
(the batching loop), ``sampling``, ``text_stream`` (tokens to text, stop
strings), ``schemas`` and ``api`` (HTTP), ``metrics``.
"""

from .engine import Engine, Event, QueueFull, Request
from .model_folder import ModelFolder, ModelFolderError, read_model_folder
from .runner import Runner, make_session
from .sampling import SamplingParams
from .server import ServeOptions, build_app, load_engine

__all__ = ["Engine", "Event", "QueueFull", "Request", "ModelFolder", "ModelFolderError", "read_model_folder",
           "Runner", "make_session", "SamplingParams", "ServeOptions", "build_app", "load_engine"]
