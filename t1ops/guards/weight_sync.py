"""How the weight-sync barrier moves weights into the engines: SGLang's own endpoints.

:class:`~t1ops.engines.pool.EnginePool` runs the barrier (pause, publish, check versions,
rotate, resume) and asks a ``WeightSync`` for the "publish" part and for bringing a newly
admitted engine to the pool's version:

- :class:`CheckpointDirSync`: ``/update_weights_from_disk`` of the directory the barrier was
  given (the pool's historical behaviour; unit tests and any caller that already has a
  directory the engines can read).
- :class:`DiskSync` (``engine.weight_sync = "disk"``): the trainer writes a Hugging Face
  export (``rl.hf``) of the version and every engine loads it with
  ``/update_weights_from_disk``: what a real SGLang server accepts.
- :class:`DistributedSync` (``engine.weight_sync = "distributed"``): SGLang's
  ``/init_weights_update_group`` + ``/update_weights_from_distributed``. Every trainer rank that
  owns tensors (``rl.weights.shard_plan``) hosts its own torch.distributed group (a *channel*: NCCL
  with real servers, gloo with the embedded engine) and broadcasts its Hugging Face tensors on it;
  one request per bucket carries its names, dtypes, shapes and the channel's group name, and the
  engines take the buckets channel by channel.
  The group is rebuilt when the set of engines changes (an engine died or joined). A new
  engine cannot receive alone, so it waits (healthy, not in rotation) for the next barrier,
  which brings it in; at start-up the router runs that barrier at once. With ``delta`` on
  (``engine.weight_sync_delta``), a push to the same group whose every engine reports the
  version the group last received completely (its *base*) carries only what changed since it
  (``rl.weights.delta``); a regrouped set (an engine joined, restarted or died), a failed push, a
  re-push of the same version (a checksum mismatch) or an engine at another version get the
  full weights; a delta an engine refuses (another base, malformed) is followed at once by the
  full weights in the same push.

Both modes end by checking every engine's ``weight_version`` (the health gate), so per-token
policy versions keep their meaning. ``expected_checksums(version)`` is the trainer's record of
what it sent (per-tensor checksums, :mod:`rl.weights.checksums`), which the barrier compares
with what each engine reports it loaded (``engine.verify_weights``, :mod:`t1ops.engines.checks`);
None where no trainer sends (:class:`CheckpointDirSync`).

Who runs them: in a campaign the **trainer** pushes (:func:`push`, called in the trainer's actor
by ``TrainerHost.push_weights``) inside a barrier the **coordinator** opens and closes on the
router (``t1ops.campaign.engines.engine_barrier``; docs/weights.md, "One transaction"): the
router never calls the trainer. Its pool holds :class:`CheckpointDirSync` (disk: an engine is
admitted alone from the last pushed export) or :class:`JoinsAtBarrier` (distributed). In one
process (tests, benchmarks) ``EnginePool.sync_weights`` runs the same three steps with its own
``WeightSync``.
"""
from __future__ import annotations

import concurrent.futures as cf
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from rl.engines import protocol_weights as PW
from rl.engines.client import EngineClient
from t1ops import telemetry
from t1ops.errors import EngineError

Targets = Sequence[tuple[int, EngineClient]]   # (slot index, client)
_GROUP_NUMBERS = itertools.count()
_REFUSED = " refused: "  # an engine's answer of success false (HTTP 400): it is alive, the request was refused  # group names are unique in the process (torch refuses a name twice)


class WeightSync(Protocol):
    #: True when one engine can be brought to the current version on its own (admission).
    admits_alone: bool

    def publish(self, targets: Targets, source: str, version: str) -> dict[int, str]:
        """Bring every target to ``version``; return ``{slot: why it failed}`` for the failures."""

    def admit(self, client: EngineClient, source: str | None, version: str) -> None:
        """Bring one new engine to ``version`` (only when ``admits_alone``); raise on failure."""

    def expected_checksums(self, version: str) -> dict | None:
        """The trainer's ``{"dtype", "tensors": {name: checksum}}`` of ``version``; None: no record."""


