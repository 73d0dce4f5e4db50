"""Fixtures for the distributed-job tests: a tiny random BERT, a Parquet corpus, the
single-process reference output, Ray instances, and helpers to watch and kill a run.

The model is random (hidden 32, 2 layers) but tokenizes with all-MiniLM-L6-v2's real
WordPiece files, so texts get realistic, varied lengths. The corpus is two files of 16
row groups each; `unit_rows=200` plans 16 units (8 per file).

Helpers are fixtures; the model builder is shared with the other jobs tests (fixtures_models).
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from jobs.driver import REPO_ROOT, run_job
from jobs.spec import JobSpec
from tests.jobs.fixtures_models import save_tiny_bert

FILES, ROWS_PER_FILE, ROW_GROUP, UNIT_ROWS = 2, 1600, 100, 200
WORDS = ("the a pooling job embeds every row exactly once across workers nodes and retries shards commit "
         "manifest resume driver actor killed restarted output parquet token budget window pack forward").split()
# Ray workers import the repository; they find it through this (the driver's own
# `init_ray` passes the same when it starts Ray itself).
RAY_ENV = {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}}


def _texts(n: int, seed: int) -> list[str]:
    """Sentences of 1..40 words, the same for the same seed."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(1, 40))) for _ in range(n)]


# -- model, corpus, reference -----------------------------------------------------------
@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A random 2-layer BERT (hidden 32) with the real MiniLM WordPiece tokenizer files."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def text_corpus(tmp_path_factory) -> Path:
    """A directory of 2 Parquet files x 1600 rows (`id` unique across files, `text`)."""
    path = tmp_path_factory.mktemp("corpus")
    for f in range(FILES):
        ids = pa.array(range(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE), pa.int64())
        pq.write_table(pa.table({"id": ids, "text": _texts(ROWS_PER_FILE, seed=f)}), path / f"corpus-{f}.parquet",
                       row_group_size=ROW_GROUP)
    return path


@pytest.fixture(scope="session")
def make_spec(tiny_bert, text_corpus) -> Callable[..., JobSpec]:
    """JobSpec over the tiny model and the corpus, on CPU; keywords override any field."""

    def make(output: Path, **changes) -> JobSpec:
        values = dict(input=str(text_corpus), output=str(output), model=str(tiny_bert), id_column="id", device="cpu",
                      unit_rows=UNIT_ROWS, progress=False)
        return JobSpec(**{**values, **changes})

    return make


@pytest.fixture(scope="session")
def reference(make_spec, tmp_path_factory) -> dict[str, pa.Table]:
    """The uninterrupted single-process run: shard name -> table (16 shards)."""
    out = tmp_path_factory.mktemp("reference")
    with one_torch_thread():
        outcome = run_job(make_spec(out, backend="local"))
    assert outcome.ok, outcome.failed
    shards = read_shards(out)
    assert len(shards) == FILES * ROWS_PER_FILE // UNIT_ROWS
    return shards


@contextlib.contextmanager
def one_torch_thread():
    """In-process (`backend="local"`) runs with one intra-op thread, as Ray gives each
    actor: on a small shared CI machine, thread contention makes them 10x slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def single_thread():
    with one_torch_thread():
        yield


def read_shards(out: Path) -> dict[str, pa.Table]:
    """Every shard file of an output directory, by unit name, schema metadata dropped."""
    return {p.stem: pq.read_table(p).replace_schema_metadata(None) for p in sorted(Path(out, "data").glob("part-*.parquet"))}


def embeddings(table: pa.Table) -> np.ndarray:
    column = table.column("embedding").combine_chunks()
    return column.flatten().to_numpy().reshape(len(column), -1)  # (N, D)


@pytest.fixture(scope="session")
def same_as_reference(reference) -> Callable[[Path], None]:
    """Asserts that a finished output equals the reference: `_SUCCESS`, one commit record
    per shard, the same shard names, ids in the same order per shard, embeddings within
    1e-6; and that a consumer reading the directory as a dataset sees every id once."""

    def check(out: Path, atol: float = 1e-6) -> None:
        out = Path(out)
        assert (out / "_SUCCESS").exists()
        assert sorted(p.stem for p in (out / "_manifest").glob("*.json")) == sorted(reference)
        shards = read_shards(out)
        assert sorted(shards) == sorted(reference)
        for name, want in reference.items():
            got = shards[name]
            assert got.schema == want.schema, name
            assert got.column("id").to_pylist() == want.column("id").to_pylist(), name
            np.testing.assert_allclose(embeddings(got), embeddings(want), rtol=0, atol=atol, err_msg=name)
        ids = ds.dataset(str(out), format="parquet").to_table(columns=["id"]).column("id").to_numpy()
        assert len(ids) == len(np.unique(ids)) == FILES * ROWS_PER_FILE, "duplicate or missing rows"
        assert ids.min() == 0 and ids.max() == FILES * ROWS_PER_FILE - 1

    return check


# -- Ray ----------------------------------------------------------------------------------
class RayInstances:
    """The test process's one Ray connection, switched only when a test asks for another
    kind: `local` (one node, 2 CPUs, 2 fake GPUs) or `cluster` (a `cluster_utils.Cluster`
    of a head and 2 worker nodes, 1 CPU each). Torn down with `ray.shutdown` and
    `Cluster.shutdown`, never a host-wide `ray stop`."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.cluster = None

    def get(self, kind: str):
        import ray

        if self.kind == kind and ray.is_initialized():
            return self.cluster
        self.close()
        if kind == "local":
            ray.init(address="local", num_cpus=2, num_gpus=2, _node_ip_address="127.0.0.1", include_dashboard=False,
                     runtime_env=RAY_ENV, log_to_driver=False)
        else:
            from ray.cluster_utils import Cluster

            self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
            for _ in range(2):
                self.cluster.add_node(num_cpus=1)
            self.cluster.wait_for_nodes()
            ray.init(address=self.cluster.address, runtime_env=RAY_ENV, log_to_driver=False)
        self.kind = kind
        return self.cluster

    def close(self) -> None:
        import ray

        ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
        self.kind, self.cluster = None, None


