"""Command line: flags generated from `JobSpec`, an optional YAML job file, exit codes.

`--config job.yaml` supplies any option by its field name; flags given on the command
line override it. Exit codes: 0 all units committed, 1 some units failed (the summary and
`_report.json` say which), 2 the job could not start (bad option, input or model).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any, Sequence

import yaml

from jobs.manifest import OutputConflictError
from jobs.spec import JobSpec, SpecError
from states.errors import ModelLoadError, UnclassifiedModelError
from workers.reader import InputError

USER_ERRORS = (SpecError, InputError, ModelLoadError, OutputConflictError, UnclassifiedModelError)


def storage_option(text: str) -> tuple[str, Any]:
    """KEY=VALUE; only true/false become booleans (a secret like 0123 stays a string)."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--storage-option wants KEY=VALUE, got {text!r}")
    return key, {"true": True, "false": False}.get(value.lower(), value)


def build_parser(prog: str, description: str, tasks: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description, argument_default=argparse.SUPPRESS,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--config", help="YAML job file; its keys are the option names below (with _), flags override")
    for f in dataclasses.fields(JobSpec):
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{f.metadata['help']} (default: {f.default if f.default is not dataclasses.MISSING else '{}'})"
        choices = tasks if f.name == "task" else f.metadata.get("choices")
        if f.name == "input":
            parser.add_argument(flag, nargs="+", help=help_text)
        elif f.name == "storage_options":
            parser.add_argument("--storage-option", dest="storage_options", action="append", type=storage_option,
                                metavar="KEY=VALUE", help=help_text)
        elif f.type in ("bool", "bool | None"):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        elif f.type in ("int", "int | None"):
            parser.add_argument(flag, type=int, choices=choices, help=help_text)
        else:
            parser.add_argument(flag, choices=choices, help=help_text)
    return parser


def spec_from_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None, defaults: dict) -> JobSpec:
    args = vars(parser.parse_args(argv))
    values = dict(defaults)
    config = args.pop("config", None)
    if config:
        with open(config) as f:
            loaded = yaml.safe_load(f) or {}
        if not isinstance(loaded, dict):
            raise SpecError(f"{config}: a job file is a mapping of option names to values")
        values.update({k.replace("-", "_"): v for k, v in loaded.items()})
        source = config
    else:
        source = "options"
    if "storage_options" in args:
        args["storage_options"] = {**values.get("storage_options", {}), **dict(args["storage_options"])}
    if isinstance(args.get("input"), list) and len(args["input"]) == 1:
        args["input"] = args["input"][0]
    values.update(args)
    return JobSpec.from_mapping(values, source)


def summarize(outcome) -> str:
    r = outcome.report
    lines = [f"pooljobs: {r['units_committed']}/{r['units']} units, {r['rows']:,} rows, {r['tokens']:,} tokens, "
             f"{r['rows_quarantined']:,} quarantined, {r['rows_truncated']:,} truncated -> {outcome.output}"]
    if r["units_run_now"]:
        lines.append(f"pooljobs: {r['rows_per_s']:,.0f} rows/s, {r['tokens_per_s']:,.0f} tokens/s over {r['wall_seconds']:.1f}s")
    if r["duplicate_ids_within_units"]:
        lines.append(f"pooljobs: {r['duplicate_ids_within_units']:,} rows repeat an id already seen in their unit "
                     "(all kept; `python -m jobs.verify` counts repeats across the whole output)")
    for f in r["units_failed"]:
        lines.append(f"pooljobs: FAILED {f['unit']} ({f['file']}): {f['error']}")
    return "\n".join(lines)


def main(prog: str, description: str, tasks: Sequence[str], argv: Sequence[str] | None = None,
         defaults: dict | None = None) -> int:
    from jobs.driver import run_job

    parser = build_parser(prog, description, tasks)
    try:
        spec = spec_from_args(parser, argv, defaults or {})
        if spec.task not in tasks:
            raise SpecError(f"task={spec.task!r}: {prog} runs {list(tasks)}")
        outcome = run_job(spec)
    except USER_ERRORS as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    print(summarize(outcome))
    if not outcome.ok:
        print(json.dumps(outcome.report["units_failed"], indent=1), file=sys.stderr)
    return 0 if outcome.ok else 1