@dataclass(frozen=True)
class Pushed:
    """What one push did: ``failures`` ``{slot: why}``; ``source``: a directory a new engine can load
    this version from alone (disk sync's export; None otherwise); ``checksums``: the trainer's record
    of what it pushed (``WeightSync.expected_checksums``; None: nothing to compare with)."""

    failures: dict[int, str] = field(default_factory=dict)
    source: str | None = None
    checksums: dict | None = None


def push(sync: "WeightSync", targets: Targets, source: str | None, version: str, *, checksums: bool = True) -> Pushed:
    """Bring every target to ``version`` with ``sync`` and say what happened (the pusher's half of a barrier)."""
    failures = sync.publish(targets, source, version)
    return Pushed(failures=failures, source=getattr(sync, "last_export", None) or source,
                  checksums=sync.expected_checksums(version) if checksums else None)


def check_version(client: EngineClient, version: str) -> None:
    found = client.weight_version()
    if found != version:
        raise EngineError(f"{client.base_url} reports version {found!r} after the update to {version!r}")


def _each(targets: Targets, call: Callable[[EngineClient], Any], failures: dict[int, str], what: str) -> None:
    """Run ``call`` on every target concurrently; record each failure by slot."""
    if not targets:
        return
    with cf.ThreadPoolExecutor(len(targets), thread_name_prefix=f"weights-{what}") as pool:
        futures = {pool.submit(call, client): index for index, client in targets}
        for fut in cf.as_completed(futures):
            try:
                fut.result()
            except Exception as exc:  # any failure is this engine's: the pool declares it dead
                failures[futures[fut]] = f"{what}: {type(exc).__name__}: {exc}"


class CheckpointDirSync:
    """``/update_weights_from_disk`` of the barrier's directory, engine by engine."""

    admits_alone = True

    def publish(self, targets: Targets, source: str, version: str) -> dict[int, str]:
        failures: dict[int, str] = {}
        for index, client in targets:  # bulk and deliberately unbounded: one at a time
            _each([(index, client)], lambda c: (c.update_weights_from_disk(source, version),
                                                check_version(c, version)), failures, "publish")
        return failures

    def admit(self, client: EngineClient, source: str | None, version: str) -> None:
        if source is None:
            raise EngineError(f"{client.base_url} started at another version than the pool's {version!r} and "
                              "the pool has no checkpoint to load")
        client.update_weights_from_disk(source, version)
        check_version(client, version)

    def expected_checksums(self, version: str) -> dict | None:
        return None  # a directory, no trainer: nothing to compare the engines' loads with


class DiskSync(CheckpointDirSync):
    """The trainer's Hugging Face export of the version, loaded by ``/update_weights_from_disk``.

    ``export(version) -> directory`` runs on the trainer (a Ray call); the directory is what
    later admissions load too.
    """

    def __init__(self, export: Callable[[str], str], checksums: Callable[[str], dict] | None = None) -> None:
        self.export, self.checksums = export, checksums
        self.last_export: str | None = None

    def expected_checksums(self, version: str) -> dict | None:
        return self.checksums(version) if self.checksums is not None else None

    def publish(self, targets: Targets, source: str, version: str) -> dict[int, str]:
        self.last_export = self.export(version)
        return super().publish(targets, self.last_export, version)

    def admit(self, client: EngineClient, source: str | None, version: str) -> None:
        super().admit(client, self.last_export or source, version)


class JoinsAtBarrier:
    """The router's side of distributed sync in a campaign: the trainer pushes inside the coordinator's
    barrier, so an engine at another version never loads alone; it waits for the next barrier."""

    admits_alone = False

    def publish(self, targets: Targets, source: str, version: str) -> dict[int, str]:
        raise EngineError("distributed weight sync is pushed by the trainer inside the coordinator's barrier "
                          "(t1ops.campaign.engines.engine_barrier), never by the router")

    def admit(self, client: EngineClient, source: str | None, version: str) -> None:
        raise EngineError("distributed weight sync admits new engines at the next barrier")

    def expected_checksums(self, version: str) -> dict | None:
        return None  # the push carries them (Pushed.checksums)


