"""Named constants of the memory model, each traced to the figure that fixed it.

Three kinds of number live here, and each says which it is:

- **measured**: a figure the report publishes, used as an input;
- **fit**: a constant chosen so the model reproduces one published figure;
  that figure is then *not* evidence for the model;
- **judgement**: a safety margin, with the figure that motivates it.

Everything else the model outputs is arithmetic from the plan plus these
constants; ``tests/t1ops/test_preflight.py`` tabulates, for every published
figure, the model's value, the difference, and whether it was a fit or a
prediction.

Ledger (values from ``pytest tests/t1ops/test_preflight.py -s -k table``):

- fits (no evidence): logits 29.8 GiB -> 6 B/element; GDN CP4 2.70 GiB ->
  exchange bytes; 56-GPU crash 90.56 GiB in use -> offload residue, and its
  boundary -> allocator reserve; host 259/2265 GB free -> sandbox worker size.
- predictions: logits 14.9 at CP 4 (14.92); peaks 100.3 / 81.8 (99.95 / 82.08);
  the 56-GPU plan surviving critic-only steps and failing first in the joint
  step's critic GatedDeltaNet forward; the failing request's shape
  (632 MiB = [40,448 tokens, 8,192] bf16, the length inferred from it);
  1536 B/token and 48 MiB per 33k tokens; 38-44 GB with the optimizer offloaded.
- assumptions (not published, stated in each plan file): 128 GPUs = 64 train
  (pp 2) + 64 rollout; 56 GPUs = 32 train (pp 2) + 24 rollout with a quarter of
  the optimizer on the host; mean trajectory 33k tokens; the GatedDeltaNet head
  layout (16 key / 64 value heads of 128), which gives 3.19B GatedDeltaNet
  parameters against the report's 2.94B (unexplained, 8 %).

The report (section 08) writes "GB" for the per-GPU figures; they are GiB:
86,016 x 124,160 x 6 B = 29.84 GiB, and the 95 "GB" budget is the 95 GiB of
section 05. This module reads every report "GB" of GPU memory as GiB.
"""
from __future__ import annotations

GIB = 2**30
MIB = 2**20
KIB = 2**10

#: measured. GatedDeltaNet activation peak per token in flight (report 08:
#: "measured at ~330 KiB/token, 4x the original estimate"). The peak of one
#: layer's forward/backward under full recompute.
GDN_ACTIVATION_BYTES_PER_TOKEN = 330 * KIB

#: fit (to "10.57 GB -> 2.70 GB at CP4", report 08). Native CP divides the
#: GatedDeltaNet tokens by CP, which alone predicts 10.57 / 4 = 2.64 GiB (4.00x);
#: the published 2.70 GiB (3.92x) leaves 0.0575 GiB per rank for the recurrent
#: state passed between ranks and the zig-zag -> contiguous relayout buffers.
GDN_CP_EXCHANGE_BYTES = int(0.0575 * GIB)

#: fit (to "29.8 GB logits buffer at CP 2", report 08). Bytes per logit element
#: [tokens / CP, vocab / TP] on the last pipeline stage: the bf16 output of the
#: LM-head GEMM (2 B) plus its fp32 upcast for the vocab-parallel log-softmax
#: (4 B). 86,016 / 2 x 248,320 / 2 x 6 B = 29.84 GiB; the CP 4 value (14.92)
#: then follows with no further freedom.
LOGITS_BYTES_PER_ELEMENT = 6

#: fit (to the 56-GPU crash boundary, report 08: "a 632 MiB allocation with
#: 90.56 GiB already in use" on a 95 GiB GPU). Memory not held by PyTorch
#: tensors: CUDA context, NCCL communicators, caching-allocator fragmentation
#: (expandable_segments is off, report 10). The crash bounds it: PyTorch did
#: hold 90.56 GiB, so it is at most 95 - 90.56 = 4.44 GiB; the 632 MiB request
#: failed, so it is at least 95 - 90.56 - 0.617 = 3.82 GiB. We take the
#: midpoint, 4.13 GiB, so the crash is reproduced with margin on both sides.
ALLOCATOR_RESERVE_BYTES = int((95.0 - 90.56 - 632 / 1024 / 2) * GIB)

