"""The weight-sync barrier's proofs: every engine loaded what was sent, and every engine resumed.

Owned by the pool and used by :class:`t1ops.engines.barrier.Barrier` and :class:`t1ops.engines.health.Health` (the pool's contract is
:class:`t1ops.engines.pool.EnginePool`'s docstring; docs/engine.md, "Barrier proofs").

- **Loaded weights** (``engine.verify_weights``; SkyRL issue #1680, fixed in SkyRL PR #1737: a
  multi-chunk weight update turned a MoE model's output to gibberish with no error). After the
  publish, every engine computes a checksum per tensor *from its model* (``/weights_checksum``)
  and the barrier compares them with the trainer's checksums of what it pushed
  (``Pushed.checksums``). An engine that differs stays out of traffic (the gate is
  closed, it is not admitted) and is pushed again, up to ``engine.weight_resyncs`` times; one that
  still differs is declared dead and recreated. An engine without the endpoint (a stock SGLang
  server) is skipped with an ``engine.weights_unverified`` warning.
- **Resumed** (``engine.resume_probe``; AReaL issue #1160, fixed in AReaL PR #1181: an engine
  left paused after a weight update hung every later rollout). After its acknowledged
  ``/continue_generation``, every engine must finish a one-token probe ``/generate`` at the new
  version within ``engine.resume_deadline_s`` (the continue is re-sent once half-way); else
  the probe is aborted and the engine declared dead and recreated before the gate opens.
"""
from __future__ import annotations

import concurrent.futures as cf
import itertools
import threading
import time


from rl.engines import protocol as P
from rl.weights.checksums import mismatched
from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.engines.slots import ENGINE_FAILURES, Slot, SlotTable

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "weight-sync-corruption": ("engine.verify_weights", "engine.weight_resyncs"),
    "engine-left-paused": ("engine.resume_probe", "engine.resume_deadline_s"),
}

PROBE_IDS = (0,)  # one input token: id 0 exists in every vocabulary (an unknown id maps to UNK in a compact one)
_probe_numbers = itertools.count()


