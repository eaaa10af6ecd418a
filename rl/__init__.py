"""rl: the learning stack (pure math, the data contract, backends).

Never imports ``t1ops`` or ``chaos``; what it needs from the outside (an HTTP
client, a lock, a clock) is passed in as an argument.
"""
