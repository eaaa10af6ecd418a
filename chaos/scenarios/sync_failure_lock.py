"""sync-failure-lock: a failed weight broadcast leaves the engine's lock held; the next sync waits forever.

miles issue #1967 (github.com/radixark/miles/issues/1967): an NCCL broadcast of a weight update
failed; the engine's weight-update lock, taken before the receive, was never released, and the next
weight sync (and every generation behind the lock) waited forever.

Fault (real): an in-process embedded engine joins a gloo weight-update group with a trainer thread
(``rl.weights.group``) with a trainer process; the trainer announces three tensors in ``/update_weights_from_distributed`` and broadcasts only the first, then leaves: the
engine's receive fails on the second broadcast.

- Unguarded (the receive under the engine's lock, released only on success, as miles had it): after
  the failed update a generation request does not finish within the watchdog: the model lock is
  still held.
- Guarded (t1ops' receiver, ``rl.engines.weight_updates.WeightReceiver.update``): tensors are received
  outside the model lock and loaded under ``with engine.model_lock`` after all arrived and were
  checked, so a failed receive raises to the caller (the barrier marks the engine for a re-sync) with
  the lock free: the next generation and a fresh group's full update succeed at once. t1ops is
  immune by design.
"""
from __future__ import annotations

import concurrent.futures as cf
import subprocess
import sys
import time
from pathlib import Path

import torch

from chaos.harness import Guarded, Outcome, Timeline, register
from chaos.scenarios.prefix_cache_across_versions import PROMPT, greedy, inproc_engine, new_weights
from rl.engines import protocol_weights as PW
from rl.engines.ports import free_port
from rl.weights.group import destroy_update_group, init_update_group, receive_tensors, send_tensors

JOIN_TIMEOUT_S = 120.0   # both sides of the group's rendezvous: a loaded host starts the trainer process slowly
WATCHDOG_S = 4.0


def _hf_update(engine, seed: int, names: int | None = None) -> tuple[PW.UpdateWeightsFromDistributedRequest, list]:
    from rl.hf.layout import to_hf
    from rl.model import weights_state_dict
    hf = to_hf({n: t for n, t in new_weights(engine, seed).items()}, engine.spec)
    assert set(to_hf(weights_state_dict(engine.model), engine.spec)) == set(hf)
    chosen = sorted(hf)[:names] if names else sorted(hf)
    req = PW.UpdateWeightsFromDistributedRequest(names=tuple(chosen), dtypes=tuple("float32" for _ in chosen),
                                                 shapes=tuple(tuple(hf[n].shape) for n in chosen),
                                                 group_name=f"g{seed}", weight_version=str(seed))
    return req, [hf[n] for n in chosen]


def trainer_main(port: int, name: str, tensors_file: str, count: int) -> None:
    """The trainer's rank 0, in its own process: join the group, broadcast ``count`` tensors, leave."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    group = init_update_group(backend="gloo", master_address="127.0.0.1", master_port=port, rank=0, world_size=2,
                              group_name=name, timeout_s=JOIN_TIMEOUT_S)
    send_tensors(torch.load(tensors_file)[:count], group)
    print(f"trainer: broadcast {count} tensor(s) and left", flush=True)


def _update(engine, receive, request, tensors: list, count: int, tmp: Path) -> tuple[Exception | None, float, str]:
    """The trainer process broadcasts ``count`` of ``request``'s tensors; ``receive(request, group)`` takes them."""
    port, path = free_port(), tmp / f"{request.group_name}.pt"
    torch.save(tensors, path)
    code = (f"from chaos.scenarios.sync_failure_lock import trainer_main; "
            f"trainer_main({port}, {request.group_name!r}, {str(path)!r}, {count})")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        group = init_update_group(backend="gloo", master_address="127.0.0.1", master_port=port, rank=1,
                                  world_size=2, group_name=request.group_name, timeout_s=JOIN_TIMEOUT_S)
    except Exception as e:
        proc.kill()
        raise RuntimeError(f"the trainer process never joined: {proc.communicate()[0][-2000:]}") from e
    t0 = time.monotonic()
    try:
        receive(request, group)
        err = None
    except Exception as e:  # the receive's failure, as the HTTP handler would answer it
        err = e
    elapsed = time.monotonic() - t0
    out = proc.communicate(timeout=JOIN_TIMEOUT_S)[0]
    destroy_update_group(group)
    return err, elapsed, out


