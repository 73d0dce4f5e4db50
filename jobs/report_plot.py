"""A picture of a finished (or partial) job: `plot_report(output_dir, png_path)`.

Left: tokens committed per worker over time, whose slope is the worker's throughput.
Commit records carry durations, not timestamps, so a unit's commit time is its manifest
record's modification time (local disks and object stores both keep one); where none is
known, the worker's units are laid end to end by their wall seconds, in name order.
Right: the corpus length distribution, as mean tokens per row of each unit (records keep
per-unit totals only), weighted by the unit's rows.

Needs matplotlib (the `plot` extra). Uses `matplotlib.figure.Figure` directly, so it
neither picks nor changes pyplot's backend; the returned figure displays in a notebook.
"""

from __future__ import annotations

from collections import defaultdict

import pyarrow.fs as pafs

from jobs.manifest import MANIFEST_DIR, Manifest
from workers import storage


def commit_records(output_dir: str, storage_options: dict | None = None) -> list[tuple[float | None, dict]]:
    """(modification time in seconds or None, record) of every committed unit, by name."""
    manifest = Manifest(output_dir, storage_options)
    if manifest.fs.get_file_info(storage.join(manifest.path, MANIFEST_DIR)).type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"{output_dir} has no {MANIFEST_DIR}/: no unit of a pooljobs job has committed there")
    return [(entry.mtime.timestamp() if entry.mtime else None, record) for entry, record in manifest.records()]


def timelines(records: list[tuple[float | None, dict]]) -> dict[str, tuple[list[float], list[int]]]:
    """worker -> (seconds since the job's first unit started, cumulative tokens), in commit order."""
    use_mtime = all(t is not None for t, _ in records)
    # Time 0 is when the first committed unit started: its commit time less its wall seconds.
    start = min((t - r["wall_seconds"] for t, r in records), default=0.0) if use_mtime else 0.0
    per_worker: dict[str, list[tuple[float, int]]] = defaultdict(list)
    clock: dict[str, float] = defaultdict(float)  # end to end, when no mtime
    for t, record in sorted(records, key=lambda tr: tr[0]) if use_mtime else records:
        worker = record["worker"]
        if use_mtime:
            at = t - start
        else:
            clock[worker] += record["wall_seconds"]
            at = clock[worker]
        per_worker[worker].append((at, record["tokens"]))
    lines = {}
    for worker, points in per_worker.items():
        xs, ys, total = [0.0], [0], 0
        for at, tokens in points:
            total += tokens
            xs.append(at), ys.append(total)
        lines[worker] = (xs, ys)
    return lines


def plot_report(output_dir: str, png_path: str | None = None, storage_options: dict | None = None):
    """Draw the job under `output_dir`; save it to `png_path` when given. Returns the Figure."""
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("plot_report needs matplotlib: pip install -e '.[plot]'") from e

    records = commit_records(output_dir, storage_options)
    fig = Figure(figsize=(10, 4), layout="constrained")
    left, right = fig.subplots(1, 2)
    for worker, (xs, ys) in sorted(timelines(records).items()):
        left.step(xs, ys, where="post", label=worker)
    left.set(title="tokens committed per worker", xlabel="seconds", ylabel="tokens")
    if records:
        left.legend(fontsize="small")
    rows = [r for _, r in records if r["rows"]]
    right.hist([r["tokens"] / r["rows"] for r in rows], bins=min(30, max(1, len(rows))),
               weights=[r["rows"] for r in rows])
    right.set(title="corpus length (mean tokens per row, per unit)", xlabel="tokens per row", ylabel="rows")
    if png_path is not None:
        fig.savefig(png_path, dpi=100)
    return fig
