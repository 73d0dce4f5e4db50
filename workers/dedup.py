"""Each model input computed once: rows whose input repeats are copied, not recomputed.

A row's *content hash* (`content_hashes`, 16 bytes of BLAKE2b over its text, or its text
and pair) is taken where the row is read, and every shard stores it (`HASH_COLUMN`), so
any output can serve a later job as its previous one. The options that change a model
input or its output (prompt, max_length, dtype, ...) are the same for every row of a job,
so they are not hashed per row: they are the shard's provenance, and reuse across jobs
compares it (`refusal`).

While a unit is read (`UnitCopies.classify`, on the feed thread) each usable row is
- a copy of an earlier row of the unit with the same hash (its *owner*, the first one),
- a copy of a row of the job's previous output (`--reuse`: `PreviousOutput`, the shards
  the driver names for the unit), or of one this worker computed or read from a previous
  shard for an earlier unit (`OutputCache`, bounded in bytes, oldest first),
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

import hashlib
import json
from collections import deque
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from workers import storage

HASH_COLUMN = "content_hash"
HASH_TYPE = pa.binary(16)
_SINGLE, _PAIR = b"pooljobs.text", b"pooljobs.pair"  # BLAKE2b personalisation: a text never hashes as a pair
# Provenance that does not change what an output means: numerics of the same computation
# (kernels, compile, the tokenizer backend, which must give identical ids) and paths.
NOT_OUTPUT = ("pooljobs_version", "model", "compiled", "gelu_epilogue", "execution", "tokenizer",
              "tokenizer_bounded", "tokenizer_fallback")


def content_hashes(texts: list[str | None], pairs: list[str | None] | None,
                   reasons: list[str | None]) -> list[bytes | None]:
    """Each usable row's 16-byte content hash; None where `reasons` marks it unusable.
    A pair hashes its first text's length too, so ("ab", "c") and ("a", "bc") differ."""
    if pairs is None:
        return [None if why else hashlib.blake2b(t.encode("utf-8", "surrogatepass"), digest_size=16,
                                                 person=_SINGLE).digest()
                for t, why in zip(texts, reasons)]
    out: list[bytes | None] = []
    for t, p, why in zip(texts, pairs, reasons):
        if why:
            out.append(None)
            continue
        first = t.encode("utf-8", "surrogatepass")
        h = hashlib.blake2b(len(first).to_bytes(8, "little"), digest_size=16, person=_PAIR)
        h.update(first)
        h.update(p.encode("utf-8", "surrogatepass"))
        out.append(h.digest())
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


class Values(NamedTuple):
    """One input row's output rows: `table`'s rows [start, stop) (several when each window
    is a row). A tuple: one is made per row copied or cached, so it must be cheap."""

    table: pa.Table
    start: int
    stop: int
    previous: bool = False  # read from a previous output (a copy of it is reused, not deduplicated)


def row_values(rows: np.ndarray, table: pa.Table, previous: bool = False) -> dict[int, Values]:
    """Each unit row's `Values` in `table`, whose output rows belong to `rows` (sorted)."""
    unique, starts, counts = np.unique(rows, return_index=True, return_counts=True)
    return {row: Values(table, start, start + count, previous)
            for row, start, count in zip(unique.tolist(), starts.tolist(), counts.tolist())}


