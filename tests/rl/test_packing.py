"""Token-count packing to DP ranks and micro-batches under max_tokens_per_gpu."""
import pytest

from rl.errors import InputError
from rl.trainer.packing import FILLER, pack_to_ranks, plan_micro_batches, positions_for


def test_ranks_balanced_by_tokens():
    lengths = [100, 10, 60, 50, 40, 10]
    ranks = pack_to_ranks(lengths, 2)
    loads = [sum(lengths[i] for i in r) for r in ranks]
    assert sorted(i for r in ranks for i in r) == list(range(6))
    assert abs(loads[0] - loads[1]) <= 10  # 140 vs 130
    with pytest.raises(InputError, match="cannot fill 4 data-parallel ranks"):
        pack_to_ranks([5, 5], 4)


def test_micro_batches_respect_the_cap_and_keep_long_samples_whole():
    lengths = [9, 9, 9, 9, 33]
    plan = plan_micro_batches([[4, 0, 1, 2, 3]], lengths, max_tokens_per_gpu=24)[0]
    assert plan[0].rows == (4,) and plan[0].positions == 33  # longer than the cap: alone, indivisible
    assert all(mb.padded_tokens <= 24 for mb in plan[1:])
    assert sorted(r for mb in plan for r in mb.rows) == [0, 1, 2, 3, 4]


def test_sequence_parallel_padding_and_lockstep():
    assert (positions_for(10, 2) - 1) % 4 == 0  # fed positions padded to 2 * sp by the token pipeline
    plans = plan_micro_batches([[0, 1, 2], [3]], [9, 9, 9, 9], max_tokens_per_gpu=20, aligned=True)
    assert len(plans[0]) == len(plans[1])  # expert-parallel ranks run the same forwards
    assert [len(mb.rows) for mb in plans[0]] == [len(mb.rows) for mb in plans[1]]
    assert FILLER in plans[1][-1].rows
