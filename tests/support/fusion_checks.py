"""Helpers shared by the graph-pass tests: run passes on a ModelProto, count
ops, prove from an ORT profile which EP ran each node, and run an exported
decoder step by step with forced tokens, on inputs whose expert routing
is not a near-tie."""

from __future__ import annotations

import glob
import json
import os
from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir

from support.export_reference import position_ids

UNFUSED_MOE_OPS = ("NonZero", "ScatterElements", "OneHot")


def as_bytes(model: onnx.ModelProto | ir.Model) -> bytes:
    if isinstance(model, ir.Model):
        model = ir.to_proto(model)
    return model.SerializeToString()


def op_counts(model: onnx.ModelProto | ir.Model) -> Counter:
    nodes = model.graph.node if isinstance(model, onnx.ModelProto) else model.graph
    return Counter(n.op_type for n in nodes)


def run_pass(apply, model: onnx.ModelProto, **options):
    """(rewritten ir.Model, PassReport) of one pass on a copy of `model`."""
    copy = ir.serde.deserialize_model(model)
    return copy, apply(copy, **options)


def profile_nodes(path: str) -> dict[str, str]:
    """{node name: provider} from an ORT profiling JSON (kernel events);
    conftest.profile_node_providers keys by op type instead."""
    with open(path) as f:
        events = json.load(f)
    out = {}
    for ev in events:
        args = ev.get("args", {})
        if ev.get("cat") == "Node" and "provider" in args and ev["name"].endswith("_kernel_time"):
            out[ev["name"][: -len("_kernel_time")]] = args["provider"]
    return out


def node_providers(sess, run) -> dict[str, str]:
    """{node name: provider} of every node that ran during `run()`, from the
    ORT profile of `sess` (which must have profiling enabled)."""
    run()
    path = sess.end_profiling()
    try:
        return profile_nodes(path)
    finally:
        for p in glob.glob(path):
            os.remove(p)


def moe_node_names(model: ir.Model) -> list[str]:
    return [n.name for n in model.graph if n.op_type == "MoE" and n.domain == "com.microsoft"]


MOE_WEIGHTS = ("fc1", "fc1_bias", "fc2", "fc2_bias", "fc3", "fc3_bias")  # MoE inputs 2..7


def tap_moe_nodes(path: str) -> tuple[bytes, list[dict]]:
    """The model at `path` with, for each com.microsoft::MoE node, its tokens,
    router logits and output added to the graph outputs -- on their float
    side of the Casts the dtype pass puts around a 16-bit node -- and per
    node a dict: name, x / logits / out (output names), weights (float64,
    by moe_reference's names) and attrs (the node's attributes)."""
    model = onnx.load(path)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {out: n for n in graph.node for out in n.output}
    casts_of = {}
    for n in graph.node:
        if n.op_type == "Cast":
            casts_of.setdefault(n.input[0], []).append(n)

    def before_cast(name):
        n = producer.get(name)
        return n.input[0] if n is not None and n.op_type == "Cast" else name

    sites = []
    for node in graph.node:
        if node.op_type != "MoE" or node.domain != "com.microsoft":
            continue
        out = node.output[0]
        out = casts_of[out][0].output[0] if len(casts_of.get(out, [])) == 1 else out
        weights = {key: onnx.numpy_helper.to_array(inits[name]).astype(np.float64)
                   for key, name in zip(MOE_WEIGHTS, node.input[2:8]) if name}
        attrs = {}
        for a in node.attribute:
            value = onnx.helper.get_attribute_value(a)
            attrs[a.name] = value.decode() if isinstance(value, bytes) else value
        site = {"name": node.name, "x": before_cast(node.input[0]),
                "logits": before_cast(node.input[1]), "out": out, "weights": weights, "attrs": attrs}
        for key in ("x", "logits", "out"):
            graph.output.append(onnx.helper.make_tensor_value_info(site[key], onnx.TensorProto.FLOAT, None))
        sites.append(site)
    return model.SerializeToString(), sites


# ------------------------------------------------------------ decoder runs


