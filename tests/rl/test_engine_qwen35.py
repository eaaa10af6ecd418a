"""The embedded engine serves the hybrid: GatedDeltaNet layers keep a recurrent and a convolution state
per request (rl.engines.linear_state), gated attention layers their K/V. Its cached forward (prefill,
extension of a finished prefix, one-token decode steps, two sequences batched) equals the model's full
forward on the whole sequence, and the engine's greedy tokens equal transformers' greedy generation."""
import torch

from rl.engines import protocol as P
from rl.engines.embedded_engine import EmbeddedEngine
from rl.engines.kvcache import CachedForward, KVCache
from rl.hf.reader import HFCheckpoint
from rl.model import build_policy, last_logits, load_state
from rl.vocab import CompactVocab
from tests.rl.hf_models import hf_model


def _model(tmp_path):
    hf = hf_model("qwen3_5_moe")
    hf.save_pretrained(tmp_path / "ckpt")
    ckpt = HFCheckpoint(tmp_path / "ckpt")
    model = build_policy(ckpt.spec, 0)
    load_state(model, ckpt.mcore_state())
    return hf, ckpt, model.eval()


def test_cached_forward_with_linear_states_equals_full_forward(tmp_path):
    _, _, model = _model(tmp_path)
    cache = KVCache(model, 4, 256)
    assert sorted(cache.linear) == [0, 2] and sorted(cache.keys) == [1, 3] and not cache.partial_prefix
    fwd = CachedForward(model, cache)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randint(0, 320, (90,), generator=gen).tolist(), torch.randint(0, 320, (30,), generator=gen).tolist()

    def full(ids):
        with torch.no_grad():
            return last_logits(model, torch.tensor([ids]))[0]

    out = fwd.forward([0, 1], [0, 0], [a[:70], b[:20]])          # prefill (70 > one 64-token chunk), batched
    errs = [(out.logits_BV[0] - full(a[:70])).abs().max(), (out.logits_BV[1] - full(b[:20])).abs().max()]
    out = fwd.forward([0, 1], [70, 20], [a[70:85], b[20:21]])   # extend from the states; one decode step
    errs += [(out.logits_BV[0] - full(a[:85])).abs().max(), (out.logits_BV[1] - full(b[:21])).abs().max()]
    for i in range(5):  # decode steps of both sequences in one batched forward
        out = fwd.forward([0, 1], [85 + i, 21 + i], [a[85 + i:86 + i], b[21 + i:22 + i]])
    errs += [(out.logits_BV[0] - full(a[:90])).abs().max(), (out.logits_BV[1] - full(b[:26])).abs().max()]
    out = fwd.forward([2], [0], [a[:1]])                        # a one-token prompt in a reused slot: fresh state
    errs.append((out.logits_BV[0] - full(a[:1])).abs().max())
    print(f"cached vs full forward: max |logit difference| {max(float(e) for e in errs):.3e}")
    assert max(float(e) for e in errs) <= 1e-4


def test_engine_greedy_tokens_equal_transformers_and_routing_rows_per_moe_layer(tmp_path):
    hf, ckpt, _ = _model(tmp_path)
    engine = EmbeddedEngine(ckpt.spec, CompactVocab.identity(ckpt.spec.vocab_size), torch.float32, seed=0,
                            checkpoint=None, kv_slots=4)
    load_state(engine.model, ckpt.mcore_state())
    prompt = list(range(5, 25))
    resp = engine.generate(P.GenerateRequest(input_ids=tuple(prompt), return_routed_experts=True, sampling_params=P.SamplingParams(
        temperature=0.0, max_new_tokens=8, stop_token_ids=(), ignore_eos=True)))
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt):].tolist()
    assert list(resp.output_ids) == ref
    assert resp.routed_experts_RLK.shape == (len(prompt) + 8 - 1, ckpt.spec.num_layers, ckpt.spec.moe_router_topk)
