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
            self._strata = strata.ops.MoeWeights(
                layer.w2_weight.data, w13=layer.w13_weight.data, format=fmt
            )
        except (TypeError, ValueError) as e:
            warn("a MoE layer stays on vLLM's CPU kernels: packing failed: %s", e)
            self._strata = None
            return vllm_process(self, layer)
        # vLLM's prepacked copy is not made: the layer's raw weights stay as loaded.
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
                "experts, hidden %d, intermediate %d per rank)",
                state["layers"], weights.format, weights.num_experts, weights.hidden_size,
                weights.intermediate_size,
            )
        # apply_router_weight_on_input is already applied to hidden_states by vLLM's
        # prepare step (see vLLM's own apply).
        if expert_map is not None:
            # Expert parallelism: global ids to this rank's; others weigh 0.
            local = expert_map[topk_ids.long()]
            topk_weights = torch.where(local >= 0, topk_weights, 0)
            topk_ids = local.clamp(min=0)
        ids = topk_ids if topk_ids.dtype in (torch.int32, torch.int64) else topk_ids.long()
        w = topk_weights.float().contiguous()
        if hidden_states.dtype == torch.float32 and output.dtype == torch.float32:
            # In place: Strata reads vLLM's activations and writes its output buffer.
            strata.ops.fused_moe_into(
                hidden_states.contiguous().numpy(), weights, w.numpy(),
                ids.contiguous().numpy(), output.numpy(),
            )
        else:
            # BF16/F16 models: the kernels take f32 activations, so one conversion each way.
            out = torch.empty(output.shape, dtype=torch.float32)
            strata.ops.fused_moe_into(
                hidden_states.float().contiguous().numpy(), weights, w.numpy(),
                ids.contiguous().numpy(), out.numpy(),
            )
            output.copy_(out)
        return None

    cls.process_weights_after_loading = process_weights_after_loading
    cls.apply = apply
