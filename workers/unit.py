"""Running one work unit: read -> tokenize -> pack -> forward -> pool -> write.

Model-agnostic: everything model-specific is behind `Runtime.compute`. The same
`UnitRunner` runs in-process (tests, `backend="local"`) and inside the Ray actor, which
only holds it. A feed thread reads the unit (its first row group first) and sends each
window to tokenizing as soon as its rows are read (to Ray CPU tasks for a GPU worker,
else to a background thread: `workers.tokenize_pool`); windows are forwarded in order,
merged into launch groups that grow from `FIRST_GROUP_TOKENS` to `GROUP_TOKENS`. Packs
launch asynchronously; each group's outputs come home in one non-blocking copy, and a
writer thread encodes them into the shard (`ShardWriter`) once the device is past them,
so when the last pack finishes only its group is left to write. Each stage runs in a
`pooljobs.*` profiler range (`python -m bench.timeline` splits the device's idle time by
them). `run` may be called from two threads at once: units launch one at a time, in the
order `run` was called, which is also the order they are read and tokenized in (a unit
that took the device first would wait on windows queued behind the other's); the next
one's packs queue right behind, and meanwhile a third is read and tokenized.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from queue import SimpleQueue
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.profiler import record_function

from states import ragged
from states.ragged import Ragged
from states.runtime import Runtime
from workers import storage
from workers.packing import PackPlan, build_pack, plan_packs
from workers.reader import Unit, read_unit_parts, text_column
from workers.tokenize import Encoded, EncodedWindow, TokenizerSpec
from workers.tokenize_pool import RayTokenizer, ThreadTokenizer, part_table
from workers.options import UnitOptions
from workers.writer import ShardWriter, output_columns, write_table

VERSION = "0.4.0"  # launch groups ramp up by tokens, not one per ramp window (packs, so float bits, changed)
MAX_SEQS_PER_PACK = 4096
RAMP_ROWS = 16
RAMP_GROWTH = 1.25
GROUP_TOKENS = 1 << 17  # tokenized windows merged into one launch group, up to this many tokens
FIRST_GROUP_TOKENS = 1 << 14  # a unit's first launch group; the next ones double (`group_targets`)
WARM_IN_FLIGHT = 4  # copies of each warm-up pack queued at once (a unit keeps several packs in flight)


Output = np.ndarray | tuple[np.ndarray, np.ndarray]  # (N, ...), or a ragged output's (values, lengths)


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
    checksum: str  # sha256 of the shard file
    bytes: int
    schema: str
    worker: str
    seconds: dict[str, float] = field(default_factory=dict)  # per stage; stages overlap, tokenize is CPU time in tasks
    wall_seconds: float = 0.0  # from the unit's start to its commit

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class UnitInput:
    """What the reading of a unit leaves besides its windows."""

    keys: tuple[str, pa.Array]  # (name, values): the output key column
    bad: dict[int, str]  # unit row -> why it cannot be processed (null text, invalid UTF-8)


class _Stream:
    """The windows a feed puts on a queue, taken in order, with a look at the next one;
    None once the feed is done. Looking ahead only when asked keeps a launch from
    waiting on a window that is not needed to decide it."""

    def __init__(self, queue: SimpleQueue) -> None:
        self._queue, self._head, self._done = queue, None, False

    def peek(self):
        if self._head is None and not self._done:
            self._head = self._queue.get()
            self._done = self._head is None
        return self._head

    def pop(self):
        item, self._head = self.peek(), None
        return item


def default_max_tokens(runtime: Runtime) -> int:
    """Token budget per forward: CPU a fixed 16k; CUDA sized so one layer's activations
    (about hidden*6 + intermediate values per token) use a quarter of free memory."""
    if runtime.device.type != "cuda":
        return 16_384
    free, _ = torch.cuda.mem_get_info(runtime.device)
    cfg = runtime.state.config
    hidden = getattr(cfg, "hidden_size", 1024)
    inter = getattr(cfg, "intermediate_size", 4 * hidden)
    per_token = (6 * hidden + inter) * torch.finfo(runtime.dtype).bits // 8
    return int(max(2048, min(1 << 19, free // 4 // per_token)))


def group_targets() -> Iterator[int]:
    """Tokens each launch group of a unit holds at least: `FIRST_GROUP_TOKENS`, doubling
    up to `GROUP_TOKENS`.

    A launch costs the host 9-25 ms of Python on the H200 (as much in a process as in a Ray
    actor, `bench.groups --in-process`), whatever the pack's size; launched one by one,
    the 13 ramp windows that start a unit took 0.3-0.7 s of host time for ~100k tokens
    (~45 ms of device time). A few groups growing from 16k tokens still start the device
    early, as soon as the first small windows are tokenized."""
    target = min(FIRST_GROUP_TOKENS, GROUP_TOKENS)
    while True:
        yield target
        target = min(2 * target, GROUP_TOKENS)


def _synthetic(ids: np.ndarray, total: int, longest: int) -> Encoded:
    """`total` tokens (`ids` repeated) in sequences of `longest`, the last one shorter."""
    lengths = np.full(total // longest, longest, np.int64)
    if total % longest:
        lengths = np.append(lengths, total % longest)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    n = len(lengths)
    return Encoded(np.resize(ids, total), offsets, None, np.zeros(n, bool), np.arange(n), np.zeros(n, np.int32))


def window_sizes(window_rows: int) -> Iterator[int]:
    """Window sizes in rows: growing by `RAMP_GROWTH` from `RAMP_ROWS` to `window_rows`.

    All windows tokenize side by side, each in one task, so a window of n rows is ready
    after about n / (one CPU's rate); a gentle ramp makes them arrive one after another,
    so the first launch group (a few small windows, `group_targets`) is ready within tens
    of milliseconds instead of a full-size window's time (~0.12 s for 256 rows of ~100 tokens)."""
    size = min(RAMP_ROWS, window_rows)
    while True:
        yield size
        size = min(window_rows, max(size + 1, int(size * RAMP_GROWTH)))


class WindowCutter:
    """Cuts a unit's usable rows 0, 1, 2, ... into windows of `window_sizes` as they
    become known, part by part: the windows are the same however the rows arrive."""

    def __init__(self, window_rows: int) -> None:
        self._sizes = window_sizes(window_rows)
        self._start, self._size = 0, next(self._sizes)

    def take(self, known: int, last: bool) -> list[tuple[int, int]]:
        """[start, stop) windows complete among the first `known` rows; with `last`
        (all rows known), also the final partial one."""
        windows = []
        while self._start + self._size <= known or (last and self._start < known):
            windows.append((self._start, min(known, self._start + self._size)))
            self._start, self._size = self._start + self._size, next(self._sizes)
        return windows


class DeviceTimer:
    """Time the device spends on the work queued between construction and `stop`: CUDA
    events on a GPU (the host only sees launch time), the host clock elsewhere (where
    compute is synchronous). The end event also marks when a group's outputs are home."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._start = self._mark()

    def _mark(self) -> torch.cuda.Event | float:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True, blocking=True)  # blocking: the waiter sleeps, not spins
        event.record()
        return event

    def stop(self) -> None:
        self._end = self._mark()

    def seconds(self) -> float:
        """Waits for the device to reach `stop`."""
        if not self.cuda:
            return self._end - self._start
        self._end.synchronize()
        return self._start.elapsed_time(self._end) / 1e3


class UnitRunner:
    def __init__(self, options: UnitOptions, runtime: Runtime, model_sha256: str | None = None,
                 tokenize_in_tasks: bool = False) -> None:
        """`model_sha256`: the driver's hash of the model files, so each worker need not
        read all the weights again to stamp its shards (computed here when absent).
        `tokenize_in_tasks`: tokenize in Ray CPU tasks (for GPU workers inside Ray)."""
        self.options = options
        self.runtime = runtime
        if options.overlong == "chunk" and options.chunk_aggregate == "mean" and runtime.ragged:
            raise ValueError("chunk_aggregate='mean' averages dense embeddings only; this model's sparse or "
                             "multivector outputs need chunk_aggregate='none'")
        self.tokenizer_spec = TokenizerSpec.from_hf(self.runtime.tokenizer, self.runtime.max_length, self.runtime.prompt,
                                                    chunk=options.overlong == "chunk", stride=options.chunk_stride)
        self.tokenizer = (RayTokenizer(self.tokenizer_spec, options.max_retries) if tokenize_in_tasks
                          else ThreadTokenizer(self.tokenizer_spec))
        self.max_tokens = options.max_tokens or default_max_tokens(self.runtime)
        self.worker = f"{socket.gethostname()}:{self.runtime.device}"
        self._order = threading.Lock()  # feeds and device turns are handed out in one order
        self._last_turn = threading.Event()  # set when the latest unit has queued all its packs
        self._last_turn.set()
        self._writes = ThreadPoolExecutor(max_workers=1, thread_name_prefix="write")  # launch groups' rows, in order
        # Units are read and their windows sent to the tokenizer from a thread of their own,
        # in order, so sending (a Ray task each) never delays a launch.
        self._feeds = ThreadPoolExecutor(max_workers=1, thread_name_prefix="feed")
        self.metadata = {"pooljobs_version": VERSION, **self.runtime.provenance(),
                         "output_dtype": options.output_dtype, "model_sha256": model_sha256 or self.runtime.fingerprint()}
        self._schema_metadata = {"pooljobs": json.dumps(self.metadata)}  # every shard's Parquet metadata

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
        `WARM_IN_FLIGHT` times queued with its outputs copied home, as a unit does.

        Otherwise a worker's first unit pays for growing the device's and the pinned host
        memory pools (blocking allocator calls between launches) and for kernels' first
        use: on the H200 a first run after load took 3.30 s for 40,000 docs (bert-base
        shape) that a second run did in 2.15 s."""
        ids = np.asarray(self.runtime.tokenizer("pooljobs warm-up: a short text.")["input_ids"], np.int32)
        group = GROUP_TOKENS + self.options.window_rows * self.runtime.max_length
        total = min(1024, self.max_tokens, group)
        try:
            while True:
                enc = _synthetic(ids, total, self.runtime.max_length)
                plan = PackPlan(np.arange(len(enc.lengths)))
                for _ in range(WARM_IN_FLIGHT):
                    budget = self.max_tokens
                    self._to_host([out for _, out in self._forward(enc, plan)])
                    if self.max_tokens < budget:  # out of memory: `_forward` halved the budget, which now holds
                        return
                if total >= min(self.max_tokens, group):
                    return
                total = min(2 * total, self.max_tokens, group)
        finally:
            if self.runtime.device.type == "cuda":
                torch.cuda.synchronize(self.runtime.device)

    # -- the stages -----------------------------------------------------------------
    def _texts(self, unit: Unit, table: pa.Table) -> tuple[list, list | None, list[str | None]]:
        texts, reasons = text_column(table, self.options.text_column, unit.uri)
        pairs = None
        if self.options.pair_column:
            pairs, pair_reasons = text_column(table, self.options.pair_column, unit.uri)
            reasons = [a or (b and f"{self.options.pair_column}: {b}") for a, b in zip(reasons, pair_reasons)]
        return texts, pairs, reasons

    def _forward(self, encoded: Encoded, plan: PackPlan) -> list[tuple[np.ndarray, dict[str, torch.Tensor]]]:
        """Launch one pack (asynchronously on CUDA); on out-of-memory, halve the budget
        and split the pack."""
        with record_function("pooljobs.pack"):
            pack = build_pack(encoded, plan)
            if self.runtime.device.type == "cuda":
                pack = pack.pin_memory()
        try:
            return [(plan.rows, self.runtime.compute(pack.to(self.runtime.device, non_blocking=True)))]
        except torch.OutOfMemoryError:
            if len(plan.rows) == 1:
                raise
            self.max_tokens = max(1, self.max_tokens // 2)
            if self.runtime.device.type == "cuda":
                torch.cuda.empty_cache()
            half = len(plan.rows) // 2
            return self._forward(encoded, PackPlan(plan.rows[:half])) + self._forward(encoded, PackPlan(plan.rows[half:]))

    def _feed(self, unit: Unit, windows: SimpleQueue, clock: dict[str, float]) -> UnitInput:
        """Read the unit part by part and send its windows to the tokenizer as soon as
        their rows are read (on the feed thread); each one's pending tokens go to
        `windows`, then None. Windows are cut from the usable rows by `WindowCutter`, the
        same whatever the parts, so a rerun tokenizes and packs the same rows together."""
        options = self.options
        columns = list(dict.fromkeys(c for c in (options.text_column, options.pair_column, options.id_column) if c))
        reasons: list[str | None] = []
        tables: list[pa.Table] = []
        parts, starts = [], []  # each read part's texts as the tokenizer holds them, and its first row
        good: list[int] = []
        cutter = WindowCutter(options.window_rows)

        def send(start: int, stop: int) -> None:
            rows = np.array(good[start:stop], dtype=np.int64)
            part = np.searchsorted(starts, rows, side="right") - 1
            segments = [(parts[i], rows[part == i] - starts[i]) for i in np.unique(part)] or [(parts[-1], rows)]
            with record_function("pooljobs.submit"):
                pending = self.tokenizer.submit(rows, segments)
            windows.put(pending)

        try:
            reading = read_unit_parts(unit, columns, options.storage_options)
            while True:
                t = time.perf_counter()
                with record_function("pooljobs.read"):
                    table = next(reading, None)
                    if table is not None:
                        part_texts, part_pairs, part_reasons = self._texts(unit, table)
                        starts.append(len(reasons))
                        parts.append(self.tokenizer.put(part_table(part_texts, part_pairs)))
                clock["read"] += time.perf_counter() - t
                if table is None:
                    break
                good.extend(len(reasons) + i for i, r in enumerate(part_reasons) if r is None)
                reasons += part_reasons
                tables.append(table)
                for start, stop in cutter.take(len(good), last=False):
                    send(start, stop)
            for start, stop in cutter.take(len(good), last=True):
                send(start, stop)
            if not good:  # no usable row still makes one (empty) window, so the shard gets its columns
                send(0, 0)
            table = pa.concat_tables(tables)
            return UnitInput(self._keys(unit, table), {i: r for i, r in enumerate(reasons) if r is not None})
        finally:
            windows.put(None)

    def run(self, unit: Unit) -> UnitResult:
        options = self.options
        clock = {"read": 0.0, "tokenize": 0.0, "wait_tokens": 0.0, "forward": 0.0, "write": 0.0, "commit": 0.0}
        t0 = time.perf_counter()
        queue: SimpleQueue = SimpleQueue()
        with self._order:
            feed = self._feeds.submit(self._feed, unit, queue, clock)  # tokenizing runs ahead of the device
            turn, done = self._last_turn, threading.Event()
            self._last_turn = done
        shard = ShardWriter(storage.join(self._out(), "data", f"{unit.name}.parquet"), options.storage_options)
        parts: list[Future] = []
        try:
            rejected, tokens, padded, truncated = self._launch_groups(turn, done, _Stream(queue), shard, feed, parts, clock)
            source = feed.result()  # raises the read's error, if any
            for part in parts:
                device_s, write_s = part.result()
                clock["forward"] += device_s
                clock["write"] += write_s

            bad = {**source.bad, **rejected}
            if bad and options.on_error == "fail":
                row = min(bad)
                uri, file_row = unit.locate(row + 1)[row]
                raise RowError(f"{uri}: row {file_row}: {bad[row]} (on_error='fail')")
            t = time.perf_counter()
            with record_function("pooljobs.commit"):
                if bad:
                    self._write_errors(unit, source.keys, bad)
                nbytes, checksum = shard.commit()
            clock["commit"] = time.perf_counter() - t  # on the critical path for the last unit
        except BaseException:
            wait(parts)  # the writer thread is done with the shard
            shard.abort()
            raise
        key_values = source.keys[1]
        duplicates = len(key_values) - len(pc.unique(key_values)) if options.id_column else 0
        return UnitResult(unit.name, shard.rows, len(bad), tokens, padded, truncated, duplicates, checksum, nbytes,
                          shard.schema.remove_metadata().to_string(), self.worker, clock, time.perf_counter() - t0)

    def _launch_groups(self, turn: threading.Event, done: threading.Event, windows: _Stream, shard: ShardWriter,
                       source: Future, parts: list[Future], clock: dict[str, float]) -> tuple[dict[int, str], int, int, int]:
        """Launch a unit's windows in launch groups once it is this unit's `turn`, adding
        each group's writer future to `parts`; (rejected rows, tokens, padded tokens,
        truncated texts). One unit launches at a time, in turn; the next may start once
        this one's last pack is queued (`done`), so its packs follow on the device without a gap."""
        rejected: dict[int, str] = {}
        tokens = padded = truncated = 0
        try:
            turn.wait()
            targets = group_targets()
            while (first := windows.pop()) is not None:
                w = time.perf_counter()
                target = next(targets)
                with record_function("pooljobs.wait_tokens"):
                    group = [first.result()]
                    # Windows join a launch group until it holds `target` tokens. Decided by
                    # token counts, never by which windows are ready, so a rerun packs the
                    # same rows and writes the same bytes.
                    while sum(g.tokens for g in group) < target and windows.peek() is not None:
                        group.append(windows.pop().result())
                clock["wait_tokens"] += time.perf_counter() - w
                with record_function("pooljobs.launch"):
                    window = EncodedWindow.concat(group)
                    part, group_padded = self._launch(window, shard, source)
                clock["tokenize"] += window.seconds
                rejected.update(window.rejected)
                tokens, truncated = tokens + window.tokens, truncated + int(window.encoded.truncated.sum())
                parts.append(part)
                padded += group_padded
        finally:
            done.set()
        return rejected, tokens, padded, truncated

    def _launch(self, window: EncodedWindow, shard: ShardWriter, source: Future) -> tuple[Future, int]:
        """Queue a launch group's packs on the device and its rows for the writer thread;
        (the writer's future, tokens the device computes, padding included)."""
        enc, lengths = window.encoded, window.encoded.lengths
        timer = DeviceTimer(self.runtime.device)
        rows, chunks, outputs, padded = [], [], [], 0
        for plan in plan_packs(lengths, self.max_tokens, MAX_SEQS_PER_PACK, self.runtime.state.packed):
            for pack_rows, out in self._forward(enc, plan):
                padded += int(lengths[pack_rows].sum()) if self.runtime.state.packed else \
                    len(pack_rows) * int(lengths[pack_rows].max())
                rows.append(window.kept[enc.source[pack_rows]])
                chunks.append(enc.chunk[pack_rows])
                outputs.append(out)
        # Not waited for here: the writer thread waits for the device to pass `timer`'s
        # end, then encodes the rows.
        host = self._to_host(outputs)
        timer.stop()
        return self._writes.submit(self._write_part, shard, source, rows, chunks, host, timer), padded

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
        """One group of windows' rows into the shard, in input order (on the writer thread, once the
        device has produced them); (device seconds, host seconds) spent on them."""
        with record_function("pooljobs.wait_device"):
            device_s = timer.seconds()
        t = time.perf_counter()
        with record_function("pooljobs.write"):
            self._encode_part(shard, source.result().keys, rows, chunks, host)
        return device_s, time.perf_counter() - t

    def _encode_part(self, shard: ShardWriter, keys: tuple[str, pa.Array], rows: list[np.ndarray],
                     chunks: list[np.ndarray], host: dict[str, torch.Tensor | list[Ragged]]) -> None:
        """Per-pack rows and their outputs (home, on the host) -> a row group of the shard."""
        arrays = {k: ragged.flatten(v) if isinstance(v, list) else v.numpy() for k, v in host.items()}
        rows, chunks, outputs = self._assemble(rows, chunks, arrays)
        key_name, key_values = keys
        columns = {key_name: key_values.take(pa.array(rows, type=pa.int64()))}
        if self.options.overlong == "chunk" and self.options.chunk_aggregate == "none":
            columns["chunk"] = pa.array(chunks, type=pa.int32())
        out = output_columns(outputs, self.options.output_dtype, self.runtime.labels, self.runtime.ranges)
        part = pa.table({**columns, **out})
        shard.write(part.replace_schema_metadata(self._schema_metadata))

    def _assemble(self, rows: list[np.ndarray], chunks: list[np.ndarray], outputs: dict[str, Output]
                  ) -> tuple[np.ndarray, np.ndarray, dict[str, Output]]:
        """Per-pack (unit rows, chunk numbers) and the outputs in pack order -> all in input
        order (ragged outputs as (values, lengths)); with chunk_aggregate='mean', one row per
        text: the mean of its windows, renormalized when normalizing."""
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int32), outputs
        rows, chunks = np.concatenate(rows), np.concatenate(chunks)
        order = np.lexsort((chunks, rows))
        outputs = {k: ragged.take(*v, order) if isinstance(v, tuple) else v[order] for k, v in outputs.items()}
        rows, chunks = rows[order], chunks[order]
        if self.options.overlong != "chunk" or self.options.chunk_aggregate == "none":
            return rows, chunks, outputs
        unique, starts, counts = np.unique(rows, return_index=True, return_counts=True)
        mean = np.add.reduceat(outputs["embedding"], starts, axis=0) / counts[:, None]
        if self.runtime.normalize:
            mean /= np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
        return unique, np.zeros(len(unique), np.int32), {"embedding": mean}

    def _keys(self, unit: Unit, table: pa.Table) -> tuple[str, pa.Array]:
        """(name, values): the id column, or `file#row` keys, stable for the same input."""
        if self.options.id_column:
            return self.options.id_column, table.column(self.options.id_column).combine_chunks()
        return "row_key", pa.array(unit.row_keys(table.num_rows), type=pa.string())

    def _write_errors(self, unit: Unit, keys: tuple[str, pa.Array], bad: dict[int, str]) -> None:
        rows = sorted(bad)
        key_name, key_values = keys
        where = unit.locate(rows[-1] + 1)
        table = pa.table({
            key_name: key_values.take(pa.array(rows, type=pa.int64())),
            "file": pa.array([where[r][0] for r in rows]),
            "row": pa.array([where[r][1] for r in rows], type=pa.int64()),
            "reason": pa.array([bad[r] for r in rows]),
        })
        write_table(storage.join(self._out(), "_errors", f"{unit.name}.parquet"), table, self.options.storage_options)

    def _out(self) -> str:
        return self.options.output.rstrip("/")

    def close(self) -> None:
        self.tokenizer.close()
        self._writes.shutdown(wait=False, cancel_futures=True)
        self._feeds.shutdown(wait=False, cancel_futures=True)