class OutputCache:
    """Values of rows a worker computed, by content hash, for later units: at most
    `max_bytes` of output tables, the oldest launch group's evicted first. A lookup hands
    out the values themselves, so eviction never takes them from a unit that found them."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._found: dict[bytes, Values] = {}
        self._blocks: deque[tuple[list[bytes], int]] = deque()  # (hashes, bytes) oldest first
        self._bytes = 0

    def get(self, digest: bytes) -> Values | None:
        return self._found.get(digest)

    def add(self, found: dict[bytes, Values], nbytes: int) -> None:
        """Values by hash, `nbytes` in all (a launch group's computed rows, a previous shard)."""
        if self.max_bytes <= 0 or not found:
            return
        for digest, values in found.items():
            self._found.setdefault(digest, values)
        self._blocks.append((list(found), nbytes))
        self._bytes += nbytes
        while self._bytes > self.max_bytes and self._blocks:
            old, size = self._blocks.popleft()
            self._bytes -= size
            for digest in old:
                self._found.pop(digest, None)


class PreviousOutput:
    """The rows of an earlier job's shards, by content hash, for `--reuse`."""

    def __init__(self, found: dict[bytes, Values], refused: str | None, nbytes: int = 0) -> None:
        self.found, self.refused, self.nbytes = found, refused, nbytes

    @classmethod
    def load(cls, uris: tuple[str, ...], metadata: dict, storage_options: dict | None) -> PreviousOutput:
        """Read `uris` (shards of the previous output); none is used, and `refused` says
        why, when one was written with other output settings or without content hashes."""
        found: dict[bytes, Values] = {}
        nbytes = 0
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
                        return cls({}, why)
                    table = shard.read()
            except (OSError, pa.ArrowException) as e:
                return cls({}, f"cannot read {uri}: {e}")
            digests = table.column(HASH_COLUMN).to_pylist()
            values = table.drop_columns([table.column_names[0], HASH_COLUMN]).replace_schema_metadata(None)
            values = values.combine_chunks()  # one chunk: copies are `take`n from it
            # An input row's output rows: one, or one per window (`chunk` 0, 1, ...).
            first = (values.column("chunk").to_numpy() == 0) if "chunk" in values.column_names \
                else np.ones(len(digests), bool)
            for values_of in row_values(np.cumsum(first), values, previous=True).values():
                found.setdefault(digests[values_of.start], values_of)
            nbytes += values.nbytes
        return cls(found, None, nbytes)


class UnitCopies:
    """A unit's copy rows and their sources; decided on the feed thread (`classify`),
    merged into the shard on the writer thread (`merge`, then `tail`)."""

    def __init__(self, enabled: bool, cache: OutputCache | None, previous: PreviousOutput | None) -> None:
        self.enabled = enabled
        self.cache, self.previous = cache, previous
        self.hashes: list[bytes | None] = []  # every unit row's, in order
        self.sources: dict[int, int | Values] = {}  # copy row -> owner row, or values found
        self.reused = 0  # copies of the previous output's rows
        self._first: dict[bytes, int | Values] = {}  # hash -> the source of its later copies
        self._owned: set[int] = set()  # owner rows with copies in the unit
        self._owners: dict[int, Values] = {}  # written owner rows' values
        self._due: np.ndarray | None = None  # copy rows, sorted; `_next` the first not written
        self._schema: pa.Schema | None = None
        self._column: pa.Array | None = None
        self._next = 0
        self.orphans: dict[int, int] = {}  # copy row -> its owner, which the tokenizer rejected

    def classify(self, hashes: list[bytes | None]) -> list[bool]:
        """The next read part's rows' hashes (None: unusable) -> whether each is computed."""
        base = len(self.hashes)
        self.hashes.extend(hashes)
        if not self.enabled:
            return [h is not None for h in hashes]
        compute = []
        for row, digest in enumerate(hashes, base):
            if digest is None:
                compute.append(False)
                continue
            source = self._first.get(digest)
            if source is None:
                source = self._known(digest)
                self._first[digest] = row if source is None else source
                if source is None:
                    compute.append(True)
                    continue
            elif isinstance(source, int):
                self._owned.add(source)
            self.sources[row] = source
            self.reused += isinstance(source, Values) and source.previous
            compute.append(False)
        return compute

    def _known(self, digest: bytes) -> Values | None:
        found = self.previous.found.get(digest) if self.previous is not None else None
        if found is None and self.cache is not None:
            found = self.cache.get(digest)
        return found

    @property
    def copies(self) -> int:
        return len(self.sources)

    @property
    def usable(self) -> int:
        return len(self.hashes) - self.hashes.count(None)

    def hash_column(self) -> pa.Array:
        """Every unit row's content hash (null where unusable), built once."""
        if self._column is None:
            self._column = pa.array(self.hashes, HASH_TYPE)
        return self._column

    def merge(self, rows: np.ndarray, table: pa.Table, last: bool = False) -> tuple[np.ndarray, pa.Table]:
        """A launch group's computed output rows (`rows`: unit rows, sorted, one per output
        row; `table`: the columns after the key) with the copies due up to its last row
        (with `last`, every copy left), in input order. Records the group's rows for the
        owners' later copies and in the worker's cache."""
        if self._due is None:  # the first group: the feed is done, every copy known
            self._due = np.fromiter(sorted(self.sources), np.int64, len(self.sources))
            self._schema = table.schema
        computed = row_values(rows, table)
        for owner in self._owned.intersection(computed) if self._owned else ():
            self._owners[owner] = computed[owner]
        if self.cache is not None and self.enabled:
            self.cache.add({self.hashes[r]: v for r, v in computed.items()}, table.nbytes)
        stop = len(self._due) if last else int(np.searchsorted(self._due, rows[-1], "right")) if len(rows) else self._next
        due, self._next = self._due[self._next:stop], stop
        if not len(due):
            return rows, table
        pieces: dict[int, tuple[pa.Table, list[int], list[int]]] = {}  # table id -> (table, its rows, unit rows)
        for row in due.tolist():
            source = self.sources[row]
            if isinstance(source, int):
                owner = self._owners.get(source)
                if owner is None:  # the owner was rejected by the tokenizer
                    self.orphans[row] = source
                    continue
                source = owner
            _, take, at = pieces.setdefault(id(source.table), (source.table, [], []))
            take.extend(range(source.start, source.stop))
            at.extend([row] * (source.stop - source.start))
        tables = [table] + [_like(t.take(pa.array(take, pa.int64())), table.schema) for t, take, _ in pieces.values()]
        all_rows = np.concatenate([rows] + [np.asarray(at, np.int64) for _, _, at in pieces.values()])
        order = np.argsort(all_rows, kind="stable")  # a row is computed or copied, never both
        return all_rows[order], pa.concat_tables(tables).take(pa.array(order))

    def tail(self) -> tuple[np.ndarray, pa.Table]:
        """The copies after the unit's last computed row (after every group's `merge`)."""
        return self.merge(np.zeros(0, np.int64), self._schema.empty_table(), last=True)


def _like(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """A copied table with the computing part's columns and types (a shard read back may
    type a column differently, e.g. a dictionary-encoded label)."""
    table = table.select(schema.names)
    return table if table.schema.equals(schema) else table.cast(schema)
