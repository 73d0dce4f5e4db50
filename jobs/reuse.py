"""`--reuse PREVIOUS`: which shards of a previous output each unit may copy rows from.

The driver reads only the previous output's job record, its list of committed units and
its saved plan; it holds no content hash. Each unit is handed the previous shards that
read the same rows of its input files (by URI and row position), so a corpus that changed
a little, or grew, finds its unchanged rows in the shard that holds them; when no file is shared (the input
moved, or a notebook staged its table under a new name) units are matched by unit name,
which follows the position in the input listing. The workers compare each shard's
content hashes and resolved provenance (`workers.dedup`), so a wrong match costs reads,
never a wrong value.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from jobs.manifest import Manifest
from jobs.plan import decode_plan
from jobs.spec import OUTPUT_OPTIONS, JobSpec
from workers import storage
from workers.reader import Unit

log = logging.getLogger("pooljobs")


@dataclass(frozen=True)
class Reuse:
    """What `--reuse` found: `refused` says why nothing is reused, else `matched_by`."""

    source: str
    refused: str | None = None
    matched_by: str | None = None  # "input file" | "unit name"

    def describe(self) -> str:
        if self.refused:
            return f"reuse: nothing reused from {self.source}: {self.refused}"
        return f"reuse: rows of {self.source} whose content hash matches are copied (shards matched by {self.matched_by})"

    def to_json(self) -> dict:
        return {"from": self.source, "refused": self.refused, "matched_by": self.matched_by}


def with_reuse(spec: JobSpec, units: list[Unit], model_sha256: str) -> tuple[list[Unit], Reuse]:
    """`units` with `Unit.reuse` naming the previous shards each may copy from."""
    source = spec.reuse
    previous = Manifest(source, spec.storage_options)
    job = previous.job()
    if job is None:
        return units, Reuse(source, "not a pooljobs output (no _job.json)")
    why = refusal(job, spec, model_sha256)
    if why:
        return units, Reuse(source, why)
    committed = previous.committed_names()
    if not committed:
        return units, Reuse(source, "it has no committed unit")
    data = previous.saved_plan()
    planned = (decode_plan(data, None) if data is not None else None) or []
    by_file: dict[str, list[tuple[int, int, str]]] = {}  # file -> (first row, end row, previous unit)
    for unit in planned:
        if unit.name in committed:
            for piece in unit.files():
                by_file.setdefault(piece.uri, []).append((*_span(piece), unit.name))

    def shards(names: list[str]) -> tuple[str, ...]:
        return tuple(storage.join(source, "data", f"{name}.parquet") for name in dict.fromkeys(names))

    def overlapping(unit: Unit) -> list[str]:
        """Previous units that read rows of the file positions `unit` reads: in a file that
        changed in place or grew, each unit reads only the shard(s) of its own rows."""
        found = []
        for piece in unit.files():
            start, end = _span(piece)
            found += [name for first, stop, name in by_file.get(piece.uri, []) if first < end and start < stop]
        return found

    if any(piece.uri in by_file for unit in units for piece in unit.files()):
        return [replace(u, reuse=shards(overlapping(u))) for u in units], Reuse(source, matched_by="input file")
    return [replace(u, reuse=shards([u.name] if u.name in committed else [])) for u in units], \
        Reuse(source, matched_by="unit name")


def _span(piece: Unit) -> tuple[int, int]:
    """The rows [first, end) of its file a single-file unit reads (a whole JSONL/CSV file: all)."""
    return piece.row_offset, piece.row_offset + piece.num_rows if piece.num_rows >= 0 else 1 << 62


def refusal(job: dict, spec: JobSpec, model_sha256: str) -> str | None:
    """Why an output whose job record is `job` cannot stand for `spec`'s rows, or None."""
    if job.get("model_sha256") != model_sha256:
        return "it was written by another model (model sha256 differs)"
    options = job.get("options", {})
    for name in OUTPUT_OPTIONS:
        if options.get(name) != getattr(spec, name):
            return f"it was written with {name}={options.get(name)!r}, this job has {name}={getattr(spec, name)!r}"
    return None
