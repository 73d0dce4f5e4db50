"""Each model input computed once: rows whose input repeats are copied, not recomputed.

A row's *content hash* (`content_hashes`, XXH3-128 over its text, or its text and pair;
`HASH_ALGORITHM`, recorded in every shard's provenance) is taken where the row is read,
and every shard stores it (`HASH_COLUMN`), so any output can serve a later job as its
previous one. The options that change a model input or its output (prompt, max_length,
dtype, ...) are the same for every row of a job, so they are not hashed per row: they are
the shard's provenance, and reuse across jobs compares it (`refusal`).

While a unit is read (`UnitCopies.classify`, on the feed thread) each usable row is
- a copy of an earlier row of the unit with the same hash (its *owner*, the first one),
- a copy of a row of the job's previous output (`--reuse`: `PreviousOutput`, the shards
  the driver names for the unit), or of one this worker computed or read from a previous
  shard for an earlier unit (`OutputCache`, bounded in bytes, oldest first; a unit's rows
  enter it when the unit is written, so the next unit, read meanwhile, may miss them),
- or computed, and then the owner of later copies.
Only computed rows are tokenized and forwarded. On the writer thread
(`UnitCopies.merge`) each launch group's computed rows take in the copies due up to its
last row, in input order; an owner always precedes its copies, so its values are written
before they are needed. A copy's values are its source's output rows as they are (bytes
equal: Arrow `take`), several per row with one output row per window. A copy of an owner
the tokenizer rejected is quarantined with the owner's reason.

Which rows are copies never changes the output rows (the same keys, in the same order,
each row's own quarantine); a copied value is its source's computation, which differs
from the row's own at most by the batch-composition noise of a forward. Duplicates across
workers are not found (each worker's cache is its own); the driver holds no hash.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from workers import storage

HASH_COLUMN = "content_hash"
HASH_TYPE = pa.binary(16)
# XXH3-128, as datasets' fingerprints and datatrove's exact dedup use, rather than BLAKE2b:
# the feed thread hashes every row of a job while holding the GIL (hashlib releases it only
# above 2 KiB), so its cost per row is the job's. Shards record it; reuse refuses other algorithms.
HASH_ALGORITHM = "xxh3-128"
_SINGLE, _PAIR = 0, 1  # seeds: a text never hashes as a pair
# Provenance that does not change what an output means: numerics of the same computation
# (kernels, compile, the tokenizer backend, which must give identical ids) and paths.
NOT_OUTPUT = ("pooljobs_version", "model", "compiled", "gelu_epilogue", "execution", "head", "tokenizer",
              "tokenizer_bounded", "tokenizer_fallback")


def content_hashes(texts: list[str | None], pairs: list[str | None] | None,
                   reasons: list[str | None]) -> list[bytes | None]:
    """Each usable row's 16-byte content hash; None where `reasons` marks it unusable.
    A pair hashes its first text's length too, so ("ab", "c") and ("a", "bc") differ."""
    digest = xxhash.xxh3_128_digest
    if pairs is None:
        return [None if why else digest(t.encode("utf-8", "surrogatepass"), _SINGLE)
                for t, why in zip(texts, reasons)]
    out: list[bytes | None] = []
    for t, p, why in zip(texts, pairs, reasons):
        if why:
            out.append(None)
            continue
        first = t.encode("utf-8", "surrogatepass")
        out.append(digest(b"".join((len(first).to_bytes(8, "little"), first, p.encode("utf-8", "surrogatepass"))), _PAIR))
    return out


def output_identity(metadata: dict) -> dict:
    """What of a shard's provenance (`UnitRunner.metadata`) decides its values."""
    return {k: v for k, v in metadata.items() if k not in NOT_OUTPUT}


def refusal(previous: dict, current: dict) -> str | None:
    """Why outputs stamped with provenance `previous` cannot stand for `current`'s, or None."""
    old, new = output_identity(previous), output_identity(current)
    differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    if not differ:
        return None
    return "; ".join(f"{k}: {old.get(k)!r} there, {new.get(k)!r} here" for k in differ[:3])


