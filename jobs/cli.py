"""Command line: flags generated from `JobSpec`, an optional YAML job file, exit codes.

`--config job.yaml` supplies any option by its field name; flags given on the command
line override it. Exit codes: 0 all units committed, 1 some units failed (the summary and
`_report.json` say which), 2 the job could not start (bad option, input, model, device or
output directory: one `PROG: error: ...` line, no traceback unless `--debug`), 130
interrupted (Ctrl-C; the committed units stay, and the same command resumes).

Nothing heavy is imported before the options are valid: the driver (and with it torch)
loads only once a job is about to run, so `--help` and option errors answer at once.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable, NoReturn, Sequence

import yaml

from jobs.spec import JobSpec, SpecError, choices, value_type

INTERRUPTED = 130  # what a shell reports for a process ended by SIGINT


class Parser(argparse.ArgumentParser):
    """argparse that answers a bad flag in one line, with the nearest flag when there is one."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def parse(self, argv: Sequence[str]) -> dict[str, Any]:
        args, unknown = self.parse_known_args(argv)
        if unknown:
            flags = [s for a in self._actions for s in a.option_strings]
            close = difflib.get_close_matches(unknown[0].partition("=")[0], flags, n=1)
            self.error(f"unrecognized arguments: {' '.join(unknown)}" + (f"; did you mean {close[0]}?" if close else ""))
        return vars(args)


