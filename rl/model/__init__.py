"""The megatron-core MoE model the trainer trains and the embedded engine serves.

API (all tensors on CPU in the embedded setup; ids are COMPACT ids, see rl.vocab):

    spec = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128,
                     num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=64,
                     max_seq_len=256, vocab_size=vocab.size)
    policy = build_policy(spec, seed, dtype=torch.float32, unk_id=vocab.unk_id)  # GPTModel
    critic = build_critic(spec, seed)                                            # GPTModel, value head
    logprobs_BT = token_logprobs(policy, ids_BT, targets_BT)  # log p(targets[b,t] | ids[b,:t+1])
    logits_BV   = last_logits(policy, ids_BT)                 # next-token logits at position T-1
    values_BT   = values(critic, ids_BT)
    with record_routing(policy) as rec:                       # rec.rows after the block:
        policy_forward(policy, ids_BT)                        #   list of B arrays int32 [T, L, K]
    with replay_routing(policy, rows):                        # rows: B arrays [T_b <= T, L, K]
        token_logprobs(policy, ids_BT, targets_BT)            # experts from rows, gates live
    save_weights(model, dir)  /  load_weights(model, dir)     # dir/weights.pt (tensors only)
    state = weights_state_dict(model); load_state(model, state)  # for t1ops checkpoints

Model: megatron-core ``GPTModel`` with the local layer spec, every layer MoE,
configured as Qwen3-MoE so that :mod:`rl.hf` maps it exactly onto
``transformers``' ``Qwen3MoeForCausalLM``: RMSNorm (eps 1e-6), grouped-query
attention (``num_query_groups``) with per-head q/k RMSNorm, RoPE (base 1e6,
rotate-half), SwiGLU experts, a softmax top-k router whose top-k weights are
renormalised (megatron: softmax over the top-k logits, the same numbers), no
shared expert, no aux loss, no biases, dropout 0, untied embeddings;
``moe_enable_routing_replay`` on for the policy. Call ``rl.megatron_cpu.init_single_process()`` (done by the builders)
before anything else. Row convention: position t's routing row is what the
layer chose for the token at t when it was fed as input; a trajectory of N
tokens has N-1 rows (the last token is never fed), matching SGLang's
``routed_experts``.

Modules: :mod:`rl.model.spec` (``ModelSpec``, the megatron config), :mod:`rl.model.build`
(policy and critic builders), :mod:`rl.model.forward` (forward passes), :mod:`rl.model.routing`
(record and replay), :mod:`rl.model.weights` (state dicts, ``weights.pt``); the names above are
re-exported here, the API every caller uses.

Padding: batches are right-padded; attention is causal, so padded positions
never change earlier positions. The UNK compact id (inputs only) is masked out
of every softmax: log-probs and sampling are over the real compact ids.
"""
from rl.model.build import build_critic, build_policy
from rl.model.forward import last_logits, policy_forward, token_logprobs, values
from rl.model.routing import RoutingRecord, record_routing, replay_routing
from rl.model.spec import RMS_NORM_EPS, ROPE_THETA, ModelSpec
from rl.model.weights import WEIGHTS_FILE, load_state, load_weights, save_weights, weights_state_dict

__all__ = [
    "ModelSpec", "RMS_NORM_EPS", "ROPE_THETA", "build_policy", "build_critic",
    "policy_forward", "last_logits", "token_logprobs", "values",
    "RoutingRecord", "record_routing", "replay_routing",
    "WEIGHTS_FILE", "weights_state_dict", "load_state", "save_weights", "load_weights",
]
