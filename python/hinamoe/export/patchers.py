"""Model patchers: make each sparse MoE block traceable over ALL experts.

transformers' sparse MoE blocks loop only over the experts the current batch
hits (``expert_hit = ...nonzero()``). TorchScript tracing would freeze that
list into the graph, so the exported model would only ever run the experts the
dummy input happened to pick. The forward below computes exactly the same
function but visits every expert; an expert no token picked gets an empty
slice of tokens and adds nothing. Every supported block exports to the same
pattern per layer:

    router  MatMul -> Softmax -> TopK -> [ReduceSum/Div] -> OneHot
    expert  NonZero -> Gather -> MatMul(gate) -> SiLU -> Mul(up) -> MatMul(down)
            -> Mul(routing weight) -> ScatterElements/ index add
    shared  (Qwen2-MoE only) Sigmoid(MatMul(gate)) * MLP(x), added at the end

which is what the MoE fusion pass in ``hinamoe.graph_passes`` looks for.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F
from optimum.exporters.onnx.model_patcher import ModelPatcher

# (module, class) of the sparse MoE blocks whose forward is replaced.
SPARSE_MOE_BLOCKS = {
    "mixtral": ("transformers.models.mixtral.modeling_mixtral", "MixtralSparseMoeBlock"),
    "qwen2_moe": ("transformers.models.qwen2_moe.modeling_qwen2_moe", "Qwen2MoeSparseMoeBlock"),
    "qwen3_moe": ("transformers.models.qwen3_moe.modeling_qwen3_moe", "Qwen3MoeSparseMoeBlock"),
}


def sparse_moe_forward_all_experts(self, hidden_states: torch.Tensor):
    """Forward of Mixtral/Qwen2-MoE/Qwen3-MoE sparse blocks over every expert.

    Same maths as transformers 4.57's forward: softmax over all experts in
    float32, top-k, renormalise unless the block says ``norm_topk_prob=False``
    (Mixtral always renormalises), weighted sum of the chosen experts, plus
    Qwen2-MoE's sigmoid-gated shared expert. Returns (hidden, router_logits).
    """
    batch_size, sequence_length, hidden_dim = hidden_states.shape
    x = hidden_states.view(-1, hidden_dim)
    router_logits = self.gate(x)

    routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
    routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)
    if getattr(self, "norm_topk_prob", True):
        routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)
    routing_weights = routing_weights.to(x.dtype)

    final = torch.zeros((batch_size * sequence_length, hidden_dim), dtype=x.dtype, device=x.device)
    # [E, k, T]: which (slot, token) pairs picked each expert.
    expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)
    for expert_idx in range(self.num_experts):
        slot, token = torch.where(expert_mask[expert_idx])
        expert_out = self.experts[expert_idx](x[token]) * routing_weights[token, slot, None]
        final.index_add_(0, token, expert_out.to(x.dtype))

    shared_expert = getattr(self, "shared_expert", None)
    if shared_expert is not None:
        final = final + torch.sigmoid(self.shared_expert_gate(x)) * shared_expert(x)
    return final.reshape(batch_size, sequence_length, hidden_dim), router_logits


class AllExpertsMoePatcher(ModelPatcher):
    """optimum ModelPatcher that swaps in ``sparse_moe_forward_all_experts``
    for every sparse MoE block class present in the model while exporting."""

    def __enter__(self):
        super().__enter__()
        self._saved_forwards = []
        present = {type(m) for m in self._model.modules()}
        for module_name, class_name in SPARSE_MOE_BLOCKS.values():
            cls = getattr(importlib.import_module(module_name), class_name)
            if cls in present:
                self._saved_forwards.append((cls, cls.forward))
                cls.forward = sparse_moe_forward_all_experts
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        for cls, forward in reversed(self._saved_forwards):
            cls.forward = forward
        self._saved_forwards = []
        super().__exit__(exc_type, exc_value, traceback)
