"""The output directory's bookkeeping: job identity, committed shards, success marker.

Layout under OUT:
  part-FFFFF-UUUUU.parquet   one shard per unit (written by workers, atomically)
  _errors/part-....parquet   quarantined rows of that unit, with reasons
  _manifest/part-....json    the commit record of a shard (rows, checksum, schema, timings)
  _job.json                  what produced this directory (options, model and input hashes)
  _report.json, _SUCCESS     written when every unit is committed

A shard counts only once its manifest record exists: a driver killed between a worker's
write and the commit redoes that unit on resume, rewriting the same shard name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow.fs as pafs

from workers import storage
from workers.writer import put_atomic

JOB_FILE, SUCCESS, REPORT, MANIFEST_DIR, ERRORS_DIR = "_job.json", "_SUCCESS", "_report.json", "_manifest", "_errors"


class OutputConflictError(ValueError):
    """The output directory holds something this job must not overwrite without --overwrite."""


@dataclass
class Manifest:
    uri: str
    storage_options: dict

    def __post_init__(self) -> None:
        self.fs, self.path = storage.resolve(self.uri, self.storage_options)

    def _uri(self, *parts: str) -> str:
        return storage.join(self.uri.rstrip("/"), *parts)

    def _read_json(self, *parts: str) -> dict | None:
        data = storage.read_bytes(self.fs, storage.join(self.path, *parts))
        return None if data is None else json.loads(data.decode())

    def _put_json(self, value: dict, *parts: str) -> None:
        put_atomic(self._uri(*parts), json.dumps(value, indent=1, sort_keys=True).encode(), self.storage_options)

    def _entries(self) -> list[pafs.FileInfo]:
        return storage.list_dir(self.fs, self.path)

    def prepare(self, identity: dict, overwrite: bool) -> None:
        """Claim the directory for a job with `identity`; resume when it already matches."""
        existing = self._read_json(JOB_FILE)
        if overwrite:
            self.clear()
        elif existing == identity:
            return
        elif existing is None and self._entries():
            raise OutputConflictError(
                f"{self.uri} is not empty and was not written by pooljobs; choose another output or pass --overwrite"
            )
        elif existing is not None:
            raise OutputConflictError(
                f"{self.uri} holds output of a job with different settings "
                f"(differs in: {', '.join(_differences(existing, identity))}); "
                "rerun with the same options to resume, or pass --overwrite to replace it"
            )
        self._put_json(identity, JOB_FILE)

    def clear(self) -> None:
        """Remove pooljobs' own files (shards, records, markers); leave anything else."""
        for entry in self._entries():
            name = entry.base_name
            if entry.is_file and (name.startswith("part-") or name in (JOB_FILE, SUCCESS, REPORT)):
                self.fs.delete_file(entry.path)
            elif entry.type == pafs.FileType.Directory and name in (MANIFEST_DIR, ERRORS_DIR):
                self.fs.delete_dir(entry.path)

    def records(self) -> list[tuple[pafs.FileInfo, dict]]:
        """(file, commit record) of every committed unit, in file name order."""
        records = []
        for entry in storage.list_dir(self.fs, storage.join(self.path, MANIFEST_DIR)):
            if entry.is_file and entry.base_name.endswith(".json"):
                with self.fs.open_input_stream(entry.path) as f:
                    records.append((entry, json.loads(f.read().decode())))
        return records

    def committed(self) -> dict[str, dict]:
        """Commit records by unit name."""
        return {record["name"]: record for _, record in self.records()}

    def commit(self, record: dict) -> None:
        self._put_json(record, MANIFEST_DIR, f"{record['name']}.json")

    def finish(self, report: dict, success: bool) -> None:
        self._put_json(report, REPORT)
        if success:
            put_atomic(self._uri(SUCCESS), b"", self.storage_options)

    def job(self) -> dict | None:
        return self._read_json(JOB_FILE)


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