@pytest.fixture(scope="module")
def ray_instances():
    """Per module, so no other module finds this test process connected to Ray."""
    instances = RayInstances()
    try:
        yield instances
    finally:
        instances.close()


@pytest.fixture
def ray_local(ray_instances) -> None:
    """Ray on this machine with 2 fake GPUs: the driver starts 2 GPU actors (on CPU here)."""
    ray_instances.get("local")


@pytest.fixture
def ray_cluster(ray_instances):
    """A head and two worker nodes, 1 CPU each; the `Cluster`."""
    return ray_instances.get("cluster")


@pytest.fixture
def no_ray(ray_instances) -> None:
    """No Ray in this process (a test whose subprocesses start their own)."""
    ray_instances.close()


# -- watching and killing -----------------------------------------------------------------
def committed_count(out: Path) -> int:
    return len(list(Path(out, "_manifest").glob("*.json")))


def worker_actors(root: psutil.Process | None = None, running: bool = False) -> list[psutil.Process]:
    """`WorkerActor` processes below `root` (default: this test process, which started
    the Ray daemons). Ray titles an actor process `ray::WorkerActor`, and
    `ray::WorkerActor.run` while it runs a unit; `running` keeps only those."""
    found = []
    for proc in (root or psutil.Process()).children(recursive=True):
        try:
            cmdline = proc.cmdline()
        except psutil.Error:
            continue
        title = cmdline[0] if cmdline else ""
        if title.startswith("ray::WorkerActor.run" if running else "ray::WorkerActor"):
            found.append(proc)
    return found


class AfterCommits(threading.Thread):
    """Calls `action()` each time the output's commit count reaches the next of `counts`.

    `action` returns what it did (e.g. the pid it killed), or None to be asked again
    shortly (nothing to act on yet); `done` collects (commits then, result).
    """

    def __init__(self, out: Path, counts: Sequence[int], action: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self.out, self.counts, self.action = Path(out), list(counts), action
        self.done: list[tuple[int, object]] = []
        self.errors: list[BaseException] = []
        self._stopped = threading.Event()

    def run(self) -> None:
        try:
            for count in self.counts:
                while committed_count(self.out) < count:
                    if self._stopped.wait(0.01):
                        return
                while (result := self.action()) is None:
                    if self._stopped.wait(0.01):
                        return
                self.done.append((committed_count(self.out), result))
        except BaseException as e:  # noqa: BLE001 - surfaced by the test through `errors`
            self.errors.append(e)

    def stop(self) -> None:
        self._stopped.set()
        self.join(timeout=60)


@pytest.fixture
def after_commits():
    """Factory of started `AfterCommits` watchers, stopped when the test ends."""
    started: list[AfterCommits] = []

    def start(out: Path, counts: Sequence[int], action: Callable[[], object]) -> AfterCommits:
        watcher = AfterCommits(out, counts, action)
        watcher.start()
        started.append(watcher)
        return watcher

    yield start
    for watcher in started:
        watcher.stop()


@pytest.fixture(scope="session")
def find_worker_actors() -> Callable[..., list[psutil.Process]]:
    return worker_actors


@pytest.fixture(scope="session")
def count_commits() -> Callable[[Path], int]:
    return committed_count