#: fit (to "90.56 GiB in use" at the 56-GPU crash, report 08). What a role
#: that has run in this step leaves on the GPU after its forced offload: the
#: memory saver frees tagged tensors, but blocks the caching allocator split
#: around them stay reserved (expandable_segments off). Critic-only steps never
#: load the actor, so they carry no residue; that is why the 56-GPU plan
#: survived them and died at the first joint step. The mechanism is our
#: reading; the size is fit. With it, the 128-GPU peaks (100.3, 81.8) are
#: predictions.
OFFLOADED_ROLE_RESIDUE_BYTES = int(4.09 * GIB)

#: judgement (report 09: the OS killed the trainer with 259 GB of 2265 GB
#: free, i.e. at 88.6 % used, during the rollout -> train handoff). Offload
#: copies spike at the handoff, so a projection above 85 % of host RAM is refused.
HOST_RAM_SAFE_FRACTION = 0.85

#: fit (to report 09: "host free memory to 259 GB of 2265 GB" with "260
#: concurrent sandbox workers" beside the CPU-offloaded fp32 Adam of both
#: models). The per-worker size is not published; 5.8 GiB puts the 128-GPU
#: layout with full optimizer offload and 260 workers at 88.6 % of host RAM,
#: as observed. Default of ``hardware.sandbox_worker_gib``.
SANDBOX_WORKER_GIB = 5.8

#: judgement (report 09: the DP = 1 layout put 128 experts on every GPU, "guaranteed
#: CUDA OOM"). At this many experts per GPU per layer, a layout is refused
#: whatever the rest of the memory model says.
MAX_EXPERTS_PER_GPU = 64

#: measured. Bytes of one routing-record entry: an int32 expert id (report 05:
#: "a base64 int32 tensor"; 48 layers x top-8 x 4 B = 1536 B per token).
ROUTING_ID_BYTES = 4

#: The CPU calibration of the per-token activation term (t1ops.preflight.cpu_activations): the batch is one
#: long sample of ACTIVATION_LONG_TOKENS (its own micro-batch) and ACTIVATION_SAMPLES - 1 samples of
#: ACTIVATION_CAP_TOKENS, the packer's cap; layouts are name -> (tp, pp, cp), tp > 1 with sequence parallelism.
ACTIVATION_LONG_TOKENS = 512
ACTIVATION_CAP_TOKENS = 64
ACTIVATION_SAMPLES = 3
ACTIVATION_LAYOUTS = {"1 rank": (1, 1, 1), "cp2": (1, 1, 2), "pp2": (1, 2, 1), "tp2-sp": (2, 1, 1),
                      "tp2-sp-cp2": (2, 1, 2)}

#: measured (CPU): fp32, gloo ranks, no recompute; the tiny Qwen3.5-MoE hybrid (4 layers, hidden 32), one
#: PPO step (actor and critic, R3). Peak bytes autograd saves for backward on the worst rank, per token of
#: the long sample, by layout (`python bench/bench_activations.py`, 2026-12-06; worst rank's peak / 512).
#: Absolute bytes are this shape's and CPU's (no recompute keeps every intermediate); the model is checked
#: on the ratios to one rank for cp and pp (tests/t1ops/test_preflight_activations.py). At tp = 2 + SP the
#: CPU ranks halve (1.99x) what the model keeps whole (1.00x): its full-recompute rule; docs/preflight.md.
ACTIVATION_LAYOUT_POINTS = {"1 rank": 48_653_122 / 512, "cp2": 24_611_258 / 512, "pp2": 26_893_328 / 512,
                            "tp2-sp": 24_412_522 / 512, "tp2-sp-cp2": 12_356_394 / 512}