def _miles_update(engine, request, group) -> None:
    """The receive as miles had it: the engine's lock taken first, released only after a successful load."""
    from rl.engines.weight_updates import load_partial
    from rl.hf import layout
    engine.model_lock.acquire()
    hf = receive_tensors(request.names, request.dtypes, request.shapes, group)
    engine.model_lock.release()
    load_partial(engine, layout.from_hf(hf, engine.spec, partial=True))


def _generation_finishes(engine) -> bool:
    ex = cf.ThreadPoolExecutor(1)
    fut = ex.submit(greedy, engine, PROMPT, f"after-{time.monotonic()}")
    done, _ = cf.wait([fut], timeout=WATCHDOG_S)
    ex.shutdown(wait=False)
    return bool(done) and fut.exception() is None


@register("sync-failure-lock", "a failed weight broadcast leaves the engine's lock held; the next sync hangs")
def run(tmp: Path) -> Outcome:
    from rl.engines.weight_updates import WeightReceiver

    bad_engine = inproc_engine()
    request, tensors = _hf_update(bad_engine, seed=3, names=3)
    bad_err, _, bad_out = _update(bad_engine, lambda req, g: _miles_update(bad_engine, req, g), request, tensors, 1, tmp)
    bad_served = _generation_finishes(bad_engine)
    bad_locked = bad_engine.model_lock.locked()
    if bad_locked:
        bad_engine.model_lock.release()  # let the stuck request and the scheduler go (the watchdog's job)

    tl = Timeline()
    engine = inproc_engine()
    receiver = WeightReceiver(engine)

    def t1ops_update(req, group):
        receiver.groups[req.group_name] = group
        if req.group_name == request.group_name:
            tl.fault()
        try:
            return receiver.update(req)
        finally:
            receiver.groups.pop(req.group_name, None)

    err, detect_s, out = _update(engine, t1ops_update, request, tensors, 1, tmp)
    tl.detected()
    lock_free = not engine.model_lock.locked()
    served = _generation_finishes(engine)
    full, all_tensors = _hf_update(engine, seed=4)
    resync_err, _, _ = _update(engine, t1ops_update, full, all_tensors, len(all_tensors), tmp)
    tl.healthy()
    served_after = _generation_finishes(engine)
    bad_engine.close()
    engine.close()
    fired = "broadcast 1 tensor(s) and left" in bad_out and "broadcast 1 tensor(s) and left" in out
    return Outcome(
        fault_fired=fired and bad_err is not None and err is not None,
        unguarded=(f"receive under the engine lock: the broadcast failed after 1 of 3 tensors "
                   f"({type(bad_err).__name__}), the lock stayed held (locked={bad_locked}) and a generation did "
                   f"not finish in {WATCHDOG_S:g} s"),
        guarded=Guarded(caught=err is not None and lock_free and served, detection_s=detect_s,
                        error=f"{type(err).__name__}: {str(err).splitlines()[0][:160] if err else ''}; lock free, "
                              f"engine serving"),
        invariants={
            "unguarded_lock_held_and_generation_hung": bad_locked and not bad_served,
            "guarded_failure_raised_to_the_caller": err is not None,
            "guarded_lock_released_and_engine_serves": lock_free and served,
            "next_sync_completes": resync_err is None and engine.weight_version == "4" and served_after,
        },
        details={"unguarded_error": str(bad_err)[:200], "guarded_error": str(err)[:200],
                 "resync_error": str(resync_err)[:200] if resync_err else None},
        recovery=tl.recovery(how="re-sync on a fresh group (the barrier's retry)"))
