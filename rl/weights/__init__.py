"""Weight transfer from the trainer to the engines (``docs/weights.md``).

- :mod:`rl.weights.group`: the weight-update process group, made the way SGLang's
  ``/init_weights_update_group`` makes it (TCP rendezvous, prefix store, a group beside the
  default one), and the per-tensor broadcast SGLang's ``/update_weights_from_distributed`` receives.
- :mod:`rl.weights.buckets`: the Hugging Face tensors of a policy state, in buckets that never
  split a conversion unit.
- :mod:`rl.weights.checksums`: per-tensor checksums of what was sent and what an engine loaded.
- :mod:`rl.weights.delta`: a push of only what changed since the engines' version, and its application.
"""