class Block(NamedTuple):
    """Output rows of several input rows: input row i's are `table`'s rows
    [starts[i], stops[i]) (several when each window is a row). A source of copies is an
    int64 *code*: the block's id (`BLOCK_IDS`) in the high 32 bits, i in the low ones, so
    a part's sources are looked up and gathered as arrays, not one Python object per row."""

    table: pa.Table
    starts: np.ndarray
    stops: np.ndarray
    previous: bool = False  # read from a previous output (a copy of it is reused, not deduplicated)

    @classmethod
    def of_rows(cls, rows: np.ndarray, table: pa.Table, previous: bool = False) -> tuple[np.ndarray, Block]:
        """(the distinct unit rows, sorted; their block) for `table`, whose output rows belong
        to `rows` (sorted)."""
        unique, starts, counts = np.unique(rows, return_index=True, return_counts=True)
        return unique, cls(table, starts, starts + counts, previous)


BLOCK_IDS = itertools.count()  # a worker's blocks, numbered once each
_LOW = 32
_NONE = np.iinfo(np.int64).min  # a row that is no copy's source and no copy: unusable


def codes(block_id: int, n: int) -> np.ndarray:
    return (block_id << _LOW) | np.arange(n, dtype=np.int64)


class OutputCache:
    """Blocks of rows a worker computed (or read from a previous output), their rows' codes
    by content hash, for later units: at most `max_bytes` of tables, the oldest block
    evicted first. A unit takes the blocks it found (`UnitCopies`), so eviction never takes
    them from it. A hash added again points to the newer block; evicting the older one then
    forgets it (a miss: the row is computed again, never a wrong copy)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.codes: dict[bytes, int] = {}
        self.blocks: dict[int, Block] = {}
        self._held: deque[tuple[int, list[bytes], int]] = deque()  # (block id, its hashes, bytes), oldest first
        self._bytes = 0

    def add(self, block_id: int, block: Block, digests: list[bytes], nbytes: int) -> None:
        """`digests`: the hash of each of `block`'s input rows, in its order."""
        if self.max_bytes <= 0 or not digests:
            return
        self.codes.update(zip(digests, codes(block_id, len(digests)).tolist()))
        self.blocks[block_id] = block
        self._held.append((block_id, digests, nbytes))
        self._bytes += nbytes
        while self._bytes > self.max_bytes and self._held:
            old, keys, size = self._held.popleft()
            self._bytes -= size
            del self.blocks[old]
            deque(map(self.codes.pop, keys, itertools.repeat(None)), maxlen=0)


class PreviousOutput:
    """The rows of an earlier job's shards, by content hash, for `--reuse`."""

    def __init__(self, codes: dict[bytes, int], blocks: dict[int, tuple[Block, list[bytes]]],
                 refused: str | None) -> None:
        self.codes, self.blocks, self.refused = codes, blocks, refused

    @classmethod
    def load(cls, uris: tuple[str, ...], metadata: dict, storage_options: dict | None) -> PreviousOutput:
        """Read `uris` (shards of the previous output); none is used, and `refused` says
        why, when one was written with other output settings or without content hashes."""
        found: dict[bytes, int] = {}
        blocks: dict[int, tuple[Block, list[bytes]]] = {}
        for uri in uris:
            fs, path = storage.resolve(uri, storage_options)
            try:
                with fs.open_input_file(path) as f:
                    shard = pq.ParquetFile(f)
                    schema = shard.schema_arrow
                    stamp = json.loads((schema.metadata or {}).get(b"pooljobs", b"{}"))
                    why = refusal(stamp, metadata)
                    if HASH_COLUMN not in schema.names:
                        why = f"{uri} has no {HASH_COLUMN} column (written before pooljobs recorded it)"
                    if why:  # decided from the footer: a refused shard's rows are never read
                        return cls({}, {}, why)
                    table = shard.read()
            except (OSError, pa.ArrowException) as e:
                return cls({}, {}, f"cannot read {uri}: {e}")
            values = table.drop_columns([table.column_names[0], HASH_COLUMN]).replace_schema_metadata(None)
            values = one_chunk([values])  # copies are `take`n from it
            # An input row's output rows: one, or one per window (`chunk` 0, 1, ...).
            starts = np.flatnonzero(values.column("chunk").to_numpy() == 0) if "chunk" in values.column_names \
                else np.arange(len(values))
            block_id = next(BLOCK_IDS)
            block = Block(values, starts, np.append(starts[1:], len(values)), previous=True)
            digests = table.column(HASH_COLUMN).take(pa.array(starts)).to_pylist()
            shard_codes = dict(zip(reversed(digests), reversed(codes(block_id, len(starts)).tolist())))  # first wins
            shard_codes.pop(None, None)
            found = {**shard_codes, **found}  # an earlier shard wins
            blocks[block_id] = (block, digests)
        return cls(found, blocks, None)

    def add_to(self, cache: OutputCache) -> None:
        """Rows that moved to another unit are found there too."""
        for block_id, (block, digests) in self.blocks.items():
            cache.add(block_id, block, digests, block.table.nbytes)


