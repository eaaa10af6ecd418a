"""rl: the learning stack (pure math, the data contract, backends).

Never imports ``t1ops`` or ``chaos``; what it needs from the outside (an HTTP
client, a lock, a clock) is passed in as an argument.
"""

from rl import lean_megatron as _lean_megatron

_lean_megatron.install()  # megatron-core's CPU-host import without TorchDynamo and wandb (rl/lean_megatron.py)
