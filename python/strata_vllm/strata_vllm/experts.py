"""The two methods that replace vLLM's CPU experts (see the package docs)."""

import strata.ops
import torch


def _unsupported(self, layer):
    """Why Strata cannot compute this layer, or None."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    cfg = self.moe_config
    if cfg.activation != MoEActivation.SILU:
        return f"activation {cfg.activation} (Strata's experts compute SiLU(gate) * up)"
    for name in ("w13_bias", "w2_bias"):
        if getattr(layer, name, None) is not None:
            return f"expert biases ({name})"
    w13, w2 = layer.w13_weight, layer.w2_weight
    if w13.dim() != 3 or w2.dim() != 3:
        return f"weights of {w13.dim()} and {w2.dim()} dimensions, expected [E, 2I, H] and [E, H, I]"
    e, two_i, h = w13.shape
    if tuple(w2.shape) != (e, h, two_i // 2) or two_i % 2:
        return f"w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} are not [E, 2I, H] and [E, H, I]"
    if w13.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"weights of dtype {w13.dtype}"
    if w13.device.type != "cpu":
        return f"weights on {w13.device}"
    return None


def _drop(layer):
    """Replaces the layer's raw `w13`/`w2` by stand-ins of the same shape over one element
    (vLLM still reads their shapes, never their values once Strata computes the layer);
    returns the bytes released."""
    freed = 0
    for name in ("w13_weight", "w2_weight"):
        p = getattr(layer, name)
        freed += p.data.numel() * p.data.element_size()
        p.data = p.data.new_zeros(()).expand(p.data.shape)
    return freed


def pack(w13, w2, fmt):
    """One layer's experts, vLLM's `w13 [E, 2I, H]` and `w2 [E, H, I]`, in Strata's format."""
    return strata.ops.MoeWeights(w2, w13=w13, format=fmt)


def forward(weights, output, hidden_states, topk_weights, topk_ids, expert_map):
    """The routed experts of `hidden_states [T, H]` into vLLM's `output [T, H]`."""
    if expert_map is not None:
        # Expert parallelism: global ids to this rank's; others weigh 0.
        local = expert_map[topk_ids.long()]
        topk_weights = torch.where(local >= 0, topk_weights, 0)
        topk_ids = local.clamp(min=0)
    ids = topk_ids if topk_ids.dtype in (torch.int32, torch.int64) else topk_ids.long()
    w = topk_weights.float().contiguous()
    ids = ids.contiguous()
    if hidden_states.dtype == output.dtype and hidden_states.dtype in _IN_PLACE:
        # In place (DLPack): Strata reads vLLM's activations and writes its output buffer;
        # bfloat16 is converted in Rust.
        strata.ops.fused_moe_into(hidden_states.contiguous(), weights, w, ids, output)
    else:
        # Float16 models: the kernels take f32 activations, so one conversion each way.
        out = torch.empty(output.shape, dtype=torch.float32)
        strata.ops.fused_moe_into(hidden_states.float().contiguous(), weights, w, ids, out)
        output.copy_(out)


# Activation dtypes Strata reads and writes in vLLM's own tensors.
_IN_PLACE = (torch.float32, torch.bfloat16)


def patch(cls, fmt, state, logger, warn):
    """Replaces `cls.process_weights_after_loading` and `cls.apply` (vLLM's CPU experts)."""
    vllm_process = cls.process_weights_after_loading
    vllm_apply = cls.apply

    def process_weights_after_loading(self, layer):
        reason = _unsupported(self, layer)
        if reason is not None:
            warn("a MoE layer stays on vLLM's CPU kernels: %s", reason)
            self._strata = None
            return vllm_process(self, layer)
        try:
            self._strata = pack(layer.w13_weight.data, layer.w2_weight.data, fmt)
        except (TypeError, ValueError) as e:
            warn("a MoE layer stays on vLLM's CPU kernels: packing failed: %s", e)
            self._strata = None
            return vllm_process(self, layer)
        # vLLM's prepacked copy is not made, and the raw weights are dropped: Strata's
        # packed copy is the only one left.
        state["raw_bytes_freed"] = state.get("raw_bytes_freed", 0) + _drop(layer)
        state["layers"] += 1
        return None

    def apply(
        self,
        output,
        hidden_states,
        w1,
        w2,
        topk_weights,
        topk_ids,
        activation,
        global_num_experts,
        expert_map,
        a1q_scale,
        a2_scale,
        workspace13,
        workspace2,
        expert_tokens_meta,
        apply_router_weight_on_input,
    ):
        weights = getattr(self, "_strata", None)
        if weights is None:
            return vllm_apply(
                self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation,
                global_num_experts, expert_map, a1q_scale, a2_scale, workspace13,
                workspace2, expert_tokens_meta, apply_router_weight_on_input,
            )
        if not state["announced"]:
            state["announced"] = True
            logger.info(
                "Strata computes vLLM's MoE: %d MoE layers on strata.ops (format %s, %d "
                "experts, hidden %d, intermediate %d per rank; vLLM's raw expert weights "
                "freed: %.1f MiB; %d threads)",
                state["layers"], weights.format, weights.num_experts, weights.hidden_size,
                weights.intermediate_size, state.get("raw_bytes_freed", 0) / 2**20,
                strata.ops.num_threads(),
            )
        # apply_router_weight_on_input is already applied to hidden_states by vLLM's
        # prepare step (see vLLM's own apply).
        forward(weights, output, hidden_states, topk_weights, topk_ids, expert_map)
        return None

    cls.process_weights_after_loading = process_weights_after_loading
    cls.apply = apply
