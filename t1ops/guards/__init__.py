"""Guardrails, one module per failure family of the catalogue (docs/failures.md).

Importing one guard never imports the others (some pull in torch);
``t1ops.doctor.run_checks`` imports them all so their host checks register.
"""
