"""The output directory's bookkeeping: ownership, job identity, committed shards, success.

Layout under OUT (the shards alone in `data/`, so `pl.scan_parquet("OUT/data")`,
DuckDB's `read_parquet('OUT/data/*.parquet')` and pyarrow's `dataset("OUT")` read them
directly; every other file is `_`-prefixed):
  data/part-FFFFF-UUUUU.parquet  one shard per unit (written by workers, atomically)
  _errors/part-....parquet   quarantined rows of that unit, with reasons
  _manifest/part-....json    the commit record of a shard (rows, checksum, schema, timings)
  _job.json                  what produced this directory (options, model and input hashes);
                             pooljobs' marker: only a directory holding it is ever cleared
  _claim.json                the running job's claim (host, pid, token); gone when it ends
  _report.json, _SUCCESS     written when every unit is committed
  _plan.json.zlib            the units planned from the input listing it names (its key), so
                             a rerun over an unchanged listing reads no input footer

A shard counts only once its manifest record exists: a driver killed between a worker's
write and the commit (or with commit records still queued) redoes that unit on resume,
rewriting the same shard name. What is committed follows from one listing of
`_manifest/` (names only); records are read only for reports, streamed.

One writer at a time: `prepare` takes an exclusive claim before anything is written. On
local disks it is an atomic create (`O_EXCL`). Object stores reached through pyarrow
offer no conditional put, so the claim is check, put, wait `CLAIM_SETTLE_S`, read back:
of two jobs starting together the later put wins and the other sees a foreign token and
stops, as long as each puts within `CLAIM_SETTLE_S` of its check. A claim left by a
killed job is broken automatically when its process is gone from this host; otherwise
the message names the file to delete (`_claim.json`) once no job is running.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import socket
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait

import pyarrow as pa
import pyarrow.fs as pafs

from workers import storage

JOB_FILE, SUCCESS, REPORT, MANIFEST_DIR, ERRORS_DIR = "_job.json", "_SUCCESS", "_report.json", "_manifest", "_errors"
DATA_DIR = "data"  # the shards: OUT/data/<unit>.parquet; quarantined rows: OUT/_errors/<unit>.parquet
CLAIM = "_claim.json"
PLAN = "_plan.json.zlib"
CLAIM_SETTLE_S = 1.0  # object stores: how long a claim waits before reading itself back
COMMIT_THREADS = 8  # record puts in flight (object stores: latency-bound)
SHARD_NAME = re.compile(r"part-\d+-\d+\.parquet")
TEMP_NAME = re.compile(r"\..+\.[0-9a-f]{32}\.tmp")  # `workers.writer.AtomicFile`'s temp files


class OutputConflictError(ValueError):
    """The output directory holds something this job must not overwrite (or another job
    is writing it); the message says what to do."""


class Manifest:
    """One output directory's bookkeeping, through one filesystem client.

    `prepare` claims the directory; `commit` queues a record (stored by a small thread
    pool, so the dispatch loop never waits on storage); `flush` waits for every queued
    record and raises the first error; `finish` flushes, writes the report and releases
    the claim; `close` releases it whatever happened (call it in `finally`)."""

    def __init__(self, uri: str, storage_options: dict | None = None) -> None:
        self.uri, self.storage_options = uri, storage_options or {}
        self.fs, self.path = storage.resolve(uri, self.storage_options)
        self._token: str | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: set[Future] = set()
        self._errors: list[BaseException] = []

    # -- files ------------------------------------------------------------------------
    def _p(self, *parts: str) -> str:
        return storage.join(self.path, *parts)

    def _read_json(self, *parts: str) -> dict | None:
        data = storage.read_bytes(self.fs, self._p(*parts))
        return None if data is None else json.loads(data.decode())

    def _put(self, path: str, data: bytes) -> None:
        """Store `data` whole at `path` with this manifest's client: temp file + rename on
        local disks, one object put elsewhere."""
        try:
            if storage.is_local(self.fs):
                parent, name = path.rsplit("/", 1)
                tmp = f"{parent}/.{name}.{uuid.uuid4().hex}.tmp"
                try:
                    with self.fs.open_output_stream(tmp) as out:
                        out.write(data)
                    self.fs.move(tmp, path)
                except BaseException:
                    with contextlib.suppress(OSError):
                        self.fs.delete_file(tmp)
                    raise
            else:
                with self.fs.open_output_stream(path) as out:
                    out.write(data)
        except (OSError, pa.ArrowException) as e:
            raise OSError(f"cannot write {path}: {e}") from e

    def _put_json(self, value: dict, *parts: str) -> None:
        self._put(self._p(*parts), json.dumps(value, indent=1, sort_keys=True).encode())

    def _entries(self, *parts: str) -> list[pafs.FileInfo]:
        return storage.list_dir(self.fs, self._p(*parts))

    # -- ownership --------------------------------------------------------------------
    def prepare(self, identity: dict, overwrite: bool) -> None:
        """Claim the directory for a job with `identity`: resume when it already matches;
        replace a pooljobs output of other settings that committed nothing (it locks
        nothing) or, with `overwrite`, any pooljobs output (its own files only); never
        touch a directory pooljobs did not write. Leftover temp files are removed."""
        self.fs.create_dir(self.path, recursive=True)
        self._claim()
        try:
            existing = self.job()
            if existing is None:
                foreign = [e.base_name for e in self._entries()
                           if e.base_name != CLAIM and not TEMP_NAME.fullmatch(e.base_name)]
                if foreign:
                    raise OutputConflictError(
                        f"{self.uri} is not empty and was not written by pooljobs (no {JOB_FILE}; it holds "
                        f"{', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); choose an empty or new output "
                        "directory (--overwrite replaces only pooljobs output)")
            elif not overwrite and any(e.is_file and SHARD_NAME.fullmatch(e.base_name) for e in self._entries()):
                raise OutputConflictError(
                    f"{self.uri} holds shards in an earlier pooljobs layout (OUT/part-*.parquet); move them "
                    f"to OUT/{DATA_DIR}/ (mkdir OUT/{DATA_DIR} && mv OUT/part-*.parquet OUT/{DATA_DIR}/) to resume, "
                    "or pass --overwrite to replace them")
            elif existing != identity:
                if not overwrite and self.committed_names():
                    raise OutputConflictError(
                        f"{self.uri} holds output of a job with different settings "
                        f"(differs in: {', '.join(_differences(existing, identity))}); "
                        "rerun with the same options to resume, or pass --overwrite to replace it")
                self.clear()
            elif overwrite:
                self.clear()
            self._remove_temp_files()
            if storage.is_local(self.fs):  # object stores have no directories to create
                self.fs.create_dir(self._p(MANIFEST_DIR))
            if self.job() != identity:
                self._put_json(identity, JOB_FILE)
        except BaseException:
            self.close()
            raise

    def _claim(self) -> None:
        path = self._p(CLAIM)
        mine = {"host": socket.gethostname(), "pid": os.getpid(), "token": uuid.uuid4().hex,
                "since": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        data = json.dumps(mine, indent=1).encode()
        for _ in range(2):  # a second try after breaking a stale claim
            holder = self._read_json(CLAIM)
            if holder is not None:
                if not _stale(holder):
                    raise self._busy(holder)
                self.fs.delete_file(path)
            if storage.is_local(self.fs):
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    continue
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
            else:
                self._put(path, data)
                time.sleep(CLAIM_SETTLE_S)
                holder = self._read_json(CLAIM)
                if holder is None or holder.get("token") != mine["token"]:
                    raise self._busy(holder or {})
            self._token = mine["token"]
            return
        raise self._busy(self._read_json(CLAIM) or {})

    def _busy(self, holder: dict) -> OutputConflictError:
        who = f"host {holder.get('host')}, pid {holder.get('pid')}, since {holder.get('since')}"
        return OutputConflictError(
            f"{self.uri} is being written by another pooljobs job ({who}); wait for it to end. If no job is "
            f"running (it was killed on another machine), delete {storage.join(self.uri.rstrip('/'), CLAIM)} and rerun")

    def close(self) -> None:
        """Release the claim (when this manifest holds it) and stop the commit threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._token is not None:
            holder = self._read_json(CLAIM)
            if holder is not None and holder.get("token") == self._token:
                self.fs.delete_file(self._p(CLAIM))
            self._token = None

    def clear(self) -> None:
        """Remove pooljobs' own files (shards, records, markers, quarantine files, temp
        files) from a directory carrying its marker; leave anything else."""
        assert self.job() is not None, "only a directory pooljobs wrote is cleared"
        self._remove_temp_files()
        for sub, keep in ((MANIFEST_DIR, lambda n: n.endswith(".json")), (ERRORS_DIR, SHARD_NAME.fullmatch),
                          (DATA_DIR, SHARD_NAME.fullmatch)):
            for entry in self._entries(sub):
                if entry.is_file and keep(entry.base_name):
                    self.fs.delete_file(entry.path)
            if self.fs.get_file_info(self._p(sub)).type == pafs.FileType.Directory and not self._entries(sub):
                self.fs.delete_dir(self._p(sub))
        for entry in self._entries():
            if entry.is_file and (SHARD_NAME.fullmatch(entry.base_name) or entry.base_name in (SUCCESS, REPORT, JOB_FILE, PLAN)):
                self.fs.delete_file(entry.path)

    def _remove_temp_files(self) -> None:
        """Temp files of shards, records or quarantine files a killed job left behind."""
        for sub in ((), (DATA_DIR,), (ERRORS_DIR,), (MANIFEST_DIR,)):
            for entry in self._entries(*sub):
                if entry.is_file and TEMP_NAME.fullmatch(entry.base_name):
                    self.fs.delete_file(entry.path)

    # -- commits ----------------------------------------------------------------------
    def committed_names(self) -> set[str]:
        """Names of the committed units: one listing of `_manifest/`, no record read."""
        return {name[:-5] for name in storage.list_names(self.fs, self._p(MANIFEST_DIR))
                if name.endswith(".json") and not name.startswith(".")}

    def commit(self, record: dict) -> None:
        """Queue the commit record of a stored shard; it counts once stored (`flush`).
        A failed put is raised by the next `commit` or `flush`."""
        if self._errors:
            raise self._errors[0]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(COMMIT_THREADS, thread_name_prefix="commit")
        future = self._pool.submit(self._put_json, record, MANIFEST_DIR, f"{record['name']}.json")
        self._pending.add(future)
        future.add_done_callback(self._stored)

    def _stored(self, future: Future) -> None:
        self._pending.discard(future)
        if future.exception() is not None:
            self._errors.append(future.exception())

    def flush(self) -> None:
        """Wait until every queued record is stored; raises the first failure."""
        wait(list(self._pending))
        if self._errors:
            raise self._errors[0]

    def records(self) -> Iterator[tuple[pafs.FileInfo, dict]]:
        """(file, commit record) of every committed unit, in unit name order, read one at a time."""
        for entry in self._entries(MANIFEST_DIR):
            if entry.is_file and entry.base_name.endswith(".json") and not entry.base_name.startswith("."):
                with self.fs.open_input_stream(entry.path) as f:
                    yield entry, json.loads(f.read().decode())

    def iter_records(self) -> Iterator[dict]:
        """Every commit record, in unit name order, read one at a time (for reports)."""
        return (record for _, record in self.records())

    def committed(self) -> dict[str, dict]:
        """Commit records by unit name (all in memory: for checks, not for resuming)."""
        return {record["name"]: record for record in self.iter_records()}

    def finish(self, report: dict, success: bool) -> None:
        """Store the queued records, the report and (on success) the marker; release the claim."""
        try:
            self.flush()
            self._put_json(report, REPORT)
            if success:
                self._put(self._p(SUCCESS), b"")
        finally:
            self.close()

    def job(self) -> dict | None:
        return self._read_json(JOB_FILE)

    def saved_plan(self) -> bytes | None:
        """The saved plan's bytes (`jobs.plan` decodes them and checks their key), or None."""
        return storage.read_bytes(self.fs, self._p(PLAN))

    def save_plan(self, data: bytes) -> None:
        """Store the plan (one put); only the job holding the claim writes it."""
        assert self._token is not None, "save_plan after prepare: only the claiming job writes"
        self._put(self._p(PLAN), data)


def _stale(holder: dict) -> bool:
    """A claim whose process is gone from this host (a killed job)."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ, nested mappings included: `options.dim`, not `options`."""
    keys = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            keys.append(f"{prefix}{key}")
    return keys
