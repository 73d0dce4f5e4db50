"""`python -m jobs.verify OUT`: check an output directory against its input and manifest.

Checks that every unit the job planned is committed, each shard's sha256 matches its
commit record, schemas and provenance agree across shards and with `_job.json`, and every
input row is in the output exactly once or quarantined, in input order. With
`--reference N` it recomputes N sampled rows through the plain transformers path
(padded, float32) and reports the minimum cosine against the stored values.
Exit code 0 only when everything holds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from jobs.cli import storage_option
from jobs.manifest import DATA_DIR, ERRORS_DIR, Manifest
from jobs.plan import input_fingerprint, list_inputs, plan_units
from jobs.spec import JobSpec
from workers import storage
from workers.reader import Unit, read_unit

REFERENCE_MIN_COS = 0.999


@dataclass
class Verification:
    problems: list[str] = field(default_factory=list)
    rows: int = 0
    quarantined: int = 0
    duplicate_ids: int = 0  # rows repeating an id of the input (reported; every row is still kept once)
    min_cos: float | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def _read(uri: str, options: dict) -> bytes | None:
    return storage.read_bytes(*storage.resolve(uri, options))


def _input_keys(spec: JobSpec, unit: Unit) -> list:
    if spec.id_column:
        return read_unit(unit, [spec.id_column], spec.storage_options).column(spec.id_column).to_pylist()
    rows = unit.num_rows if unit.num_rows >= 0 else read_unit(unit, [spec.text_column], spec.storage_options).num_rows
    return unit.row_keys(rows)


def _align(part: list, whole: list) -> list[int] | None:
    """Positions in `whole` of `part`'s items matched in order; None when `part` is not
    a subsequence (duplicates included, so repeated ids map to the right rows)."""
    positions, j = [], 0
    for item in part:
        while j < len(whole) and whole[j] != item:
            j += 1
        if j == len(whole):
            return None
        positions.append(j)
        j += 1
    return positions


def verify(output: str, storage_options: dict | None = None, reference: int = 0, seed: int = 0) -> Verification:
    options = storage_options or {}
    result = Verification()
    manifest = Manifest(output, options)
    job = manifest.job()
    if job is None:
        result.problems.append(f"{output} has no _job.json: not a pooljobs output")
        return result
    spec = JobSpec(input=job["input"], output=output, storage_options=options, **job["options"])
    files = list_inputs(spec)
    if input_fingerprint(files) != job["input_sha256"]:
        result.problems.append("the input listing (names, sizes) changed since the job ran")
        return result
    units = plan_units(spec, files)
    if [u.name for u in units] != job["units"]:
        result.problems.append("the input plans into other units than the job's")
        return result
    records = manifest.committed()
    schemas, seen, shards, positions = set(), Counter(), {}, {}
    for unit in units:
        record = records.get(unit.name)
        if record is None:
            result.problems.append(f"{unit.name}: not committed")
            continue
        data = _read(storage.join(output.rstrip("/"), DATA_DIR, f"{unit.name}.parquet"), options)
        if data is None:
            result.problems.append(f"{unit.name}: committed but the shard is missing")
            continue
        if hashlib.sha256(data).hexdigest() != record["checksum"]:
            result.problems.append(f"{unit.name}: shard checksum differs from its commit record")
            continue
        table = pq.read_table(pa.BufferReader(data))
        if reference:  # only the reference check reads the values back
            shards[unit.name] = table
        schemas.add(table.schema.remove_metadata().to_string())
        provenance = json.loads(table.schema.metadata[b"pooljobs"])
        if provenance.get("model_sha256") != job["model_sha256"]:
            result.problems.append(f"{unit.name}: written by another model than _job.json names")
        key = table.column_names[0]
        keys = table.column(key).to_pylist()
        errors = _read(storage.join(output.rstrip("/"), ERRORS_DIR, f"{unit.name}.parquet"), options)
        bad = pq.read_table(pa.BufferReader(errors)).column(key).to_pylist() if errors else []
        expected = _input_keys(spec, unit)
        aligned = _align(keys, expected)
        if Counter(keys) + Counter(bad) != Counter(expected):
            result.problems.append(f"{unit.name}: output + quarantine rows differ from the input rows of {unit.uri}")
        elif aligned is None:
            result.problems.append(f"{unit.name}: rows are not in input order")
        else:
            positions[unit.name] = aligned
        seen.update(keys)
        result.rows += len(keys)
        result.quarantined += len(bad)
    if len(schemas) > 1:
        result.problems.append(f"shards have {len(schemas)} different schemas")
    duplicates = [k for k, n in seen.items() if n > 1]
    if duplicates and spec.id_column is None:  # row keys are unique by construction
        result.problems.append(f"{len(duplicates)} row keys appear more than once, e.g. {duplicates[0]}")
    result.duplicate_ids = sum(seen[k] - 1 for k in duplicates) if spec.id_column else 0
    if reference and positions:
        result.min_cos = _reference_check(spec, units, shards, positions, reference, seed)
        if result.min_cos < REFERENCE_MIN_COS:
            result.problems.append(f"recomputed rows disagree: min cosine {result.min_cos:.6f} < {REFERENCE_MIN_COS}")
    return result


def _reference_check(spec: JobSpec, units: list[Unit], shards: dict[str, pa.Table], positions: dict[str, list[int]],
                     n: int, seed: int) -> float:
    """Recompute `n` sampled rows with the padded float32 reference path; min cosine.
    `positions[unit][i]` is the unit's input row of shard row i."""
    from states.runtime import Runtime
    from workers.packing import PackPlan, build_pack
    from workers.tokenize import TokenizerSpec

    column = {"embed": "embedding", "classify": "probs", "score": "score"}[spec.task]
    if spec.task == "embed" and spec.output_dtype == "binary":
        raise ValueError("--reference cannot compare binary (sign-bit) embeddings by cosine")
    runtime = Runtime(spec.replace(execution="padded", dtype="float32", device="cpu").model_options)
    tokenize = TokenizerSpec.from_hf(runtime.tokenizer, runtime.max_length, runtime.prompt).build()
    rng = np.random.default_rng(seed)
    picks = [(name, i) for name in positions for i in range(len(positions[name]))]
    chosen: dict[str, list[int]] = {}
    for k in sorted(rng.choice(len(picks), size=min(n, len(picks)), replace=False)):
        chosen.setdefault(picks[k][0], []).append(picks[k][1])
    by_unit = {u.name: u for u in units}
    cosines = []
    for name, rows in chosen.items():  # each sampled unit's input is read once
        source = read_unit(by_unit[name], [c for c in (spec.text_column, spec.pair_column) if c], spec.storage_options)
        for i in rows:
            row = positions[name][i]
            text = source.column(spec.text_column)[row].as_py()
            pair = source.column(spec.pair_column)[row].as_py() if spec.pair_column else None
            enc = tokenize([text], None if pair is None else [pair])
            want = runtime.compute(build_pack(enc, PackPlan(np.array([0]))))
            got = np.asarray(shards[name].column(column)[i].as_py(), dtype=np.float64).reshape(-1)
            ref = want[column][0].numpy().astype(np.float64).reshape(-1)
            cosines.append(float(got @ ref / (np.linalg.norm(got) * np.linalg.norm(ref) or 1.0)))
    return min(cosines) if cosines else 1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jobs.verify", description=__doc__.splitlines()[0])
    parser.add_argument("output", help="the output directory or URI of a pooljobs job")
    parser.add_argument("--reference", type=int, default=0, metavar="N", help="recompute N sampled rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE", type=storage_option)
    args = parser.parse_args(argv)
    options = dict(args.storage_option)
    result = verify(args.output, options, args.reference, args.seed)
    print(f"jobs.verify: {result.rows:,} rows, {result.quarantined:,} quarantined, {result.duplicate_ids:,} repeated ids"
          + (f", reference min cosine {result.min_cos:.6f}" if result.min_cos is not None else ""))
    for problem in result.problems:
        print(f"jobs.verify: PROBLEM {problem}")
    print("jobs.verify: OK" if result.ok else f"jobs.verify: {len(result.problems)} problem(s)")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
