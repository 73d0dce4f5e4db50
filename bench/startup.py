"""The fixed cost of a cold `python -m jobs.embed`, phase by phase (CPU or GPU).

    python -m bench.startup --tokenizer DIR [--shape bert-base] [--docs 1000] [--device cuda] [--runs 3]
                            [--model DIR] [--profile-load] [--importtime] [--notebook]

Builds a random-init `--shape` model (bench's shapes, saved by the installed transformers
with the WordPiece files of `--tokenizer`) and a corpus of `--docs` texts in a temp folder
(or takes `--model`), then runs `python -m jobs.embed` `--runs` times, each a fresh
process with a fresh output, timed from outside. The first run finds empty pooljobs caches
(a fresh `POOLJOBS_CACHE`); the later ones find what the earlier left (the warm-cache
case). Per run it prints the process wall, the steady run (`run_seconds`), the fixed
cost (wall less the steady run) and the report's `startup` phases (`jobs.driver.PHASES`;
phases that run side by side overlap, so they do not add up to the fixed cost).

`--notebook`: three `jobs.embed` calls on the corpus in one fresh session (`backend="local"`),
each timed: the first pays the load, the later ones what a warm call pays. `--profile-load`: a cProfile of `Runtime(...)` (the worker's model load) in a fresh
process, its top functions by cumulative time. `--importtime`: the heaviest top-level
imports of a fresh process that imports what a job imports (`python -X importtime`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROFILE_LOAD = """
import cProfile, pstats, sys, time
from states.options import ModelOptions
t = time.perf_counter()
import states.runtime
imported = time.perf_counter() - t
options = ModelOptions(model=sys.argv[1], device=sys.argv[2], pooling="mean", normalize=True, compile=sys.argv[3])
profile = cProfile.Profile()
t = time.perf_counter()
profile.enable()
states.runtime.Runtime(options)
profile.disable()
print(f"import states.runtime {imported:.2f}s; Runtime(...) {time.perf_counter() - t:.2f}s")
pstats.Stats(profile).sort_stats("cumulative").print_stats(int(sys.argv[4]))
"""

NOTEBOOK = """
import json, sys, time
import pyarrow.parquet as pq
corpus, model, device = sys.argv[1:4]
table = pq.read_table(corpus)
import jobs
times = []
for _ in range(3):
    t = time.perf_counter()
    jobs.embed(table, model=model, text_column="text", device=device, pooling="mean", normalize=True, backend="local")
    times.append(time.perf_counter() - t)