def greedy_steps(sess, ids, mask, decode_steps: int, tokens=None):
    """Prefill + `decode_steps` greedy steps on an optimum-style decoder
    session (input_ids, attention_mask, position_ids, past_key_values.*).
    `tokens` forces the decode tokens (another run's choices) so two models
    see the same inputs. Returns ([{output name: array}] per step, tokens)."""
    batch = ids.shape[0]
    past = {i.name: np.zeros((batch, i.shape[1], 0, i.shape[3]), dtype=np.float32)
            for i in sess.get_inputs() if i.name.startswith("past_key_values.")}
    names = [o.name for o in sess.get_outputs()]
    steps, chosen = [], []
    for step in range(decode_steps + 1):
        pos = position_ids(mask, ids.shape[1])
        outs = dict(zip(names, sess.run(None, {"input_ids": ids, "attention_mask": mask,
                                               "position_ids": pos, **past})))
        steps.append(outs)
        past = {n.replace("present.", "past_key_values."): v for n, v in outs.items()
                if n.startswith("present.")}
        ids = (tokens[step] if tokens is not None else
               outs["logits"][:, -1].argmax(-1)[:, None].astype(np.int64))
        chosen.append(ids)
        mask = np.concatenate([mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
    return steps, chosen


# ------------------------------------------------------------ routing near-ties

# Two router logits closer than this are a coin toss between two fp32 runs
# that differ by rounding upstream (summation order): the other expert is
# picked and that token's output, and every later one attending to it,
# differs by far more than rounding. Inputs with such a tie are redrawn.
ROUTING_MARGIN = 1e-4


def moe_routers(model: onnx.ModelProto | ir.Model) -> dict[str, int]:
    """Router-logit tensor name -> k of each com.microsoft::MoE node. The
    names are the gate MatMul outputs, so they exist in the unfused model too."""
    proto = ir.to_proto(model) if isinstance(model, ir.Model) else model
    routers = {}
    for node in proto.graph.node:
        if node.op_type == "MoE" and node.domain == "com.microsoft":
            k = next(onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "k")
            routers[node.input[1]] = int(k)
    return routers


def with_outputs(model: onnx.ModelProto, names) -> bytes:
    """`model` serialised with the float tensors `names` added as outputs."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for name in names:
        copy.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return copy.SerializeToString()


def routing_margin(steps, routers: dict[str, int]) -> float:
    """The smallest gap between the k-th and (k+1)-th largest router logit
    over every position, MoE layer and step."""
    margin = np.inf
    for outs in steps:
        for name, k in routers.items():
            logits = np.sort(outs[name].reshape(-1, outs[name].shape[-1]), axis=1)[:, ::-1]
            margin = min(margin, float((logits[:, k - 1] - logits[:, k]).min()))
    return margin


def clear_routing_steps(draw, reference, routers: dict[str, int], decode_steps: int, tries: int = 20):
    """Draws batches with `draw()` until `reference` (a session that also
    outputs the `routers` tensors) routes every token of the prefill and
    greedy decode by more than ROUTING_MARGIN. Returns (ids, mask, steps,
    tokens) of that batch."""
    for _ in range(tries):
        ids, mask = draw()
        steps, tokens = greedy_steps(reference, ids, mask, decode_steps)
        if routing_margin(steps, routers) > ROUTING_MARGIN:
            return ids, mask, steps, tokens
    raise AssertionError(f"{tries} batches in a row had a router near-tie: routing_margin is broken")


# ------------------------------------------------------------ a pass, before and after

def pass_pair(path, before: list[str], added: str, **options):
    """(model after `before`, model after `before` + `added`, the added pass's
    report), each a fresh load of the export at `path`."""
    from hinamoe.graph_passes import run_passes

    first, _ = run_passes(ir.load(str(path)), only=before, **options)
    second, report = run_passes(ir.load(str(path)), only=before + [added], **options)
    return first, second, report.passes[-1]


def random_left_padded(rng: np.random.Generator, vocab: int):
    """A batch of 2 rows, 5-8 and 2-4 real tokens, left-padded."""
    from support.export_reference import left_padded_batch

    return left_padded_batch(rng, vocab, lengths=(int(rng.integers(5, 9)), int(rng.integers(2, 5))))


def assert_same_model(before: ir.Model, after: ir.Model, make_session, rng: np.random.Generator,
                      decode_steps: int, rel: float | None) -> None:
    """Prefill + greedy decode of a fresh left-padded batch (redrawn where
    the routing is a near-tie) on `make_session(bytes)` of each model: every
    output of every step within `rel` of the largest |value|, or bit for
    bit equal with `rel` None."""
    before_proto = ir.to_proto(before)
    routers = moe_routers(before_proto)
    vocab = after.graph.outputs[0].shape[-1]
    ids, mask, want, tokens = clear_routing_steps(lambda: random_left_padded(rng, vocab),
                                                  make_session(with_outputs(before_proto, routers)),
                                                  routers, decode_steps)
    got, _ = greedy_steps(make_session(ir.to_proto(after).SerializeToString()), ids, mask, decode_steps,
                          tokens=tokens)
    for step, (g, w) in enumerate(zip(got, want)):
        for name in g:
            if rel is None:
                assert np.array_equal(g[name], w[name]), f"step {step} {name}"
                continue
            scale = float(np.abs(w[name]).max()) + 1e-6
            err = float(np.abs(g[name] - w[name]).max())
            assert err <= rel * scale, f"step {step} {name}: {err:.3g} > {rel * scale:.3g}"


def session_maker(ep: str):
    """model bytes -> session: ORT's CPU EP ("CPU"), or HinaMoE with the CPU
    EP behind it for the nodes it does not claim ("HinaMoE")."""
    from support.sessions import cpu_session, hina_session

    if ep == "CPU":
        return cpu_session
    return lambda model: hina_session(model, no_fallback=False, cpu_fallback_provider=True)
