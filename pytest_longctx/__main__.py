"""``python -m pytest_longctx report RUN_DIR ...``: rebuild every report from ``results.jsonl``.

No pytest session and no server are needed: records are the only input, so a report can be
rebuilt after a crash, on another machine, or from several passes of a campaign merged
together (records of the same length from different runs count as repeats).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_longctx.benchmark_json import write_benchmark_json
from pytest_longctx.html_report import write_standalone_html
from pytest_longctx.plots import ExtraPlot, write_plots
from pytest_longctx.records import Record, read_runs, results_path
from pytest_longctx.report_markdown import DEFAULT_TITLE, write_markdown

MARKDOWN_FILENAME = "report.md"
HTML_FILENAME = "report.html"
BENCHMARK_FILENAME = "benchmark.json"

PROG = "python -m pytest_longctx"


def rebuild_reports(
    records: Iterable[Record],
    out_dir: Path,
    *,
    extra_plots: Iterable[ExtraPlot] = (),
    title: str = DEFAULT_TITLE,
    reproduce: Mapping[str, Any] | None = None,
    machine_info: Mapping[str, Any] | None = None,
    commit_info: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Write report.md, the plots, report.html and benchmark.json; return the paths written.

    Each file is replaced atomically, so this can run after every sweep point while the
    reports are open.
    """
    records = list(records)
    out_dir = Path(out_dir)
    plots = write_plots(out_dir, records, extra_plots)
    markdown = write_markdown(
        out_dir / MARKDOWN_FILENAME, records, title=title, reproduce=reproduce, plots=plots
    )
    page = write_standalone_html(
        out_dir / HTML_FILENAME, records, plots, title, reproduce=reproduce
    )
    benchmark = write_benchmark_json(
        out_dir / BENCHMARK_FILENAME, records, machine_info, commit_info
    )
    return [markdown, *plots, page, benchmark]


class UsageError(Exception):
    """A command line that names something unusable; reported with exit status 2."""


def _results_files(run_dirs: Sequence[Path]) -> list[Path]:
    files = []
    for run_dir in run_dirs:
        if not run_dir.exists():
            raise UsageError(
                f"run folder {str(run_dir)!r} does not exist; expected a folder written by a "
                "pytest-longctx session (reports/<run_id>/) or its results.jsonl"
            )
        path = results_path(run_dir)
        if not path.is_file():
            raise UsageError(
                f"{str(run_dir)!r} holds no results.jsonl; expected a folder written by a "
                "pytest-longctx session (reports/<run_id>/) or its results.jsonl"
            )
        files.append(path)
    return files


def _report_command(args: argparse.Namespace) -> int:
    run_dirs = [Path(path) for path in args.run_dirs]
    files = _results_files(run_dirs)
    if args.output is not None:
        out_dir = Path(args.output)
    elif len(files) == 1:
        out_dir = files[0].parent
    else:
        raise UsageError(
            f"{len(files)} runs given: name the folder for the merged reports with --output DIR "
            "(the runs' own folders are left as they are)"
        )
    result = read_runs(files)
    for problem in result.problems:
        print(f"warning: {problem}", file=sys.stderr)
    if not result.records:
        print(f"warning: no readable records in {', '.join(map(str, files))}", file=sys.stderr)
    title = args.title or DEFAULT_TITLE
    for path in rebuild_reports(result.records, out_dir, title=title):
        print(path)
    return 0


def _baseline_command(args: argparse.Namespace) -> int:
    from .gate import BaselineError, load_baseline, write_baseline

    try:
        records = load_baseline(Path(args.run_dir))
        count = write_baseline(records, Path(args.output))
    except BaselineError as exc:
        raise UsageError(str(exc)) from None
    print(
        f"{args.output}: {count} passed record(s) from {args.run_dir}; commit it and gate "
        f"with --longctx-baseline={args.output}"
    )
    return 0


def _build_model_command(args: argparse.Namespace) -> int:
    from .embedded import main as build_main

    return build_main([args.name])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Work with the results of pytest-longctx sweeps."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    report = commands.add_parser(
        "report",
        help="rebuild report.md, plots, report.html and benchmark.json from results.jsonl",
        description=(
            "Rebuild report.md, ttft.png, decode.png, report.html and benchmark.json from "
            "one or more runs' results.jsonl. Several runs are merged: records of the same "
            "length count as repeats. Corrupt lines are reported and skipped, never rewritten."
        ),
    )
    report.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="a run folder or its results.jsonl"
    )
    report.add_argument(
        "--output",
        metavar="DIR",
        help="where to write the reports (default: the run folder; required for several runs)",
    )
    report.add_argument("--title", help=f"report title (default: {DEFAULT_TITLE!r})")
    report.set_defaults(handler=_report_command)
    baseline = commands.add_parser(
        "baseline",
        help="store a run's passed records as the baseline file a team commits",
    )
    baseline.add_argument("run_dir", metavar="RUN_DIR", help="a run folder or its results.jsonl")
    baseline.add_argument("--output", required=True, metavar="FILE", help="baseline file to write")
    baseline.set_defaults(handler=_baseline_command)
    build = commands.add_parser("build-model", help="build (or find) an embedded model")
    build.add_argument("name", help="tiny-llama or tiny-mla")
    build.set_defaults(handler=_build_model_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except UsageError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
