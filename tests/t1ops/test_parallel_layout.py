"""[trainer.parallel] is validated at load by the rules preflight applies to plans."""
import pytest

from t1ops import parallel_layout as rules
from t1ops.config import parse_config
from t1ops.errors import ConfigError
from t1ops.preflight.plan import Parallelism


def _cfg(**parallel):
    return parse_config({"trainer": {"parallel": parallel}})


def test_valid_layouts_load():
    assert _cfg(dp=2).trainer.parallel.world_size == 2
    assert _cfg(tp=2, sequence_parallel=True).trainer.parallel.world_size == 2
    assert _cfg(dp=2, ep=2).trainer.parallel.ep == 2
    assert _cfg(cp=2).trainer.parallel.world_size == 2      # context parallelism (rl.trainer.context)
    assert _cfg(dp=2, cp=2, ep=2).trainer.parallel.world_size == 4
    assert _cfg(tp=2, cp=2, sequence_parallel=True).trainer.parallel.world_size == 4
    assert _cfg(pp=2).trainer.parallel.world_size == 2      # pipeline stages (rl.trainer.pipeline)
    assert _cfg(pp=2, dp=2, ep=2).trainer.parallel.world_size == 4


@pytest.mark.parametrize("parallel, match", [
    ({"tp": 2}, "sequence_parallel = true"),                       # MoE + TP needs SP (megatron refuses)
    ({"sequence_parallel": True}, "needs tp > 1"),
    ({"ep": 2}, "pp\\*ep\\*etp = 2"),                                # ep does not fit a world of 1
    ({"dp": 3, "ep": 3}, "does not divide num_experts 8"),
    ({"tp": 3, "sequence_parallel": True}, "does not divide num_attention_heads 4"),
    ({"pp": 3}, "num_layers 2 is not divisible by pp 3"),         # a stage holds whole layers
    ({"cp": 2, "ep": 4}, "pp\\*ep\\*etp = 4; 2 is not"),                # the CP ranks count in the expert world
])
def test_bad_layouts_are_named_at_load(parallel, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(**parallel)


def test_plans_and_campaigns_share_the_rules():
    # the plan's refusal is the rule function's message, word for word
    with pytest.raises(ValueError, match=rules.dense_divides(6, 4, 1, 1).replace("*", "\\*")):
        Parallelism(train_gpus=6, tp=4, pp=1, cp=1, ep=1)
    # and the campaign's [trainer.parallel] runs the same expert-layout rule
    assert rules.expert_layout(2, 1, 4, 1, 8) in rules.trainer_errors(
        dp=2, tp=1, pp=1, ep=4, sequence_parallel=False, num_layers=2, num_experts=8, num_attention_heads=4)