class TrainerSender(Protocol):
    """The trainer's side of :class:`DistributedSync` (``rl.weights``; a Ray actor in a campaign)."""

    def channels(self, version: str) -> int: ...
    def open_group(self, *, master_port: int, world_size: int, group_name: str, backend: str, channel: int = 0,
                   version: str = "0") -> Any: ...
    def group_address(self, backend: str, channel: int = 0, version: str = "0") -> tuple[str, int]: ...
    def buckets(self, version: str, base: str | None = None) -> list: ...
    def send(self, version: str, base: str | None = None) -> Any: ...
    def holds(self, version: str) -> bool: ...
    def checksums(self, version: str) -> dict: ...
    def close_group(self) -> None: ...
    def wait(self, handle: Any) -> Any: ...


class DistributedSync:
    """SGLang's distributed weight update, driven from the pool's barrier (module docstring)."""

    admits_alone = False

    def __init__(self, sender: TrainerSender, backend: str, *, delta: bool = False) -> None:
        self.sender, self.backend, self.delta = sender, backend, delta
        self.members: tuple[str, ...] = ()
        self.group_names: list[str] = []  # one weight-update group per channel (sending rank)
        self.base: str | None = None  # the version every member received completely (a delta's base)
        self.last: dict = {}          # the last push: {"version", "base", "bytes", "seconds"}
        self._names = _GROUP_NUMBERS

    def publish(self, targets: Targets, source: str, version: str) -> dict[int, str]:
        failures: dict[int, str] = {}
        if tuple(c.base_url for _, c in targets) != self.members:
            self._regroup(targets, failures, version)  # a new, restarted or lost engine: the next push is full
        ok = [(i, c) for i, c in targets if i not in failures]
        if not ok:
            return failures
        base = self._delta_base(ok, version)
        self.base = None  # until this push is complete on every member
        buckets = self.sender.buckets(version, base)
        handle = self.sender.send(version, base)  # the trainer broadcasts every bucket in order ...

        def receive(client: EngineClient) -> None:  # ... while each engine takes them one request each
            refused = None
            for number, bucket in enumerate(buckets):
                last = number == len(buckets) - 1
                try:
                    client.update_weights_from_distributed(PW.UpdateWeightsFromDistributedRequest(
                        names=bucket.names, dtypes=bucket.dtypes, shapes=bucket.shapes,
                        group_name=self.group_names[bucket.channel],
                        flush_cache=last, weight_version=version if last else None,
                        delta_base=base if bucket.kinds else None, delta_kinds=bucket.kinds))
                except EngineError as exc:
                    if _REFUSED not in str(exc):
                        raise
                    refused = refused or exc  # received, then refused: take the rest, the collectives complete
            if refused is not None:
                raise refused
            if not buckets:  # a delta with nothing changed: the weights are the base's, relabelled
                client.update_weight_version(version, abort_all_requests=False)
            check_version(client, version)

        _each(ok, receive, failures, "update_weights_from_distributed")
        try:
            sent = self.sender.wait(handle)
        except Exception as exc:  # the trainer's broadcast failed: no engine can be trusted with this version
            self.members = ()
            return {i: f"trainer broadcast failed: {exc}" for i, _ in targets}
        delta_refused = base is not None and failures and all(_REFUSED in why for why in failures.values())
        if failures and not delta_refused:
            self.members = ()  # a peer failed mid-transfer: the group is unusable, rebuild it next time
        elif not failures:
            self.base = version
        self.last = {"version": version, **(sent if isinstance(sent, dict) else {}), "base": base}
        telemetry.event("engine.weight_push", version=version, base=str(base), bytes=self.last.get("bytes", -1),
                        num_buckets=len(buckets), failed=len(failures))
        if delta_refused:  # every failure a refused delta (wrong base, malformed): the whole weights, now
            telemetry.event("engine.weight_delta_refused", severity="warning", version=version, base=base,
                            slots=str(sorted(failures)), reason=next(iter(failures.values()))[:300])
            return self.publish(targets, source, version)
        return failures

    def _delta_base(self, targets: Targets, version: str) -> str | None:
        """The version a delta to ``version`` applies to, or None (a full push): see the module docstring."""
        base = self.base
        if not self.delta or base is None or base == version or not self.sender.holds(base):
            return None
        for _, client in targets:
            try:
                found = client.weight_version()
            except Exception:  # noqa: BLE001 - the push itself will fail and name it
                return None
            if found != base:
                telemetry.event("engine.weight_delta_refused", severity="warning", url=client.base_url, base=base,
                                found=found, version=version)
                return None
        return base

    @property
    def group_name(self) -> str | None:
        """The first channel's group (a one-rank trainer has one)."""
        return self.group_names[0] if self.group_names else None

    def _regroup(self, targets: Targets, failures: dict[int, str], version: str) -> None:
        """Fresh groups over exactly ``targets``, one per channel (its owner rank = group rank 0, rank i+1 =
        i-th target), formed one after the other."""
        if self.group_names:
            old = list(self.group_names)
            _each([(i, c) for i, c in targets if c.base_url in self.members],
                  lambda c: [c.destroy_weights_update_group(name) for name in old], {}, "destroy_group")
            self.sender.close_group()
        number, channels = next(self._names), self.sender.channels(version)
        self.group_names = [f"t1ops-weights-{number}" + (f"-c{c}" if channels > 1 else "") for c in range(channels)]
        self.members, self.base = (), None  # a new group: its members' versions are not known to agree
        world = len(targets) + 1
        ranks = {index: rank for rank, (index, _) in enumerate(targets, start=1)}
        for channel, name in enumerate(self.group_names):
            try:
                address, port = self.sender.group_address(self.backend, channel, version)
            except Exception as exc:  # e.g. no NCCL in this torch: no engine is asked to join
                failures.update({i: f"trainer cannot host the group: {exc}" for i, _ in targets})
                return
            handle = self.sender.open_group(master_port=port, world_size=world, group_name=name,
                                            backend=self.backend, channel=channel, version=version)
            _each(targets, lambda c, address=address, port=port, name=name: c.init_weights_update_group(
                PW.InitWeightsUpdateGroupRequest(master_address=address, master_port=port,
                                                 rank_offset=ranks[_slot_of(targets, c)], world_size=world,
                                                 group_name=name, backend=self.backend)),
                  failures, "init_weights_update_group")
            try:
                self.sender.wait(handle)
            except Exception as exc:
                failures.update({i: f"trainer could not form the group: {exc}" for i, _ in targets})
            telemetry.event("engine.weight_group", group=name, world_size=world, failed=len(failures),
                            channel=channel, channels=channels)
            if failures:
                return
        self.members = tuple(c.base_url for _, c in targets)

    def admit(self, client: EngineClient, source: str | None, version: str) -> None:
        raise EngineError("distributed weight sync admits new engines at the next barrier")

    def expected_checksums(self, version: str) -> dict | None:
        return self.sender.checksums(version)


