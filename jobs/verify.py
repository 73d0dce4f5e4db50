"""`python -m jobs.verify OUT`: check an output directory against its input and manifest.

Checks that every unit the job planned is committed, each shard's sha256 matches its
commit record, schemas and provenance agree across shards and with `_job.json` (model
hash, task, output dtype, dim), and every input row is in the output exactly once or
quarantined, in input order. With `--reference N --model PATH` it recomputes N sampled
rows with the real reference (`states.reference`: sentence-transformers, or plain
transformers, from PATH, float32 on the CPU) and reports the minimum cosine (float
outputs) or the share of equal stored values (quantized outputs).

Nothing in the output directory decides what runs: the model and the trust flags come
from this command line; the recorded ones are only compared (a different model is a
PROBLEM). Every disagreement is a PROBLEM line, never a traceback. Exit code 0 only when
everything holds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from jobs.cli import storage_option
from jobs.manifest import DATA_DIR, ERRORS_DIR, Manifest
from jobs.plan import input_fingerprint, list_inputs, plan_units
from jobs.spec import JobSpec
from jobs.tally import KeyTally
from workers import storage
from workers.reader import Unit, read_unit

REFERENCE_MIN_COS = 0.999
QUANTIZED_MIN_AGREEMENT = 0.95  # stored int8/binary values equal to the reference's, within one bucket
# Provenance fields that must agree with _job.json's options.
_RECORDED = {"task": "task", "output_dtype": "output_dtype", "dim": "dim"}
# Provenance fields that may differ between workers (hardware, not results).
_PER_WORKER = {"compiled", "gelu_epilogue", "execution", "head", "dtype", "model"}


@dataclass
class Verification:
    problems: list[str] = field(default_factory=list)
    rows: int = 0
    quarantined: int = 0
    duplicate_ids: int = 0  # rows repeating an id of the input (reported; every row is still kept once)
    min_cos: float | None = None
    agreement: float | None = None  # quantized outputs: share of stored values matching the reference

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


@dataclass(frozen=True)
class Reference:
    """`--reference`: how many rows, and the model to compute them with (the caller's)."""

    rows: int
    model: str
    trust_remote_code: bool = False
    allow_pickle: bool = False
    seed: int = 0


def _spec(job: dict, output: str, options: dict, result: Verification) -> JobSpec | None:
    try:
        return JobSpec(input=job["input"], output=output, storage_options=options, **job["options"])
    except (KeyError, TypeError, ValueError) as e:
        result.problems.append(f"_job.json does not describe a valid job: {e}")
        return None


def _check_provenance(name: str, provenance: dict, job: dict, first: dict, result: Verification) -> None:
    if provenance.get("model_sha256") != job["model_sha256"]:
        result.problems.append(f"{name}: written by another model than _job.json names")
    for field_name, option in _RECORDED.items():
        if field_name in provenance and provenance[field_name] != str(job["options"].get(option)):
            result.problems.append(f"{name}: {field_name}={provenance[field_name]} but _job.json says "
                                   f"{job['options'].get(option)}")
    differ = sorted(k for k in set(provenance) | set(first)
                    if k not in _PER_WORKER and provenance.get(k) != first.get(k))
    if differ:
        result.problems.append(f"{name}: provenance differs from the first shard's in {differ}")


def verify(output: str, storage_options: dict | None = None, reference: Reference | None = None) -> Verification:
    options = storage_options or {}
    result = Verification()
    manifest = Manifest(output, options)
    try:
        job = manifest.job()
    except (OSError, ValueError) as e:
        result.problems.append(f"cannot read _job.json: {e}")
        return result
    if job is None:
        result.problems.append(f"{output} has no _job.json: not a pooljobs output")
        return result
    spec = _spec(job, output, options, result)
    if spec is None:
        return result
    files = list_inputs(spec)
    if input_fingerprint(files) != job["input_sha256"]:
        result.problems.append("the input listing (names, sizes) changed since the job ran")
        return result
    units = plan_units(spec, files)
    if [u.name for u in units] != job["units"]:
        result.problems.append("the input plans into other units than the job's")
        return result
    with KeyTally() as tally:
        _check_units(spec, job, output, options, units, manifest, tally, reference, result)
        repeats, example = tally.result()
    if repeats and spec.id_column is None:  # row keys are unique by construction
        result.problems.append(f"{repeats} row keys repeat an earlier one, e.g. {example}")
    result.duplicate_ids = repeats if spec.id_column else 0
    return result


def _in_order(units: list[Unit], records: Iterator[dict]) -> Iterator[tuple[Unit, dict | None]]:
    """Each unit with its commit record (None when uncommitted), walking the records as
    they are listed: both are in unit name order, so no record is held beyond its unit."""
    pending = next(records, None)
    for unit in units:
        while pending is not None and pending["name"] < unit.name:
            pending = next(records, None)
        yield unit, pending if pending is not None and pending["name"] == unit.name else None


def _check_units(spec: JobSpec, job: dict, output: str, options: dict, units: list[Unit], manifest: Manifest,
                 tally: KeyTally, reference: Reference | None, result: Verification) -> None:
    """Check every unit's shard against its record and input, one unit in memory at a time
    (keys go to `tally`), then the reference check on rows sampled beforehand (only
    those rows' values are kept)."""
    schemas: set[str] = set()
    wanted = _sample(units, manifest, reference) if reference else {}
    samples: dict[str, list[tuple[int, np.ndarray]]] = {}  # unit -> (input row, stored value)
    first: dict | None = None
    for unit, record in _in_order(units, manifest.iter_records()):
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
        schemas.add(table.schema.remove_metadata().to_string())
        try:
            provenance = json.loads((table.schema.metadata or {})[b"pooljobs"])
        except (KeyError, ValueError):
            result.problems.append(f"{unit.name}: the shard carries no pooljobs provenance")
            continue
        first = provenance if first is None else first
        _check_provenance(unit.name, provenance, job, first, result)
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
        elif unit.name in wanted:
            outputs = value_columns(spec.task, provenance)
            samples[unit.name] = [(aligned[i], {column: _stored(table, column, i) for column in outputs})
                                  for i in wanted[unit.name] if i < len(keys)]
        try:
            tally.add(table.column(key))
        except TypeError as e:  # the shard schemas differ too: reported below
            result.problems.append(f"{unit.name}: {key} {e}")
        result.rows += len(keys)
        result.quarantined += len(bad)
    if len(schemas) > 1:
        result.problems.append(f"shards have {len(schemas)} different schemas")
    if reference and samples and first is not None:
        _reference_check(spec, job, first, units, samples, reference, result)


def _sample(units: list[Unit], manifest: Manifest, reference: Reference) -> dict[str, list[int]]:
    """Shard rows to recompute, unit -> row indices: `reference.rows` drawn (seeded) from
    every committed shard row, counted from the records' row counts."""
    names = {u.name for u in units}
    sizes = [(r["name"], r["rows"]) for r in manifest.iter_records() if r["name"] in names]
    ends = np.cumsum([rows for _, rows in sizes])
    total = int(ends[-1]) if len(ends) else 0
    rng = np.random.default_rng(reference.seed)
    wanted: dict[str, list[int]] = {}
    for k in sorted(rng.choice(total, size=min(reference.rows, total), replace=False)):
        at = int(np.searchsorted(ends, k, side="right"))
        wanted.setdefault(sizes[at][0], []).append(int(k - (ends[at] - sizes[at][1])))
    return wanted


def _reference_check(spec: JobSpec, job: dict, provenance: dict, units: list[Unit],
                     samples: dict[str, list[tuple[int, np.ndarray]]], reference: Reference,
                     result: Verification) -> None:
    """Recompute the sampled rows with `states.reference` from the caller's model; every
    disagreement (another model, other dimensions, values) is a problem on `result`.
    `samples[unit]` holds (the unit's input row, its stored value of each output) of each sampled row."""
    from states.errors import ModelLoadError
    from states.files import check_model_dir, fingerprint
    from states.reference import ReferenceModel, compute

    try:
        model_dir = check_model_dir(reference.model, reference.allow_pickle)
    except ModelLoadError as e:
        result.problems.append(f"--model: {e}")
        return
    if fingerprint(model_dir, cached=False) != job["model_sha256"]:  # a check reads every byte
        result.problems.append(f"--model {reference.model} is not the model the job ran (its files' sha256 differs)")
        return
    by_unit = {u.name: u for u in units}
    texts, pairs = [], []
    outputs = value_columns(spec.task, provenance)
    stored: dict[str, list] = {column: [] for column in outputs}
    for name, rows in samples.items():  # each sampled unit's input is read once
        source = read_unit(by_unit[name], [c for c in (spec.text_column, spec.pair_column) if c], spec.storage_options)
        for row, values in rows:
            texts.append(source.column(spec.text_column)[row].as_py())
            pairs.append(source.column(spec.pair_column)[row].as_py() if spec.pair_column else None)
            for column in outputs:
                stored[column].append(values[column])
    ref = ReferenceModel(model_dir, spec.task, provenance, reference.trust_remote_code)
    try:
        want = compute(ref, texts, pairs if spec.pair_column else None)
    except Exception as e:  # noqa: BLE001 - a reference that cannot run is reported, not raised
        result.problems.append(f"the reference cannot recompute the rows: {type(e).__name__}: {e}")
        return
    for column in outputs:
        if column == "sparse":  # stored (indices, values) against the reference's dense weights
            got = np.zeros_like(want[column])
            for r, (indices, values) in enumerate(stored[column]):
                got[r, indices] = values
            _compare(got, want[column], "float32", provenance, result)
        elif column == "multivector":  # every kept token's vector, rows with the reference's token counts
            shapes = [g.shape for g in stored[column]], [w.shape for w in want[column]]
            if shapes[0] != shapes[1]:
                result.problems.append("stored multivector rows keep other tokens than the reference's")
                continue
            _compare(np.concatenate(stored[column]), np.concatenate(want[column]), "float32", provenance, result)
        else:
            got = np.stack(stored[column])
            _compare(got, want[column].reshape(len(got), -1), spec.output_dtype if spec.task == "embed" else "float32",
                     provenance, result)


# The reference's output name of each output kind a job may write.
_OUTPUT_NAMES = {"dense": "embedding", "sparse": "sparse", "multivector": "multivector"}


def value_columns(task: str, provenance: dict) -> list[str]:
    """The outputs whose stored values `--reference` compares: by task, and for embed jobs
    the output kinds the shard's provenance names."""
    if task != "embed":
        return ["probs"] if task == "classify" else ["score"]
    return [_OUTPUT_NAMES[kind] for kind in provenance.get("outputs", "dense").split(",")]


def _stored(shard: pa.Table, column: str, i: int):
    """Row i's stored value of an output: a flat vector, (indices, values) for sparse, (tokens, d) for multivector."""
    if column == "sparse":
        return (np.asarray(shard.column("sparse_indices")[i].as_py(), np.int64),
                np.asarray(shard.column("sparse_values")[i].as_py(), np.float32))
    if column == "multivector":
        return np.asarray(shard.column(column)[i].as_py(), np.float32)
    return np.asarray(shard.column(column)[i].as_py()).reshape(-1)


def _compare(got: np.ndarray, want: np.ndarray, output_dtype: str, provenance: dict, result: Verification) -> None:
    from states.quantization import quantize

    if output_dtype in ("float32", "float16"):
        if got.shape != want.shape:
            result.problems.append(f"stored values have shape {got.shape[1:]}, the reference {want.shape[1:]}")
            return
        got, want = got.astype(np.float64), want.astype(np.float64)
        a, b = np.linalg.norm(got, axis=1), np.linalg.norm(want, axis=1)
        cos = (got * want).sum(1) / np.where(a * b == 0, 1.0, a * b)
        cos[(a == 0) & (b == 0)] = 1.0  # both empty (a sparse row with no weight left) agree
        min_cos = float(np.min(cos))
        result.min_cos = min_cos if result.min_cos is None else min(result.min_cos, min_cos)  # over every output
        if result.min_cos < REFERENCE_MIN_COS:
            result.problems.append(f"recomputed rows disagree: min cosine {result.min_cos:.6f} < {REFERENCE_MIN_COS}")
        return
    ranges = provenance.get("calibration_ranges")
    ranges = None if ranges is None else np.asarray(json.loads(ranges), np.float32)
    if output_dtype in ("int8", "uint8") and (ranges is None or ranges.shape != (2, want.shape[1])):
        result.problems.append(f"{output_dtype} output without calibration ranges of the reference's "
                               f"{want.shape[1]} dimensions in its provenance")
        return
    expected = quantize(want.astype(np.float32), output_dtype, ranges)
    if got.shape != expected.shape:
        result.problems.append(f"stored values have shape {got.shape[1:]}, the reference {expected.shape[1:]}")
        return
    if output_dtype.endswith("binary"):
        offset = 128 if output_dtype == "binary" else 0
        equal = np.unpackbits((got.astype(int) + offset).astype(np.uint8), axis=1) == np.unpackbits(
            (expected.astype(int) + offset).astype(np.uint8), axis=1)
    else:
        equal = np.abs(got.astype(int) - expected.astype(int)) <= 1
    result.agreement = float(equal.mean())
    if result.agreement < QUANTIZED_MIN_AGREEMENT:
        result.problems.append(f"recomputed rows disagree: {result.agreement:.1%} of stored {output_dtype} values "
                               f"match the reference's (< {QUANTIZED_MIN_AGREEMENT:.0%})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jobs.verify", description=__doc__.splitlines()[0])
    parser.add_argument("output", help="the output directory or URI of a pooljobs job")
    parser.add_argument("--reference", type=int, default=0, metavar="N",
                        help="recompute N sampled rows with sentence-transformers / transformers from --model")
    parser.add_argument("--model", help="the model directory (or cached hub id) to recompute with; "
                        "never taken from the output")
    parser.add_argument("--trust-remote-code", action="store_true", help="let the model's own code run (--reference)")
    parser.add_argument("--allow-pickle", action="store_true", help="allow pickle weights (--reference)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE", type=storage_option)
    args = parser.parse_args(argv)
    if args.reference and not args.model:
        parser.error("--reference needs --model: the model to recompute with is never read from the output")
    options = dict(args.storage_option)
    reference = Reference(args.reference, args.model, args.trust_remote_code, args.allow_pickle, args.seed) \
        if args.reference else None
    result = verify(args.output, options, reference)
    print(f"jobs.verify: {result.rows:,} rows, {result.quarantined:,} quarantined, {result.duplicate_ids:,} repeated ids"
          + (f", reference min cosine {result.min_cos:.6f}" if result.min_cos is not None else "")
          + (f", reference agreement {result.agreement:.2%}" if result.agreement is not None else ""))
    for problem in result.problems:
        print(f"jobs.verify: PROBLEM {problem}")
    print("jobs.verify: OK" if result.ok else f"jobs.verify: {len(result.problems)} problem(s)")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