def storage_option(text: str) -> tuple[str, Any]:
    """KEY=VALUE; only true/false become booleans (a secret like 0123 stays a string)."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--storage-option wants KEY=VALUE, got {text!r}")
    return key, {"true": True, "false": False}.get(value.lower(), value)


def pooljobs_version() -> str:
    try:
        return version("pooljobs")
    except PackageNotFoundError:
        return "unknown (not installed; pip install -e .)"


def build_parser(prog: str, description: str, tasks: Sequence[str], demo: bool = False) -> Parser:
    parser = Parser(prog=prog, description=description, argument_default=argparse.SUPPRESS,
                    formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--version", action="version", version=f"{prog} (pooljobs {pooljobs_version()})")
    if demo:
        parser.add_argument("--demo", action="store_true",
                            help="embed the bundled sample corpus with the bundled all-MiniLM-L6-v2 into out/demo")
    parser.add_argument("--config", help="YAML job file; its keys are the option names below (with _), flags override")
    parser.add_argument("--dry-run", action="store_true",
                        help="plan and check the job, load the model once, print units, rows, estimated tokens, "
                             "output schema and model settings, and stop without writing")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error instead of one line")
    for name, info in JobSpec.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = f"{info.description} (default: {info.get_default(call_default_factory=True)})"
        kind, valid = value_type(name), tasks if name == "task" else choices(name)
        if name == "input":
            parser.add_argument(flag, nargs="+", help=help_text)
        elif name == "storage_options":
            parser.add_argument("--storage-option", dest="storage_options", action="append", type=storage_option,
                                metavar="KEY=VALUE", help=help_text)
        elif kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(flag, type=kind, choices=valid, help=help_text)
    return parser


def read_config(path: str) -> dict[str, Any]:
    """A YAML job file's options; a missing or malformed file is a SpecError naming it."""
    try:
        with open(path) as f:
            loaded = yaml.safe_load(f)
    except OSError as e:
        raise SpecError(f"--config {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise SpecError(f"--config {path}: not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise SpecError(f"--config {path}: a job file is a mapping of option names to values")
    return {str(k).replace("-", "_"): v for k, v in loaded.items()}


def in_submitted_ray_job() -> bool:
    """Whether this process is the entrypoint of a `ray job submit` (its working directory
    is then Ray's copy of `--working-dir`, deleted with the job)."""
    return "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ


def spec_from_args(args: dict[str, Any], defaults: dict, tasks: Sequence[str], prog: str) -> JobSpec:
    """The spec from parsed flags over a `--config` file over `defaults`."""
    values = dict(defaults)
    config = args.pop("config", None)
    if config:
        values.update(read_config(config))
    if "storage_options" in args:
        args["storage_options"] = {**values.get("storage_options", {}), **dict(args["storage_options"])}
    if isinstance(args.get("input"), list) and len(args["input"]) == 1:
        args["input"] = args["input"][0]
    values.update(args)
    output = values.get("output")
    relative = isinstance(output, str) and "://" not in output and not os.path.isabs(os.path.expanduser(output))
    if relative and output and in_submitted_ray_job():
        raise SpecError(f"output={output!r} is relative, and under `ray job submit` the working directory is Ray's "
                        "temporary copy of --working-dir, deleted with the job; pass an absolute path on the "
                        "cluster's shared disk or a URI (s3://bucket/out)")
    spec = JobSpec.from_mapping(values, config)
    if spec.task not in tasks:
        raise SpecError(f"task={spec.task!r}: {prog} runs {list(tasks)}")
    return spec


def user_errors() -> tuple[type[BaseException], ...]:
    """What a user's mistake raises (one line, exit 2); imported only when one happened."""
    from jobs.manifest import OutputConflictError
    from jobs.pool import PlacementError
    from states.errors import ModelLoadError, UnclassifiedModelError
    from workers.reader import InputError

    return SpecError, InputError, ModelLoadError, OutputConflictError, PlacementError, UnclassifiedModelError


def committed_units(spec: JobSpec) -> tuple[int, int | None, dict | None]:
    """(units committed, units the job has or None when unknown, the output's job record)."""
    from jobs.manifest import Manifest

    manifest = Manifest(spec.output, spec.storage_options)
    job = manifest.job()
    return len(manifest.committed()), (len(job["units"]) if job and "units" in job else None), job


def resume_line(spec: JobSpec) -> str | None:
    """"resuming: N of M units committed" or "already complete" when the output holds this
    job's options over the same input; None for a fresh output (or one --overwrite replaces),
    and when the output cannot be read: the driver then reports why."""
    if spec.overwrite:
        return None
    try:
        done, total, job = committed_units(spec)
    except (OSError, ValueError):
        return None
    if job is None or total is None or job.get("options") != spec.fingerprint_fields() or job.get("input") != spec.inputs:
        return None
    if done >= total:
        return f"already complete: all {total} units of {spec.output} are committed; nothing to run"
    return f"resuming: {done} of {total} units committed"


def interrupted_line(spec: JobSpec | None) -> str:
    if spec is None:
        return "interrupted"
    try:
        done, total, _ = committed_units(spec)
    except (OSError, ValueError):
        return "interrupted; rerun the same command to resume"
    return f"interrupted: {done} of {total if total is not None else '?'} units committed; rerun the same command to resume"


def summarize(outcome) -> str:
    r = outcome.report
    lines = [f"pooljobs: {r['units_committed']}/{r['units']} units, {r['rows']:,} rows, {r['tokens']:,} tokens, "
             f"{r['rows_quarantined']:,} quarantined, {r['rows_truncated']:,} truncated -> {outcome.output}"]
    if r["units_run_now"]:
        lines.append(f"pooljobs: {r['rows_per_s']:,.0f} rows/s, {r['tokens_per_s']:,.0f} tokens/s over {r['wall_seconds']:.1f}s")
    if r.get("startup"):
        lines.append("pooljobs: startup " + ", ".join(f"{phase} {seconds:.1f}s" for phase, seconds in r["startup"].items()))
    if r.get("rows_deduplicated") or r.get("rows_reused"):
        lines.append(f"pooljobs: {r['rows_computed']:,} rows computed, {r['rows_deduplicated']:,} copied from a row "
                     f"with the same text, {r['rows_reused']:,} reused from the previous output")
    for refused in r.get("reuse_refused", [])[:3]:
        lines.append(f"pooljobs: unit {refused['unit']} reused nothing: {refused['why']}")
    if r["duplicate_ids_within_units"]:
        lines.append(f"pooljobs: {r['duplicate_ids_within_units']:,} rows repeat an id already seen in their unit "
                     "(all kept; `python -m jobs.verify` counts repeats across the whole output)")
    for f in r["units_failed"]:
        lines.append(f"pooljobs: FAILED {f['unit']} ({f['file']}): {f['error']}")
    return "\n".join(lines)


def process_start() -> float | None:
    """When this process started (`time.time()` clock), for the startup timeline's imports."""
    try:
        import psutil

        return psutil.Process().create_time()
    except (ImportError, OSError):
        return None


def main(prog: str, description: str, tasks: Sequence[str], argv: Sequence[str] | None = None,
         defaults: dict | None = None, demo: Callable[[], list[str]] | None = None) -> int:
    """Run the job the arguments describe; returns the exit code. `demo` (for jobs.embed)
    returns the arguments of the bundled demo, which `--demo` puts before the others."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog, description, tasks, demo is not None)
    args = parser.parse(argv)
    if args.pop("demo", False):
        args = parser.parse(demo() + [a for a in argv if a != "--demo"])
    debug, dry_run = args.pop("debug", False), args.pop("dry_run", False)
    spec = None
    try:
        spec = spec_from_args(args, defaults or {}, tasks, prog)
        if dry_run:
            from jobs.dryrun import describe_job

            print(describe_job(spec))
            return 0
        line = resume_line(spec)
        if line:
            print(f"{prog}: {line}", flush=True)
        from workers import bytecode

        bytecode.use()  # before torch and transformers are imported
        from jobs.driver import run_job

        try:
            outcome = run_job(spec, started_at=process_start())
        finally:
            bytecode.fill_later()
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{prog}: {interrupted_line(spec)}", file=sys.stderr)
        return INTERRUPTED
    except Exception as e:
        if debug or not isinstance(e, user_errors()):
            raise
        print(f"{prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(summarize(outcome))
    if not outcome.ok:
        print(json.dumps(outcome.report["units_failed"], indent=1), file=sys.stderr)
    return 0 if outcome.ok else 1
