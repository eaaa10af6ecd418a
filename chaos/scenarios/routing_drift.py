"""routing-drift: a bf16 engine and an fp32 trainer pick different top-k experts.

Fault (real): the sampler is the real embedded engine process
(``rl.engines.embedded``, bf16; the trainer runs fp32), as SGLang differs from
Megatron (T1 report, section 05). The trainer's weights reach it through the
weight publication path (an actor checkpoint the engine loads at start, cast to
bf16). The engine samples a seeded batch over HTTP and returns each response's
log-probs and routed experts (``return_routed_experts``), exactly what a
rollout hands the trainer. Top-k is discontinuous, so wherever rank k
and rank k+1 are closer than the bf16/fp32 difference the trainer's free
routing swaps an expert. The fault is observed, not assumed: the trainer's
free top-k is compared row by row with the recorded one (``fault_fired`` =
at least one flipped (token, layer) row).

Unguarded (R3 off): the trainer evaluates the batch with its own routing; the
train-vs-rollout log-prob gap includes the swapped sub-networks.
Guarded (R3 on): the trainer replays the recorded experts
(``rl.trainer.measure_routing_gap``, same weights, same tokens); the gap
drops (report: 0.021 -> 0.013, a 0.62x ratio) and the routers' own routing
maps show the replayed forward used exactly the recorded experts. A control
scored by an fp32 sampler on the same tokens shows no flip and a zero R3
gap, so the flips come from the numerics and the residual gap under R3 is
kernel numerics, which R3 does not align (report, section 05).

Sizing: 32 experts with top-4 put many close margins in reach of bf16
rounding; 32 sequences x 16 tokens (14 sampled by the engine) gave 16 flips in
960 rows (seed 0); the engine's start dominates the ~50 s run.
Runbook: ``runbooks/routing-drift.md``.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from chaos.harness import Guarded, Outcome, Timeline, register
from rl.model import ModelSpec, build_policy, weights_state_dict
from rl.routing import fill_missing_rows
from rl.trainer import RoutingGap, TrainBatch, measure_routing_gap, rollout_batch

SPEC = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, num_experts=32,
                 moe_router_topk=4, moe_ffn_hidden_size=64, max_seq_len=64, vocab_size=64)
SEED = 0
BOS, PROMPT_LEN = 1, 2
NUM_SEQUENCES, RESPONSE_LEN = 32, 14
REPORT_GAP_R3_OFF, REPORT_GAP_R3_ON = 0.021, 0.013  # T1 report, section 05


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """One intra-op thread: the same reduction order on every host (determinism), and tiny
    matmuls on a shared 2-core host run faster on one thread than fighting for two."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _engine_batch(tmp: Path, actor) -> tuple[TrainBatch, list[np.ndarray]]:
    """Seeded prompts (BOS + one id), ``RESPONSE_LEN`` ids each sampled by a real bf16 engine that
    loaded ``actor``'s published checkpoint; its log-probs and routing rows as the rollout returns them."""
    import httpx

    from rl.engines.client import EngineClient
    from rl.engines.embedded_spawn import spawn
    from rl.engines.ports import free_port
    from rl.engines.protocol import GenerateRequest, SamplingParams
    from t1ops.guards.checkpoints import save_checkpoint

    ckpt = save_checkpoint(tmp / "actor", "actor", 1, weights_state_dict(actor))
    proc = spawn(free_port(), SPEC, checkpoint=ckpt, dtype="bf16", seed=SEED, log_path=tmp / "engine.log")
    g = torch.Generator().manual_seed(SEED)
    prompts = [[BOS, int(x)] for x in torch.randint(4, SPEC.vocab_size, (NUM_SEQUENCES,), generator=g)]
    seqs, logprobs, rows = [], [], []
    try:
        with httpx.Client(timeout=120.0) as http:
            client = EngineClient(proc.url, http, num_moe_layers=SPEC.num_layers, topk=SPEC.moe_router_topk,
                                  num_experts=SPEC.num_experts)
            for i, p in enumerate(prompts):
                resp = client.generate(GenerateRequest(
                    input_ids=tuple(p), rid=f"drift-{i}", return_logprob=True, return_routed_experts=True,
                    sampling_params=SamplingParams(max_new_tokens=RESPONSE_LEN, sampling_seed=SEED + i)))
                seq = np.asarray(p + list(resp.output_ids), dtype=np.int64)
                mask = np.arange(len(seq)) >= PROMPT_LEN
                lp = np.zeros(len(seq), dtype=np.float32)
                lp[PROMPT_LEN:] = resp.output_token_logprobs
                r = np.zeros((len(seq), SPEC.num_layers, SPEC.moe_router_topk), dtype=np.int32)
                r[:len(seq) - 1] = resp.routed_experts_RLK  # the engine routes positions [0, seqlen - 1)
                fill_missing_rows(r, np.arange(len(seq)) < len(seq) - 1, mask, sample=str(i))
                seqs.append(seq), logprobs.append(lp), rows.append(r)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    ids = list(range(len(seqs)))
    return TrainBatch.from_sequences(tokens=seqs, loss_mask=[np.arange(len(s)) >= PROMPT_LEN for s in seqs],
                                     rollout_logprobs=logprobs, rewards=[0.0] * len(seqs), group_ids=ids,
                                     prompt_ids=ids, routing=rows), seqs


