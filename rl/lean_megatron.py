"""Import megatron-core without what a CPU host never runs: 1.7 of its 2.7 CPU seconds.

``import megatron.core`` executes two imports no CPU-only t1ops process uses:

- ``megatron.core.jit`` binds ``jit_fuser = torch.compile``, and the fused kernels of
  ``megatron.core.fusions`` are decorated with it at import time, which imports TorchDynamo and
  Inductor (about 1.4 s of CPU). On CPU the model is built without the fused paths (no linear
  biases, no bias-activation fusion: docs/architecture.md, "Embedded defaults"), so
  nothing compiled ever runs.
- ``megatron.core.inference.contexts.dynamic_context`` imports ``wandb`` if it is installed (about
  0.6 s), for metrics of megatron's own inference engine, which t1ops does not use.

Every trainer rank, every embedded engine and every test process that builds the model pays that
again: about 40 such processes per suite run (docs/testing.md). (A trainer still imports TorchDynamo
at its first forward: torch wraps ``torch.utils.checkpoint`` in ``torch._disable_dynamo``, which
imports it. There the saving is wandb's; an engine, which never checkpoints, saves both.) :func:`install` (called from
``rl/__init__.py``) adds a finder so that, when ``torch.cuda.is_available()`` is False,
``megatron.core`` is executed with ``torch.compile`` set to megatron's own no-op decorator (what
``megatron.core.jit.disable_jit_fuser()`` sets, applied before the fusions are decorated, which is
too early for that function) and with ``wandb`` unimportable (megatron then takes its own
``wandb = None`` path). Both are restored the moment ``megatron.core`` is executed; a process
that imported ``wandb`` before keeps it. On a GPU host nothing changes. The import stays lazy:
a process that never imports megatron (the router, a rollout worker) pays nothing.

``tests/rl/test_lean_megatron.py`` checks that the finder engages, that neither TorchDynamo nor
wandb is imported by building and running the model, and that the model's outputs are unchanged.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys

TARGET = "megatron.core"


def _noop_compile(model=None, **_kwargs):
    """``torch.compile`` as megatron's ``noop_decorator``: the function itself, used as is."""
    return model if model is not None else (lambda fn: fn)


@contextlib.contextmanager
def _lean():
    import torch

    real_compile, had_wandb = torch.compile, "wandb" in sys.modules
    torch.compile = _noop_compile
    if not had_wandb:
        sys.modules["wandb"] = None  # ``import wandb`` raises ImportError while this is set
    try:
        yield
    finally:
        torch.compile = real_compile
        if not had_wandb and sys.modules.get("wandb", 0) is None:
            del sys.modules["wandb"]


class _LeanLoader(importlib.abc.Loader):
    """The real loader of ``megatron.core``, executed inside :func:`_lean`."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        with _lean():
            self._inner.exec_module(module)

    def __getattr__(self, name):  # resource readers and the like: the real loader's
        return getattr(self._inner, name)


class LeanMegatronFinder(importlib.abc.MetaPathFinder):
    """Finds ``megatron.core`` once, through the normal path finder, with a :class:`_LeanLoader`."""

    engaged = False

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, LeanMegatronFinder)]
        import torch

        if torch.cuda.is_available():
            return None  # a GPU host: megatron as shipped, fusions compiled
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _LeanLoader(spec.loader)
        LeanMegatronFinder.engaged = True
        return spec


def install() -> None:
    """Add the finder unless ``megatron.core`` is imported already or the finder is there."""
    if TARGET in sys.modules or any(isinstance(f, LeanMegatronFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, LeanMegatronFinder())
