"""A model folder to a running app: session, engine and routes, with the
engine stopped when the app shuts down."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from .engine import Engine
from .model_folder import read_model_folder
from .runner import Runner, make_session


@dataclass
class ServeOptions:
    ep: str = "HinaMoE"                  # or "cpu": ORT's CPU EP alone
    strict: bool = True                  # HinaMoE: fail when it would leave an op it claims to the CPU EP
    provider_options: dict = field(default_factory=dict)   # e.g. {"isa": "avx2", "numa": "off"}
    threads: int = 0                     # intra-op threads (0: ORT's default, one per core)
    parallel: int = 4                    # sequences decoded together
    max_queue: int = 64                  # requests waiting beyond them; more get 429
    context_length: int = 0              # 0: the model's, at most 4096
    prefill_chunk: int = 512             # prompt tokens per prefill call
    model_name: str | None = None        # the id clients send (default: the folder's name)
    api_key: str | None = None


def load_engine(model_dir, opts: ServeOptions):
    """``(engine, tokenizer, model name)`` of a model folder."""
    folder = read_model_folder(model_dir, opts.context_length)
    provider_options = dict(opts.provider_options)
    if opts.ep == "HinaMoE":
        provider_options.setdefault("strict", "1" if opts.strict else "0")
    sess = make_session(folder.model_file, opts.ep, opts.threads, provider_options)
    runner = Runner(sess, folder.layout, folder.kv_shape, folder.rings,
                    share_buffer=folder.share_buffer)
    out_tokenizer = folder.tokenizer()
    eos = set(folder.eos_token_ids)
    if out_tokenizer.eos_token_id is not None:
        eos.add(int(out_tokenizer.eos_token_id))
    engine = Engine(runner, out_tokenizer, eos, context_length=folder.context_length, parallel=opts.parallel,
                    max_queue=opts.max_queue, prefill_chunk=opts.prefill_chunk)
    return engine, folder.tokenizer(), opts.model_name or folder.name


def build_app(model_dir, opts: ServeOptions | None = None):
    """The FastAPI app serving ``model_dir`` (any folder ``read_model_folder``
    takes); its engine is ``app.state.engine``."""
    from .api import create_app

    opts = opts or ServeOptions()
    engine, tokenizer, name = load_engine(model_dir, opts)
    app = create_app(engine, tokenizer, name, opts.api_key)
    app.state.engine = engine

    @contextlib.asynccontextmanager
    async def lifespan(_):
        yield
        engine.stop()

    app.router.lifespan_context = lifespan
    return app