def _score(sampler, seqs: list[np.ndarray]) -> TrainBatch:
    """The batch as an engine returns it: ``sampler``'s log-probs and recorded routing rows."""
    ids = list(range(len(seqs)))
    return rollout_batch(sampler, seqs, [PROMPT_LEN] * len(seqs), [0.0] * len(seqs), ids, ids)


def _gap_text(gap: RoutingGap) -> str:
    return (f"{gap.num_flipped_rows}/{gap.num_rows} (token, layer) routing rows flipped top-k "
            f"({100 * gap.flipped_fraction:.1f}%) over {gap.num_tokens} loss tokens")


@register("routing-drift", "bf16 engine vs fp32 trainer flip top-k experts; R3 replay lowers the log-prob gap")
def run(tmp: Path) -> Outcome:
    with _one_thread():
        actor = build_policy(SPEC, SEED)                               # the trainer: fp32
        batch, seqs = _engine_batch(tmp, actor)                       # the engine: bf16, its own process

        t0 = time.monotonic()
        gap = measure_routing_gap(actor, batch)  # free routing (R3 off), then replay (R3 on)
        measure_s = time.monotonic() - t0
        tl = Timeline()  # from the bf16 engine's batch reaching the trainer: the flips measured and replayed
        tl.fault(at=t0)
        tl.after_fault(detected=measure_s, healthy=measure_s if gap.gap_r3_on < gap.gap_r3_off else None)

        # control: the same tokens scored by an fp32 sampler (same numerics as the trainer)
        control = measure_routing_gap(actor, _score(actor, seqs))

    lowered = gap.gap_r3_on < gap.gap_r3_off
    ratio = gap.gap_r3_on / gap.gap_r3_off if gap.gap_r3_off else float("nan")
    unguarded = (f"R3 off: bf16 sampler vs fp32 trainer: {_gap_text(gap)}; the trainer evaluates other experts "
                 f"than the ones that sampled; train-vs-rollout log-prob gap {gap.gap_r3_off:.5f}")
    error = (f"R3 on: log-prob gap {gap.gap_r3_off:.5f} -> {gap.gap_r3_on:.5f} ({ratio:.2f}x; report "
             f"{REPORT_GAP_R3_OFF} -> {REPORT_GAP_R3_ON}) on the same batch; all {gap.num_flipped_rows} flipped "
             f"rows replayed: the forward used {'exactly the' if gap.replay_used_recorded else 'NOT the'} "
             "recorded experts")
    return Outcome(
        fault_fired=gap.num_flipped_rows > 0,
        unguarded=unguarded,
        guarded=Guarded(caught=lowered and gap.replay_used_recorded, detection_s=measure_s, error=error),
        invariants={
            "unguarded_trainer_evaluates_other_experts": gap.num_flipped_rows > 0 and gap.gap_r3_off > 0,
            "r3_lowers_logprob_gap": lowered,
            "replayed_forward_used_recorded_experts": gap.replay_used_recorded,
            "same_precision_control_has_no_flip_and_no_r3_gap": control.num_flipped_rows == 0
            and control.gap_r3_on == 0.0 and control.replay_used_recorded,
        },
        details={
            "gap_r3_off": gap.gap_r3_off, "gap_r3_on": gap.gap_r3_on, "gap_ratio_on_over_off": ratio,
            "report_gap_r3_off": REPORT_GAP_R3_OFF, "report_gap_r3_on": REPORT_GAP_R3_ON,
            "num_flipped_rows": gap.num_flipped_rows, "num_rows": gap.num_rows, "num_loss_tokens": gap.num_tokens,
            "sampler": "rl.engines.embedded process, bfloat16", "trainer_dtype": "float32", "seed": SEED,
            "control_fp32_sampler": {"num_flipped_rows": control.num_flipped_rows, "gap_r3_off": control.gap_r3_off,
                                     "gap_r3_on": control.gap_r3_on},
            "measure_s": round(measure_s, 3), "spec": SPEC.to_dict(),
        },
        recovery=tl.recovery(how="in place, every step: the train forward replays the recorded experts (R3)"))