class BarrierChecks:
    """The two proofs (module docstring) over the engines of one :class:`SlotTable`."""

    def __init__(self, table: SlotTable, cfg: EngineConfig) -> None:
        self.table, self.cfg = table, cfg
        self._unverified_warned = False
        self._last_expected: tuple[str, dict] | None = None  # (version, the trainer's checksums): admissions check too

    # --- loaded weights ------------------------------------------------------------------
    def loaded_mismatches(self, slots: list[Slot], expected: dict | None, version: str, *, attempt: int,
                          t0: float) -> dict[int, list[str]]:
        """``{slot: tensor names}`` of the engines whose loaded tensors differ from ``expected`` (the
        trainer's checksums of what it pushed); each one is reported. Nothing to compare: {}."""
        if not self.cfg.verify_weights or expected is None:
            return {}
        self._last_expected = (version, expected)  # a later admission alone is checked against it too
        bad = {s.index: m for s in slots if s.status != "dead" and (m := self._loaded_mismatch(s, expected, version))}
        for s in slots:
            if s.index in bad:
                telemetry.count("engine.weights_mismatch", slot=s.index)
                telemetry.event("engine.weights_mismatch", severity="error", slot=s.index, url=s.handle.url,
                                version=version, attempt=attempt, num_tensors=len(bad[s.index]),
                                tensors=str(bad[s.index][:4]), detect_s=round(time.monotonic() - t0, 3))
        return bad

    def give_up(self, slots: list[Slot], bad: dict[int, list[str]], version: str, attempt: int) -> None:
        """Engines still differing after ``engine.weight_resyncs`` re-syncs are dead (then recreated)."""
        for s in slots:
            if s.index in bad:
                self.table.declare_dead(s, f"loaded weights of version {version!r} differ from the trainer's in "
                                           f"{len(bad[s.index])} tensor(s) (first: {bad[s.index][:3]}) after "
                                           f"{attempt} re-sync(s); see runbooks/weight-sync-corruption.md")

    def admission_mismatch(self, s: Slot, version: str) -> list[str]:
        """An engine admitted alone (disk sync) loaded ``version``: its tensors against the barrier's record."""
        if not self.cfg.verify_weights or self._last_expected is None or self._last_expected[0] != version:
            return []
        return self._loaded_mismatch(s, self._last_expected[1], version)

    def _loaded_mismatch(self, s: Slot, expected: dict, version: str) -> list[str]:
        """Names whose checksum differs; [] when equal or the engine cannot say (then warned once)."""
        try:
            loaded = s.handle.client.weight_checksums(expected["dtype"])
        except ENGINE_FAILURES as e:
            if getattr(e, "context", {}).get("status_code") == 404:  # a server without the endpoint
                if not self._unverified_warned:
                    self._unverified_warned = True
                    telemetry.event("engine.weights_unverified", severity="warning", url=s.handle.url,
                                    reason="no /weights_checksum endpoint: loaded weights are not verified")
                return []
            self.table.declare_dead(s, f"weights_checksum failed after the publish: {e}")
            return []
        if loaded.get("weight_version") != version:
            return [f"<weight_version {loaded.get('weight_version')!r}>"]
        return mismatched(expected["tensors"], loaded.get("tensors") or {})

    # --- resumed ---------------------------------------------------------------------------
    def prove_resumed(self, slots: list[Slot], version: str) -> None:
        """Every slot generates a probe token at ``version`` within the deadline, else it is declared dead."""
        live = [s for s in slots if s.status == "live"]
        if not self.cfg.resume_probe or not live:
            return
        probes = cf.ThreadPoolExecutor(2 * len(live), thread_name_prefix="engine-resume-probe")
        try:
            threads = [threading.Thread(target=self._prove_one, args=(s, version, probes), daemon=True) for s in live]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            probes.shutdown(wait=False, cancel_futures=True)  # a probe stuck on a killed engine ends with it

    def _prove_one(self, s: Slot, version: str, probes: cf.ThreadPoolExecutor) -> None:
        t0 = time.monotonic()
        client, why = s.handle.client, ""
        for attempt in range(2):  # the barrier's continue, then one re-sent continue half-way
            if attempt:
                try:
                    client.continue_generation()
                except ENGINE_FAILURES as e:
                    why = f"continue_generation failed: {e}"
                    break
            rid = f"t1ops-resume-probe-{version}-{s.index}-{next(_probe_numbers)}"
            fut = probes.submit(client.generate, P.GenerateRequest(
                input_ids=PROBE_IDS, sampling_params=P.SamplingParams(max_new_tokens=1, temperature=0.0), rid=rid))
            try:
                resp = fut.result(timeout=self.cfg.resume_deadline_s / 2)
            except cf.TimeoutError:
                why = f"continue_generation acknowledged, but a one-token probe did not finish in " \
                      f"{self.cfg.resume_deadline_s / 2:g} s (attempt {attempt + 1}): the engine is still paused"
                _abort_quietly(client, rid)
                continue
            except ENGINE_FAILURES as e:
                why = f"probe generation failed: {e}"
                break
            if resp.finish_reason.is_abort or resp.weight_version != version:
                why = f"probe answered {resp.finish_reason.type} at version {resp.weight_version!r}, not {version!r}"
                break
            telemetry.observe("engine.resume_probe_s", time.monotonic() - t0)
            return
        took = round(time.monotonic() - t0, 3)
        telemetry.event("engine.not_resumed", severity="error", slot=s.index, url=s.handle.url, version=version,
                        reason=why[:300], detect_s=took)
        self.table.declare_dead(s, f"not resumed after the weight sync to {version!r} within "
                              f"{self.cfg.resume_deadline_s:g} s: {why}; see runbooks/engine-left-paused.md")


def _abort_quietly(client, rid: str) -> None:
    try:
        client.abort_request(rid)
    except ENGINE_FAILURES:
        pass  # the engine is declared dead (and killed) next if it stays unresponsive
