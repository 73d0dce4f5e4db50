"""Running one work unit: read -> tokenize -> pack -> forward -> pool -> write.

Model-agnostic: the model is behind `states.contract.WorkerRuntime`. The same
`UnitRunner` runs in-process (tests, `backend="local"`) and inside the Ray actor, which
only holds it. A feed thread reads the unit (`workers.feed`) and sends each window to
tokenizing as soon as its rows are read (`workers.tokenize_pool`); windows are forwarded
in order, merged into launch groups (`workers.batching`). Packs launch asynchronously;
each group's outputs come home in one non-blocking copy, and a writer thread encodes
them into the shard (`workers.assemble`, `ShardWriter`) once the device is past them.
A group with `Pending` outputs (their width is the device's) is handed on after the next
group's packs are queued, so that sizing them never leaves the device without work.
Each stage runs in a `pooljobs.*` profiler range (`python -m bench.timeline`).

`run` may be called from two threads at once: units launch one at a time, in the order
`run` was called, which is also the order they are read and tokenized in; the next one's
packs queue right behind, and meanwhile a third is read and tokenized.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from queue import SimpleQueue

import numpy as np
import pyarrow.compute as pc
import torch
from torch.profiler import record_function

from states import ragged
from states.contract import WorkerRuntime
from states.ragged import Ragged
from workers.assemble import errors_table, in_input_order, part_values, shard_part
from workers import batching, storage
from workers.batching import MAX_SEQS_PER_PACK, WindowStream, launch_groups
from workers.dedup import HASH_ALGORITHM, OutputCache, PreviousOutput, UnitCopies
from workers.feed import UnitInput, feed_unit
from workers.options import UnitOptions
from workers.packing import PackPlan, build_pack, plan_packs
from workers.reader import Unit
from workers.staging import PinnedStaging
from workers.tokenize import REFERENCE, Encoded, EncodedWindow
from workers.tokenize_pool import RayTokenizer, ThreadTokenizer, Tokenizing
from workers.tokenizer_choice import choose_tokenizer
from workers.version import VERSION
from workers.writer import ShardWriter, write_table

WARM_IN_FLIGHT = 4  # copies of each warm-up pack queued at once (a unit keeps several packs in flight)

__all__ = ["VERSION", "RowError", "UnitResult", "UnitRunner"]


class RowError(ValueError):
    """A row cannot be processed and the job runs with on_error='fail'."""


@dataclass
class UnitResult:
    """What a worker reports for a committed unit (metadata only)."""

    name: str
    rows: int  # rows written to the shard
    errors: int  # rows quarantined under _errors/
    tokens: int  # real tokens forwarded
    padded_tokens: int  # tokens the device computed, padding included
    truncated: int  # rows longer than max_length (truncated, or split with overlong="chunk")
    duplicate_ids: int  # rows whose id already appeared earlier in this unit (all are kept)
    computed: int  # input rows forwarded (the rest are copies, or quarantined)
    deduplicated: int  # input rows copied from a row of this job with the same content hash
    reused: int  # input rows copied from the previous output (`--reuse`)
    checksum: str  # sha256 of the shard file
    bytes: int
    schema: str
    worker: str
    seconds: dict[str, float] = field(default_factory=dict)  # per stage; stages overlap, tokenize is CPU time in tasks
    wall_seconds: float = 0.0  # from the unit's start to its commit
    reuse_refused: str | None = None  # why the previous output's shards were not used


    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Launched:
    """A unit's launch groups so far: their writer futures and counts."""

    parts: list[Future] = field(default_factory=list)  # each group's (device seconds, write seconds)
    rejected: dict[int, str] = field(default_factory=dict)  # unit row -> why the tokenizer left it out
    tokens: int = 0
    padded: int = 0
    truncated: int = 0
    tokenize_seconds: float = 0.0
    wait_seconds: float = 0.0  # the launching thread waiting for tokens

    def add(self, window: EncodedWindow, part: Future, padded: int) -> None:
        self.parts.append(part)
        self.rejected.update(window.rejected)
        self.tokens += window.tokens
        self.padded += padded
        self.truncated += int(window.encoded.truncated.sum())
        self.tokenize_seconds += window.seconds


