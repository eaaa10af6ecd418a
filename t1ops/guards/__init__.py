"""Guardrails, one module per failure of the catalogue (DESIGN.md).

Importing this package imports every guard module so that their doctor checks
and telemetry instruments register.
"""
import importlib
import pkgutil

for _m in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_m.name}")
