"""The weight sync's plan (rl.weights.shard_plan): every tensor sent once, by a rank that holds it, assembled
from one holder of each chunk; every rank's walk over the same plan delivers the whole model with no
rank holding it. Random layouts (replicas, tensor-parallel chunks, stacked sections, experts)."""
from __future__ import annotations

import concurrent.futures as cf
import queue
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from rl import model as rmodel
from rl.errors import CheckpointError
from rl.hf import layout as hf_layout
from rl.trainer.shard import Placement
from rl.weights import sender as sender_module
from rl.weights.checksums import state_checksums
from rl.weights.sender import WeightSender
from rl.weights.shard_plan import Held, owners, plan_sends, plan_whole, walk

SPEC = rmodel.ModelSpec(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, num_experts=4,
                        moe_router_topk=2, moe_ffn_hidden_size=32, max_seq_len=64, vocab_size=64)


@st.composite
def layouts(draw):
    """(full state, per-rank holdings, per-rank local states) of a random layout of ``tp x replicas`` ranks."""
    tp, replicas = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    world = tp * replicas
    full, holdings, states = {}, [{} for _ in range(world)], [{} for _ in range(world)]
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["whole", "split", "sections", "expert"]))
        rows = tp * draw(st.integers(1, 3))
        if kind == "sections":
            sections = (tp * draw(st.integers(1, 2)), tp)
            rows = sum(sections)
        name = f"t{i}"
        full[name] = torch.randn(rows, draw(st.integers(1, 3)))
        for rank in range(world):
            t, r = rank % tp, rank // tp
            if kind == "whole":
                where = Placement(name, None)
            elif kind == "expert":  # held by one replica's ranks only (its expert-parallel rank)
                if r != i % replicas:
                    continue
                where = Placement(name, None)
            else:
                where = Placement(name, 0, t, tp, sections if kind == "sections" else ())
            local = full[name] if where.dim is None else where.cut(full[name])
            holdings[rank][f"local.{name}"] = Held(where, tuple(local.shape), "float32")
            states[rank][f"local.{name}"] = local.clone()
    return full, holdings, states


@settings(max_examples=60, deadline=None)
@given(layouts())
def test_every_tensor_is_sent_once_by_a_holder_and_every_walk_delivers_the_model(layout):
    full, holdings, states = layout
    plan = plan_sends(holdings, list(full))
    assert sorted(s.mcore for s in plan) == sorted(full)
    for s in plan:
        assert any(h.placement.full_name == s.mcore for h in holdings[s.owner].values())  # owner holds a piece
        for index, (rank, local) in enumerate(s.pieces):
            assert holdings[rank][local].placement.full_name == s.mcore
            assert holdings[rank][local].placement.index == (index if len(s.pieces) > 1 else 0)
        assert s.shape == tuple(full[s.mcore].shape)
    assert [s.owner for s in plan] == sorted(s.owner for s in plan)  # by owner: the engines' order

    # every rank walks the same plan at once (threads, one queue per ordered pair as point to point)
    world = len(holdings)
    pipes = {(a, b): queue.Queue() for a in range(world) for b in range(world)}
    got, errors = [{} for _ in range(world)], []

    def run(rank):
        try:
            doubled = {k: 2 * v for k, v in states[rank].items()}  # a second version (a delta's base) moves with it
            for s, (whole, twice) in walk(plan, rank, [states[rank], doubled],
                                    send=lambda t, dst: pipes[(rank, dst)].put(t.clone()),
                                    recv=lambda buf, src: buf.copy_(pipes[(src, rank)].get(timeout=10))):
                assert torch.equal(twice, 2 * whole), s.mcore
                got[rank][s.mcore] = whole.clone()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    delivered = {k: v for g in got for k, v in g.items()}
    assert sum(len(g) for g in got) == len(full) and all(torch.equal(delivered[k], full[k]) for k in full)
    assert all(q.empty() for q in pipes.values())  # every piece sent was received


