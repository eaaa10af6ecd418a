"""The inference-engine pool and its traffic (docs/engine.md).

Modules: :mod:`~t1ops.engines.slots` (handles, the slots table, factories),
:mod:`~t1ops.engines.health` (pinger, admission, death), :mod:`~t1ops.engines.checks` (the
barrier's proofs), :mod:`~t1ops.engines.barrier` (the weight-sync barrier),
:mod:`~t1ops.engines.requests` (the one request loop: admission, resubmission, the version
check), :mod:`~t1ops.engines.pool` (the pool: owns a ``Health`` and a ``Barrier``),
:mod:`~t1ops.engines.direct` (workers' direct traffic under the pool's rules).
Importing this package imports none of them.
"""