jobs.shutdown()
print("RESULT " + json.dumps(times))
"""

IMPORTS = "import jobs.cli, jobs.driver, states.runtime, workers.unit"


def load_line() -> str:
    try:
        return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "load average unknown"


def versions() -> str:
    out = subprocess.run([sys.executable, "-c", "import torch, transformers, pyarrow; print(torch.__version__, "
                          "transformers.__version__, pyarrow.__version__)"], capture_output=True, text=True, cwd=REPO)
    torch_v, transformers_v, pyarrow_v = (out.stdout.split() + ["?"] * 3)[:3]
    return f"python {sys.version.split()[0]}, torch {torch_v}, transformers {transformers_v}, pyarrow {pyarrow_v}"


def run_cli(corpus: Path, model: Path, out: Path, device: str, env: dict) -> tuple[float, dict]:
    """(process wall, report) of one `python -m jobs.embed` over `corpus`."""
    command = [sys.executable, "-m", "jobs.embed", "--input", str(corpus), "--output", str(out), "--model", str(model),
               "--id-column", "id", "--pooling", "mean", "--normalize", "--device", device, "--no-progress"]
    t = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t
    if done.returncode:
        raise RuntimeError(f"jobs.embed exit {done.returncode}:\n{done.stdout[-3000:]}")
    return wall, json.loads((out / "_report.json").read_text())


def settle_bytecode(cache: Path, timeout: float = 120.0) -> str:
    """After a job: wait for the bytecode fill it may have started (`workers.bytecode`, where
    the interpreter writes none) so the next run finds it done and nothing runs beside the
    next measurement; says what was found."""
    folder, t = cache / "pycache", time.perf_counter()
    if not folder.exists():
        return "no bytecode fill (the interpreter writes its own)"
    while not list(folder.glob(".filled-*")) and time.perf_counter() - t < timeout:
        time.sleep(0.5)
    state = "filled" if list(folder.glob(".filled-*")) else "still filling"
    return f"bytecode folder {state} {time.perf_counter() - t:.1f} s after the run"


def importtime(env: dict, top: int) -> list[tuple[float, str]]:
    """(cumulative seconds, module) of the heaviest imports two levels down from the top."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", IMPORTS], env=env, cwd=REPO,
                          capture_output=True, text=True)
    rows = []
    for line in done.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
        if m and len(m[2]) // 2 <= 2:
            rows.append((int(m[1]) / 1e6, "  " * (len(m[2]) // 2) + m[3]))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    from jobs.driver import PHASES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, help="directory with a WordPiece tokenizer (BERT vocab)")
    parser.add_argument("--model", type=Path, help="a model directory to load instead of building --shape")
    parser.add_argument("--shape", default="bert-base")
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--runs", type=int, default=3, help="processes; the first with empty pooljobs caches")
    parser.add_argument("--compile", default="off", help="compile option of --profile-load's Runtime")
    parser.add_argument("--profile-load", action="store_true")
    parser.add_argument("--importtime", action="store_true")
    parser.add_argument("--notebook", action="store_true",
                        help="also time three jobs.embed calls on the corpus in one session (backend local)")
    args = parser.parse_args()
    if args.tokenizer is None and args.model is None:
        parser.error("give --tokenizer (to build the model and corpus) or --model and --tokenizer")
    from bench.__main__ import SHAPES, build_model, make_corpus, write_corpus

    if args.shape not in SHAPES:
        parser.error(f"--shape {args.shape!r}; choose one of {list(SHAPES)}")
    root = Path(tempfile.mkdtemp(prefix="pooljobs-startup-"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "POOLJOBS_CACHE": str(root / "cache")}
    model = args.model or build_model(args.shape, args.tokenizer, root)
    corpus = root / "corpus.parquet"
    write_corpus(make_corpus(args.tokenizer, args.docs), corpus)
    print(f"# startup: model {model}, {args.docs:,} docs, device {args.device}; {versions()}", flush=True)
    print("| run | caches | process s | run s | fixed s | " + " | ".join(PHASES) + " | load |")
    print("|---|---|---|---|---|" + "---|" * len(PHASES) + "---|", flush=True)
    for i in range(args.runs):
        before = load_line()
        wall, report = run_cli(corpus, model, root / f"out-{i}", args.device, env)
        phases = report.get("startup", {})
        cells = " | ".join(f"{phases[p]:.2f}" if p in phases else "-" for p in PHASES)
        print(f"| {i + 1} | {'empty' if i == 0 else 'warm'} | {wall:.2f} | {report['run_seconds']:.2f} | "
              f"{wall - report['run_seconds']:.2f} | {cells} | {before}; {settle_bytecode(root / 'cache')} |", flush=True)
    if args.notebook:
        done = subprocess.run([sys.executable, "-c", NOTEBOOK, str(corpus), str(model), args.device], env=env,
                              cwd=REPO, capture_output=True, text=True)
        line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"notebook calls failed:\n{done.stderr[-3000:]}")
        times = json.loads(line.removeprefix("RESULT "))
        print(f"\n# notebook, {args.docs:,} rows, one session: " + ", ".join(f"call {i + 1} {t:.2f}s" for i, t in
                                                                         enumerate(times)) + f" ({load_line()})")
    if args.importtime:
        print(f"\n# heaviest imports of `{IMPORTS}` ({load_line()})")
        for seconds, name in importtime(env, 25):
            print(f"{seconds:8.3f}s {name}")
    if args.profile_load:
        print(f"\n# cProfile of Runtime(...) ({load_line()})", flush=True)
        subprocess.run([sys.executable, "-c", PROFILE_LOAD, str(model), args.device, args.compile, "30"], env=env,
                       cwd=REPO)


if __name__ == "__main__":
    main()