def test_replicas_split_the_sending_and_a_lost_chunk_is_named():
    state = {f"w{i}": torch.zeros(4, 4) for i in range(4)}
    held = {n: Held(Placement(n, None), (4, 4), "float32") for n in state}
    plan = plan_sends([held, held], list(state))  # two data-parallel replicas
    assert owners(plan) == [0, 1] and sum(s.owner == 0 for s in plan) == 2
    assert owners(plan_whole(state, list(state))) == [0]
    half = {"w0": Held(Placement("w0", 0, 0, 2), (2, 4), "float32")}  # chunk 1 of 2 held by no rank
    with pytest.raises(CheckpointError, match=r"w0: chunks \[0\] of 2 are held"):
        plan_sends([half], ["w0"])
    with pytest.raises(CheckpointError, match="no trainer rank holds 1 tensor"):
        plan_sends([held], [*state, "missing"])


class _Rank(WeightSender):
    """One rank of an in-process two-rank world: its shard, the shared plan, point to point over queues."""

    def __init__(self, rank, state, plan, pipes, spec):
        self._ws_rank, self.state, self.plan, self.pipes, self.spec = rank, state, plan, pipes, spec
        self.configure_weight_sender(dtype="float32", bucket_bytes=1 << 12)

    def _published_weights(self, version):
        return self.state, self.spec

    def weight_plan(self, version="0"):
        return self.plan

    def _p2p_send(self, tensor, dst):
        self.pipes[(self._ws_rank, dst)].put(tensor.clone())

    def _p2p_recv(self, tensor, src):
        tensor.copy_(self.pipes[(src, self._ws_rank)].get(timeout=10))


def _two_ranks(spec):
    """A tiny policy split over two ranks: every tensor with an even first dim halved, the rest on both."""
    full = rmodel.weights_state_dict(rmodel.build_policy(spec, seed=0))
    holdings, states = [{}, {}], [{}, {}]
    for name, t in full.items():
        for r in (0, 1):
            where = Placement(name, 0, r, 2) if t.shape[0] % 2 == 0 else Placement(name, None)
            local = t if where.dim is None else where.cut(t)
            holdings[r][name] = Held(where, tuple(local.shape), "float32")
            states[r][name] = local.clone()
    pipes = {(a, b): queue.Queue() for a in (0, 1) for b in (0, 1)}
    plan = plan_sends(holdings, [u.mcore for u in hf_layout.units(spec)])
    return full, [_Rank(r, states[r], plan, pipes, spec) for r in (0, 1)]


def _both(call):
    with cf.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(call, r) for r in (0, 1)]
        done, _ = cf.wait(futures, timeout=60)
        assert len(done) == 2, "a rank is still waiting on its peer"
        return futures


def test_the_senders_walk_exports_and_hashes_the_whole_model_and_a_failed_broadcast_releases_the_peer(
        tmp_path, monkeypatch):
    full, ranks = _two_ranks(SPEC)
    sums = [f.result() for f in _both(lambda r: ranks[r].weight_checksums_here("1"))]
    assert {**sums[0], **sums[1]} == state_checksums(full, torch.float32) and sums[0] and sums[1]
    parts = [f.result() for f in _both(lambda r: ranks[r].weight_export_here("1", str(tmp_path), 2))]
    hf = hf_layout.to_hf(full, SPEC)
    got = {**load_file(tmp_path / "model-00001-of-00002.safetensors"),
           **load_file(tmp_path / "model-00002-of-00002.safetensors")}
    assert set(parts[0]) | set(parts[1]) == set(hf) and all(torch.equal(got[n], hf[n]) for n in hf)

    # rank 0's broadcast fails at its first bucket (an engine died): it still walks the rest, so rank 1,
    # which owes it pieces of its tensor-parallel tensors and is owed some, completes instead of hanging
    def send(tensors, group):
        if group == "rank0":
            raise RuntimeError("Connection closed by peer")
        return sum(t.numel() * t.element_size() for t in tensors)

    monkeypatch.setattr(sender_module, "send_tensors", send)
    for r in (0, 1):
        ranks[r]._ws_group = f"rank{r}"
    futures = _both(lambda r: ranks[r].weight_send_here("1"))
    with pytest.raises(RuntimeError, match="Connection closed"):
        futures[0].result()
    assert futures[1].result() > 0
