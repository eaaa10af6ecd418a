"""blocking-queue-put: a bounded queue's put() inside the event loop freezes every in-flight generation.

slime issue #2238 (github.com/THUDM/slime/issues/2238): the rollout manager put finished groups into a
bounded ``queue.Queue`` with a blocking ``put()`` from inside its asyncio event loop; once the trainer
fell behind and the queue filled, the put blocked the loop and every in-flight generation on it froze;
the surplus scored groups were dropped at the end.

Fault (real): generation outpaces a slow trainer (one batch taken every 0.6 s by a trainer thread)
while groups are settled from inside an asyncio loop that also drives 8 in-flight generations (each a
coroutine ticking a heartbeat).

- Unguarded (slime's shape: a bounded ``queue.Queue`` and a blocking ``put()`` in the loop, generation
  unbounded): the loop's heartbeat stops for about a trainer period every time the queue is full; at
  the end, finished groups are left over that no step trained.
- Guarded: the production ``GroupBuffer`` (``t1ops/campaign/async_buffer.py``): a group starts only
  with a capacity-rule slot, and a finished group goes in with ``put_nowait`` (a full queue would be a
  ``CapacityError``, never a wait), so the loop never blocks on the queue; no group is left over (the
  books balance: every started group trained, or dropped by the zero-variance filter, or cancelled at
  the end, each counted). In t1ops the buffer also lives on the coordinator, never in a generation
  event loop (t1ops is immune by design).
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register
from chaos.scenarios.resume_drops_buffered import GROUPS, _group, new_async

STEPS = 4
TRAIN_S = 0.6        # one slow optimizer step
GEN_S = 0.01         # one group's generation
TICK_S = 0.005       # the in-flight generations' heartbeat


class _Heartbeat:
    def __init__(self) -> None:
        self.last, self.max_gap = time.monotonic(), 0.0

    async def beat(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            now = time.monotonic()
            self.max_gap, self.last = max(self.max_gap, now - self.last), now
            await asyncio.sleep(TICK_S)


def _trainer(take, steps_done: list) -> threading.Thread:
    def loop() -> None:
        for _ in range(STEPS):
            take()
            time.sleep(TRAIN_S)
            steps_done.append(time.monotonic())
    th = threading.Thread(target=loop, daemon=True)
    th.start()
    return th


async def _unguarded() -> dict:
    q: queue.Queue = queue.Queue(maxsize=2 * GROUPS)
    hb, stop, steps, made, dropped, max_put = _Heartbeat(), asyncio.Event(), [], 0, 0, 0.0
    th = _trainer(lambda: [q.get() for _ in range(GROUPS)], steps)
    beat = asyncio.ensure_future(hb.beat(stop))
    while th.is_alive():
        await asyncio.sleep(GEN_S)
        t0 = time.perf_counter()
        try:  # blocks the event loop while the queue is full (bounded here so the scenario ends)
            q.put(_group(f"g{made}", "task-0", 1), timeout=2 * TRAIN_S)
        except queue.Full:
            dropped += 1  # the surplus scored group is dropped
        max_put = max(max_put, time.perf_counter() - t0)
        made += 1
        if len(steps) == STEPS:
            break
    stop.set()
    await beat
    return {"max_gap": hb.max_gap, "made": made, "trained": STEPS * GROUPS, "left_over": q.qsize() + dropped,
            "dropped": dropped, "max_put_s": max_put}


async def _guarded(tl: Timeline) -> dict:
    gen = new_async()
    buffer = gen.buffer
    hb, stop, steps, max_settle = _Heartbeat(), asyncio.Event(), [], 0.0
    lock = threading.Lock()

    def take():
        while True:
            with lock:
                if buffer.batch_ready():
                    buffer.take_batch()
                    buffer.advance()
                    return
            time.sleep(TICK_S)

    th = _trainer(take, steps)
    beat = asyncio.ensure_future(hb.beat(stop))
    tl.fault()
    with lock:
        gen.fill()
    while len(steps) < STEPS:
        await asyncio.sleep(GEN_S)
        with lock:
            t0 = time.perf_counter()
            gen.poll()   # settles one group with on_done (put_nowait) and starts what the rule allows
            max_settle = max(max_settle, time.perf_counter() - t0)
    th.join()
    stop.set()
    await beat
    tl.healthy()
    books = gen.stop()
    return {"max_gap": hb.max_gap, "max_settle_s": max_settle, "totals": dict(buffer.totals), "books": books,
            "queued": buffer.queue.qsize()}


@register("blocking-queue-put", "a bounded queue's blocking put() in the event loop freezes every generation")
def run(tmp: Path) -> Outcome:
    bad = asyncio.run(_unguarded())
    tl = Timeline()
    good = asyncio.run(_guarded(tl))
    tl.detected(tl.marks["fault"])  # never blocked: nothing to detect, the rule holds generation back
    t = good["totals"]
    settled = t.get("trained", 0) + t.get("zero_variance", 0) + t.get("cancelled", 0) + t.get("failed", 0) \
        + good["queued"]
    return Outcome(
        fault_fired=bad["max_put_s"] >= TRAIN_S / 2,
        unguarded=(f"blocking put() in the event loop: one put held the loop {bad['max_put_s']:.2f} s and the in-flight "
                   f"generations' heartbeat stopped for {bad['max_gap']:.2f} s (a trainer step is {TRAIN_S:g} s); "
                   f"{bad['left_over']} of "
                   f"{bad['made']} finished groups never trained ({bad['dropped']} dropped at a full queue)"),
        guarded=Guarded(caught=good["max_settle_s"] < TRAIN_S / 4, detection_s=0.0,
                        error=f"capacity-rule slots + put_nowait: a settlement held the loop at most "
                              f"{good['max_settle_s'] * 1000:.1f} ms (heartbeat gap {good['max_gap'] * 1000:.0f} ms, "
                              f"CPU contention included); books {t}"),
        invariants={
            "unguarded_event_loop_frozen_by_put": bad["max_put_s"] >= TRAIN_S / 2 and bad["max_gap"] >= TRAIN_S / 2
            and bad["left_over"] > 0,
            "guarded_event_loop_never_blocked": good["max_settle_s"] < TRAIN_S / 4,
            "guarded_every_started_group_accounted": t.get("submitted", 0) == settled,
            "guarded_no_failed_group": t.get("failed", 0) == 0,
        },
        details={"unguarded": bad, "guarded": good},
        recovery=tl.recovery(how="never blocked: no step or trial lost"))