class UnitCopies:
    """A unit's copy rows and their sources; decided on the feed thread (`classify`),
    merged into the shard on the writer thread (`merge`, then `tail`). Each row's source
    (`_sources`) is a code (>= 0) found outside the unit, `-(owner + 1)` for a unit row
    (itself when it is computed), or `_NONE` where unusable."""

    def __init__(self, enabled: bool, cache: OutputCache | None, previous: PreviousOutput | None) -> None:
        self.enabled = enabled
        self.cache, self.previous = cache, previous
        self.hashes: list[bytes | None] = []  # every unit row's, in order
        self.copies = 0  # rows copied (from a unit row, the cache or the previous output)
        self.reused = 0  # copies of the previous output's rows
        self.usable = 0
        self.orphans: dict[int, int] = {}  # copy row -> its owner, which the tokenizer rejected
        self._first: dict[bytes | None, int] = {None: _NONE}  # hash -> the source of the unit's rows with it
        self._parts: list[np.ndarray] = []  # each classified part's sources
        self._blocks: dict[int, Block] = {}  # blocks a code of the unit names
        self._sources: np.ndarray | None = None  # every row's, once the feed is done
        self._computed: list[tuple[np.ndarray, pa.Table]] = []  # launch groups' (rows, table) for the cache, at `tail`
        self._row_codes: np.ndarray | None = None  # computed rows' codes, once written
        self._owners: np.ndarray | None = None  # rows with copies in the unit
        self._due: np.ndarray | None = None  # copy rows, sorted; `_next` the first not written
        self._next = 0
        self._schema: pa.Schema | None = None
        self._column: pa.Array | None = None

    def classify(self, hashes: list[bytes | None]) -> list[bool]:
        """The next read part's rows' hashes (None: unusable) -> whether each is computed.
        Per row only C-level dict lookups (`map`): this runs on the feed thread, which
        reads and hashes every row of a job."""
        base, n = len(self.hashes), len(hashes)
        self.hashes.extend(hashes)
        rows = np.arange(base, base + n, dtype=np.int64)
        if not self.enabled:
            usable = np.fromiter((h is not None for h in hashes), bool, n)
            self.usable += int(usable.sum())
            self._parts.append(np.where(usable, -(rows + 1), _NONE))
            return usable.tolist()
        at = [i for i, source in enumerate(map(self._first.get, hashes)) if source is None][::-1]
        if at:  # hashes new to the unit, each at its first row in the part
            new = dict(zip([hashes[i] for i in at], at))
            outside = self._lookup(list(new))
            owners = -(base + np.fromiter(new.values(), np.int64, len(new)) + 1)
            self._first.update(zip(new, np.where(outside >= 0, outside, owners).tolist()))
        sources = np.fromiter(map(self._first.__getitem__, hashes), np.int64, n)
        usable = sources != _NONE
        self.usable += int(usable.sum())
        compute = sources == -(rows + 1)
        copy = usable & ~compute
        self.copies += int(copy.sum())
        blocks, counts = np.unique(sources[copy & (sources >= 0)] >> _LOW, return_counts=True)
        self.reused += sum(n for b, n in zip(blocks.tolist(), counts.tolist()) if self._blocks[b].previous)
        self._parts.append(sources)
        return compute.tolist()

    def _lookup(self, digests: list[bytes]) -> np.ndarray:
        """Each hash's code in the previous output, else in the cache, else -1; the blocks
        named are taken into the unit."""
        out = np.full(len(digests), -1, np.int64)
        for codes_of in (self.cache.codes if self.cache is not None else None,
                         self.previous.codes if self.previous is not None else None):  # the previous output wins
            if codes_of:
                found = np.fromiter(map(codes_of.get, digests, itertools.repeat(-1)), np.int64, len(digests))
                out = np.where(found >= 0, found, out)
        for block_id in np.unique(out[out >= 0] >> _LOW).tolist():
            held = self.previous.blocks.get(block_id) if self.previous is not None else None
            self._blocks[block_id] = held[0] if held is not None else self.cache.blocks[block_id]
        return out

    def hash_column(self) -> pa.Array:
        """Every unit row's content hash (null where unusable), built once."""
        if self._column is None:
            self._column = pa.array(self.hashes, HASH_TYPE)
        return self._column

    def merge(self, rows: np.ndarray, table: pa.Table, last: bool = False) -> tuple[np.ndarray, pa.Table]:
        """A launch group's computed output rows (`rows`: unit rows, sorted, one per output
        row; `table`: the columns after the key) with the copies due up to its last row
        (with `last`, every copy left), in input order. Records the group's rows for the
        owners' later copies (and for the worker's cache, which `tail` fills)."""
        if self._due is None:  # the first group: the feed is done, every copy known
            self._start(table.schema)
        unique, block = Block.of_rows(rows, table)
        block_id = next(BLOCK_IDS)
        self._row_codes[unique] = codes(block_id, len(unique))
        if self._owners[unique].any():
            self._blocks[block_id] = block
        if self.cache is not None and self.enabled and len(unique):
            self._computed.append((rows, table))
        stop = len(self._due) if last else int(np.searchsorted(self._due, rows[-1], "right")) if len(rows) else self._next
        due, self._next = self._due[self._next:stop], stop
        if not len(due):
            return rows, table
        sources = self._sources[due]
        owner = np.where(sources < 0, -sources - 1, 0)
        found = np.where(sources >= 0, sources, self._row_codes[owner])
        orphan = found < 0  # the owner was rejected by the tokenizer
        if orphan.any():
            self.orphans.update(zip(due[orphan].tolist(), owner[orphan].tolist()))
            due, found = due[~orphan], found[~orphan]
        tables, at = [table], [rows]
        blocks = found >> _LOW
        for block_id in np.unique(blocks).tolist():
            mine = blocks == block_id
            source = self._blocks[block_id]
            i = found[mine] & ((1 << _LOW) - 1)
            starts, counts = source.starts[i], source.stops[i] - source.starts[i]
            take = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
            tables.append(_like(source.table.take(pa.array(take)), table.schema))
            at.append(np.repeat(due[mine], counts))
        all_rows = np.concatenate(at)
        order = np.argsort(all_rows, kind="stable")  # a row is computed or copied, never both
        return all_rows[order], one_chunk(tables).take(pa.array(order))

    def _start(self, schema: pa.Schema) -> None:
        sources = self._sources = np.concatenate(self._parts) if self._parts else np.zeros(0, np.int64)
        rows = np.arange(len(sources), dtype=np.int64)
        copy = (sources != _NONE) & (sources != -(rows + 1))
        self._due = np.flatnonzero(copy)
        self._row_codes = np.full(len(sources), -1, np.int64)
        self._owners = np.zeros(len(sources), bool)
        self._owners[-sources[copy & (sources < 0)] - 1] = True
        self._schema = schema

    def tail(self) -> tuple[np.ndarray, pa.Table]:
        """The copies after the unit's last computed row (after every group's `merge`);
        then the unit's computed rows go to the worker's cache as one block, so a later
        group's copies take from one table per earlier unit, not one per launch group."""
        out = self.merge(np.zeros(0, np.int64), self._schema.empty_table(), last=True)
        if self._computed:
            rows, block = Block.of_rows(np.concatenate([rows for rows, _ in self._computed]),
                                        one_chunk([table for _, table in self._computed]))
            self.cache.add(next(BLOCK_IDS), block, [self.hashes[r] for r in rows.tolist()], block.table.nbytes)
            self._computed = []
        return out


def one_chunk(tables: list[pa.Table]) -> pa.Table:
    """`tables` (one schema) as one table of one chunk per column, joined column by column
    (`pa.concat_arrays`): `Table.combine_chunks`, and `take` across chunks, are many times
    slower on fixed_size_list columns of many chunks (bench/RESULTS.md)."""
    schema = tables[0].schema
    columns = [[chunk for t in tables for chunk in t.column(name).chunks] for name in schema.names]
    return pa.Table.from_arrays([pa.concat_arrays(c) if c else pa.array([], f.type) for c, f in zip(columns, schema)],
                                schema=schema)


def _like(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """A copied table with the computing part's columns and types (a shard read back may
    type a column differently, e.g. a dictionary-encoded label)."""
    table = table.select(schema.names)
    return table if table.schema.equals(schema) else table.cast(schema)