def _slot_of(targets: Targets, client: EngineClient) -> int:
    return next(i for i, c in targets if c is client)


class LocalTrainerSender:
    """:class:`TrainerSender` for a :class:`rl.weights.sender.WeightSender` in this process (tests,
    ``bench/bench_sync.py``): the calls that block until the engines act run on a thread."""

    def __init__(self, sender) -> None:
        self.sender = sender
        self._thread = cf.ThreadPoolExecutor(1, thread_name_prefix="weights-rank0")

    def channels(self, version: str) -> int:
        return self.sender.weight_channels(version)

    def group_address(self, backend: str, channel: int = 0, version: str = "0") -> tuple[str, int]:
        return self.sender.weight_group_address(backend, channel, version)

    def open_group(self, *, master_port: int, world_size: int, group_name: str, backend: str, channel: int = 0,
                   version: str = "0") -> cf.Future:
        return self._thread.submit(self.sender.weight_open_group, master_port, world_size, group_name, backend,
                                   channel, version)

    def buckets(self, version: str, base: str | None = None) -> list:
        return self.sender.weight_buckets(version, base)

    def send(self, version: str, base: str | None = None) -> cf.Future:
        return self._thread.submit(self.sender.weight_send, version, base)

    def holds(self, version: str) -> bool:
        return self.sender.weight_holds(version)

    def checksums(self, version: str) -> dict:
        return self.sender.weight_checksums(version)

    def close_group(self) -> None:
        self.sender.weight_close_group()

    def wait(self, handle: cf.Future) -> Any:
        return handle.result()