def _synthetic(ids: np.ndarray, total: int, longest: int) -> Encoded:
    """`total` tokens (`ids` repeated) in sequences of `longest`, the last one shorter."""
    lengths = np.full(total // longest, longest, np.int64)
    if total % longest:
        lengths = np.append(lengths, total % longest)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    n = len(lengths)
    return Encoded(np.resize(ids, total), offsets, None, np.zeros(n, bool), np.arange(n), np.zeros(n, np.int32))


class DeviceTimer:
    """Time the device spends on the work queued between construction and `stop`: CUDA
    events on a GPU (the host only sees launch time), the host clock elsewhere (where
    compute is synchronous). `home` marks when a group's outputs are home (queued later
    than `stop` where the group was held behind the next one)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._start = self._mark()
        self._home: torch.cuda.Event | float | None = None

    def _mark(self) -> torch.cuda.Event | float:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True, blocking=True)  # blocking: the waiter sleeps, not spins
        event.record()
        return event

    def stop(self) -> None:
        self._end = self._mark()

    def home(self) -> None:
        self._home = self._mark()

    def seconds(self) -> float:
        """Waits for the device to reach `home` (or `stop`); the seconds up to `stop`."""
        if not self.cuda:
            return self._end - self._start
        (self._home or self._end).synchronize()
        return self._start.elapsed_time(self._end) / 1e3


@dataclass
class Group:
    """A launch group whose packs are queued: what its writer part needs."""

    window: EncodedWindow
    rows: list[np.ndarray]  # each pack's unit rows
    chunks: list[np.ndarray]  # each pack's rows' chunk numbers
    outputs: list[dict[str, torch.Tensor | Ragged | ragged.Pending]]  # each pack's, as launched
    padded: int  # tokens the device computes, padding included
    timer: DeviceTimer

    @property
    def pending(self) -> bool:
        return any(ragged.pending(o) for o in self.outputs)


class UnitRunner:
    def __init__(self, options: UnitOptions, runtime: WorkerRuntime, model_sha256: str | None = None,
                 tokenize_in_tasks: bool = False) -> None:
        """`model_sha256`: the driver's hash of the model files, so each worker need not
        read all the weights again to stamp its shards (computed here when absent).
        `tokenize_in_tasks`: Ray CPU tasks are at hand (a GPU worker inside Ray); with
        `tokenize_in="auto"` they are used only when no fast tokenizer passed its checks."""
        self.options = options
        self.runtime = runtime
        if options.overlong == "chunk" and options.chunk_aggregate == "mean" and runtime.ragged:
            raise ValueError("chunk_aggregate='mean' averages dense embeddings only; this model's sparse or "
                             "multivector outputs need chunk_aggregate='none'")
        self.choice = choose_tokenizer(runtime.tokenizer, runtime.max_length, runtime.prompt,
                                       chunk=options.overlong == "chunk", stride=options.chunk_stride,
                                       pairs=options.pair_column is not None)
        self._in_tasks = options.tokenize_in == "tasks" or (options.tokenize_in == "auto" and tokenize_in_tasks
                                                            and self.choice.spec.backend == REFERENCE)
        self.tokenizer = self._tokenizer()
        self._rows_checked = False
        self.max_tokens = options.max_tokens or runtime.token_budget()
        self._staging = PinnedStaging(runtime.device) if runtime.device.type == "cuda" else None
        self.worker = f"{socket.gethostname()}:{runtime.device}"
        self._order = threading.Lock()  # feeds and device turns are handed out in one order
        self._last_turn = threading.Event()  # set when the latest unit has queued all its packs
        self._last_turn.set()
        self._writes = ThreadPoolExecutor(max_workers=1, thread_name_prefix="write")  # launch groups' rows, in order
        # Units are read and their windows sent to the tokenizer from a thread of their own,
        # in order, so sending (a Ray task each) never delays a launch.
        self._feeds = ThreadPoolExecutor(max_workers=1, thread_name_prefix="feed")
        self.metadata = {"pooljobs_version": VERSION, **runtime.provenance(), **self.choice.provenance(),
                         "output_dtype": options.output_dtype, "overlong": options.overlong,
                         "chunk_stride": str(options.chunk_stride), "chunk_aggregate": options.chunk_aggregate,
                         "pairs": str(options.pair_column is not None),
                         "model_sha256": model_sha256 or runtime.fingerprint(), "content_hash": HASH_ALGORITHM}
        # Rows this worker computed, for later units' copies (`workers.dedup`).
        self.cache = OutputCache(options.dedup_cache_mb << 20) if options.dedup else None
        self._schema_metadata = {"pooljobs": json.dumps(self.metadata)}  # every shard's Parquet metadata

    def _tokenizer(self) -> Tokenizing:
        spec = self.choice.spec
        return RayTokenizer(spec, self.options.max_retries) if self._in_tasks else ThreadTokenizer(spec)

    def _tokenizer_for(self, first_texts: list[str], first_pairs: list[str] | None = None) -> Tokenizing:
        """The tokenizer for a unit (on the feed thread, before its first window): the
        worker's first unit checks the chosen backend on its first rows, and falls back
        to the reference (recorded in the shards' provenance) on a mismatch."""
        if not self._rows_checked and first_texts:
            self._rows_checked = True
            if self.choice.check_rows(first_texts, first_pairs):
                self.tokenizer.close()
                self.tokenizer = self._tokenizer()
                self.metadata.update(self.choice.provenance())
                self._schema_metadata = {"pooljobs": json.dumps(self.metadata)}
        return self.tokenizer

    def warm_up(self) -> None:
        """At load time, before the first unit: tokenizing processes start (Ray tasks), and
        on a GPU the device runs packs of every size a unit launches (`warm_device`)."""
        if isinstance(self.tokenizer, RayTokenizer):
            self.tokenizer.warm_up()
        if self.runtime.device.type == "cuda":
            self.warm_device()

    def warm_device(self) -> None:
        """Forward synthetic packs from 1,024 tokens, doubling, up to the largest launch
        group's (`max_tokens` or a full group plus one window of the longest rows), each
        `WARM_IN_FLIGHT` times queued with its outputs copied home, as a unit does: the
        device's and the pinned host memory pools grow, and kernels load, before the first unit."""
        ids = np.asarray(self.runtime.tokenizer("pooljobs warm-up: a short text.")["input_ids"], np.int32)
        group = batching.GROUP_TOKENS + self.options.window_rows * self.runtime.max_length
        total = min(1024, self.max_tokens, group)
        try:
            while True:
                enc = _synthetic(ids, total, self.runtime.max_length)
                plan = PackPlan(np.arange(len(enc.lengths)))
                for _ in range(WARM_IN_FLIGHT):
                    budget = self.max_tokens
                    self._to_host([ragged.resolve(out) for _, out in self._forward(enc, plan)])
                    if self.max_tokens < budget:  # out of memory: `_forward` halved the budget, which now holds
                        return
                if total >= min(self.max_tokens, group):
                    return
                total = min(2 * total, self.max_tokens, group)
        finally:
            if self.runtime.device.type == "cuda":
                torch.cuda.synchronize(self.runtime.device)

    def run(self, unit: Unit) -> UnitResult:
        t0 = time.perf_counter()
        queue: SimpleQueue = SimpleQueue()
        with self._order:
            feed = self._feeds.submit(self._feed, unit, queue)  # runs ahead of the device
            turn, done = self._last_turn, threading.Event()
            self._last_turn = done
        shard = ShardWriter(storage.join(self._out(), "data", f"{unit.name}.parquet"), self.options.storage_options)
        launched = Launched()
        try:
            try:
                turn.wait()
                self._launch_groups(WindowStream(queue), shard, feed, launched)
            finally:
                done.set()  # the next unit's packs may queue behind this one's
            source = feed.result()  # raises the read's error, if any
            launched.parts.append(self._writes.submit(self._write_tail, shard, source))
            device_s = write_s = 0.0
            for part in launched.parts:
                device, write = part.result()
                device_s, write_s = device_s + device, write_s + write
            bad = self._bad_rows(unit, source, launched)
            t = time.perf_counter()
            with record_function("pooljobs.commit"):
                if bad:
                    write_table(storage.join(self._out(), "_errors", f"{unit.name}.parquet"),
                                errors_table(unit, source.keys, bad), self.options.storage_options)
                nbytes, checksum = shard.commit()
            commit_s = time.perf_counter() - t  # on the critical path for the last unit
        except BaseException:
            wait(launched.parts)  # the writer thread is done with the shard
            shard.abort()
            raise
        clock = {"read": source.read_seconds, "tokenize": launched.tokenize_seconds,
                 "wait_tokens": launched.wait_seconds, "forward": device_s, "write": write_s, "commit": commit_s}
        key_values = source.keys[1]
        duplicates = len(key_values) - len(pc.unique(key_values)) if self.options.id_column else 0
        copies = source.copies
        copied = copies.copies - len(copies.orphans)
        return UnitResult(unit.name, shard.rows, len(bad), launched.tokens, launched.padded, launched.truncated,
                          duplicates, copies.usable - copies.copies - len(launched.rejected), copied - copies.reused,
                          copies.reused, checksum, nbytes, shard.schema.remove_metadata().to_string(),
                          self.worker, clock, time.perf_counter() - t0,
                          copies.previous.refused if copies.previous is not None else None)

    def _feed(self, unit: Unit, queue: SimpleQueue) -> UnitInput:
        """Read the unit (`feed_unit`), its copies decided against the unit's previous
        shards (`Unit.reuse`) and this worker's cache."""
        previous = None
        if unit.reuse and self.options.dedup:
            previous = PreviousOutput.load(unit.reuse, self.metadata, self.options.storage_options)
            if self.cache is not None:
                previous.add_to(self.cache)
        copies = UnitCopies(self.options.dedup, self.cache, previous)
        return feed_unit(unit, self.options, self._tokenizer_for, queue, copies)

    def _bad_rows(self, unit: Unit, source: UnitInput, launched: Launched) -> dict[int, str]:
        """Unit row -> why it is quarantined; with on_error='fail', `RowError` for the first."""
        bad = {**source.bad, **launched.rejected}
        bad.update({copy: bad[owner] for copy, owner in source.copies.orphans.items()})
        if bad and self.options.on_error == "fail":
            row = min(bad)
            uri, file_row = unit.locate(row + 1)[row]
            raise RowError(f"{uri}: row {file_row}: {bad[row]} (on_error='fail')")
        return bad

    def _launch_groups(self, windows: WindowStream, shard: ShardWriter, source: Future, launched: Launched) -> None:
        """Launch the unit's windows group by group (`batching.launch_groups`), each
        group's packs on the device and its rows queued for the writer thread; a group
        with pending outputs is handed on once the next one is queued (or the unit ends)."""
        groups = launch_groups(windows)
        held: Group | None = None
        while True:
            t = time.perf_counter()
            with record_function("pooljobs.wait_tokens"):
                window = next(groups, None)
            launched.wait_seconds += time.perf_counter() - t
            if window is None:
                if held is not None:
                    self._hand_on(held, shard, source, launched)
                return
            with record_function("pooljobs.launch"):
                group = self._launch(window)
            if held is not None:
                self._hand_on(held, shard, source, launched)
                held = None
            if group.pending:
                held = group
            else:
                self._hand_on(group, shard, source, launched)

    def _launch(self, window: EncodedWindow) -> Group:
        """Queue a launch group's packs on the device."""
        enc, lengths, packed = window.encoded, window.encoded.lengths, self.runtime.packed
        timer = DeviceTimer(self.runtime.device)
        rows, chunks, outputs, padded = [], [], [], 0
        for plan in plan_packs(lengths, self.max_tokens, MAX_SEQS_PER_PACK, packed):
            for pack_rows, out in self._forward(enc, plan):
                padded += int(lengths[pack_rows].sum()) if packed else len(pack_rows) * int(lengths[pack_rows].max())
                rows.append(window.kept[enc.source[pack_rows]])
                chunks.append(enc.chunk[pack_rows])
                outputs.append(out)
        timer.stop()
        return Group(window, rows, chunks, outputs, padded, timer)

    def _hand_on(self, group: Group, shard: ShardWriter, source: Future, launched: Launched) -> None:
        """A queued group's outputs resolved and copied home, its rows queued for the writer
        thread (`launched` keeps the writer's future)."""
        host = self._to_host([ragged.resolve(out) for out in group.outputs])  # not waited for: the writer waits for `home`
        group.timer.home()
        part = self._writes.submit(self._write_part, shard, source, group.rows, group.chunks, host, group.timer)
        launched.add(group.window, part, group.padded)

    def _forward(self, encoded: Encoded, plan: PackPlan
                 ) -> list[tuple[np.ndarray, dict[str, torch.Tensor | Ragged | ragged.Pending]]]:
        """Launch one pack (asynchronously on CUDA); on out-of-memory, halve the budget
        and split the pack."""
        with record_function("pooljobs.pack"):
            pack = build_pack(encoded, plan) if self._staging is None else self._staging.stage(encoded, plan)
        try:
            return [(plan.rows, self.runtime.launch(pack))]
        except torch.OutOfMemoryError:
            if len(plan.rows) == 1:
                raise
            self.max_tokens = max(1, self.max_tokens // 2)
            if self.runtime.device.type == "cuda":
                torch.cuda.empty_cache()
            half = len(plan.rows) // 2
            return self._forward(encoded, PackPlan(plan.rows[:half])) + self._forward(encoded, PackPlan(plan.rows[half:]))

    def _to_host(self, outputs: list[dict[str, torch.Tensor | Ragged]]) -> dict[str, torch.Tensor | list[Ragged]]:
        """Packs' outputs -> one non-blocking copy home per output; ragged outputs (their widths
        differ per pack) as one copy per pack, flattened by the writer thread."""
        home: dict[str, torch.Tensor | list[Ragged]] = {}
        for k, shape in self.runtime.output_shapes.items():
            if k in self.runtime.ragged:
                home[k] = [o[k].to("cpu", non_blocking=True) for o in outputs] or [Ragged.empty(shape)]
            else:
                home[k] = torch.cat([o[k] for o in outputs]).to("cpu", non_blocking=True) if outputs \
                    else torch.zeros((0, *shape))
        return home

    def _write_part(self, shard: ShardWriter, source: Future, rows: list[np.ndarray],
                    chunks: list[np.ndarray], host: dict[str, torch.Tensor | list[Ragged]],
                    timer: DeviceTimer) -> tuple[float, float]:
        """One launch group's rows into the shard, in input order (on the writer thread, once
        the device has produced them); (device seconds, host seconds) spent on them."""
        with record_function("pooljobs.wait_device"):
            device_s = timer.seconds()
        t = time.perf_counter()
        with record_function("pooljobs.write"):
            arrays = {k: ragged.flatten(v) if isinstance(v, list) else v.numpy() for k, v in host.items()}
            rows, chunks, outputs = in_input_order(rows, chunks, arrays, self.options, self.runtime.normalize)
            values = part_values(chunks, outputs, self.options, self.runtime.labels, self.runtime.ranges)
            self._write_rows(shard, source.result(), *source.result().copies.merge(rows, values))
        return device_s, time.perf_counter() - t

    def _write_tail(self, shard: ShardWriter, source: UnitInput) -> tuple[float, float]:
        """The unit's copies after its last computed row (on the writer thread, last)."""
        t = time.perf_counter()
        rows, values = source.copies.tail()
        if len(rows):
            self._write_rows(shard, source, rows, values)
        return 0.0, time.perf_counter() - t

    def _write_rows(self, shard: ShardWriter, source: UnitInput, rows: np.ndarray, values) -> None:
        part = shard_part(source.keys, source.copies.hash_column(), rows, values)
        shard.write(part.replace_schema_metadata(self._schema_metadata))

    def _out(self) -> str:
        return self.options.output.rstrip("/")

    def close(self) -> None:
        self.tokenizer.close()
        self._writes.shutdown(wait=False, cancel_futures=True)
        self._feeds.shutdown(wait=False, cancel_futures=True)
