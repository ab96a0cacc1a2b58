"""``python -m pytest_longctx report RUN_DIR ...``: rebuild every report from ``results.jsonl``.

No pytest session and no server are needed: records are the only input, so a report can be
rebuilt after a crash, on another machine, or from several passes of a campaign merged
together (records of the same length from different runs count as repeats).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_longctx.core import file_names
from pytest_longctx.core.file_names import LATEST, RESULTS_FILE
from pytest_longctx.core.records import Record, read_runs, results_path
from pytest_longctx.profiles.embedded_models import EMBEDDED_MODELS
from pytest_longctx.reporting import gate_report
from pytest_longctx.reporting.gate_report import GateView
from pytest_longctx.reporting.index import write_index
from pytest_longctx.reporting.pipeline import write_reports as rebuild_reports
from pytest_longctx.reporting.view import DEFAULT_TITLE

PROG = "python -m pytest_longctx"
#: The plots ``report`` draws for any run with passed points, and those it draws only where
#: the run's samples, its records or ``--baseline`` call for them.
ALWAYS_DRAWN = (file_names.TTFT_PLOT, file_names.DECODE_PLOT, file_names.KV_CACHE_PLOT)
DRAWN_WHEN_CALLED_FOR = (
    file_names.PREFILL_RATE_PLOT,
    file_names.REUSE_PLOT,
    file_names.INTERFERENCE_ITL_PLOT,
    file_names.INTERFERENCE_TTFT_PLOT,
    file_names.CONCURRENCY_PLOT,
    file_names.GATE_PLOT,
)
#: The sweep inside the package: what ``calibrate`` runs unless told another test file.
SHIPPED_SWEEP = ("--pyargs", "pytest_longctx.suite")


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
    gate = _gate_for_report(args, result.records)
    for path in rebuild_reports(result.records, out_dir, title=title, gate=gate):
        print(path)
    if (out_dir / RESULTS_FILE).is_file():  # a run folder: its output root lists it
        print(write_index(out_dir.absolute().parent))
    return 0


def _gate_for_report(args: argparse.Namespace, records: Sequence[Record]) -> GateView | None:
    """With --baseline: the gate as a session with that baseline judges these records.

    Tolerances as in a session: --tolerance, else the baseline file's calibration, else the
    profile's ``[gate]`` table (the profile the records name), else the built-in defaults.
    """
    from pytest_longctx import gate

    if args.baseline is None:
        if args.tolerance is not None or args.level is not None:
            raise UsageError("--tolerance and --level need --baseline FILE")
        return None
    try:
        baseline = gate.load_baseline_file(args.baseline)
        level = gate.DEFAULT_LEVEL if args.level is None else gate.parse_level(args.level)
        profile_name, profile_spec = _records_profile_tolerance(records)
        tolerances, source = gate.choose_tolerances(
            args.tolerance,
            "--tolerance",
            baseline.tolerances(),
            f"the baseline's calibration ({baseline.path})",
            profile_spec,
            profile_name,
        )
    except gate.BaselineError as exc:
        raise UsageError(str(exc)) from None
    except gate.LevelError as exc:
        raise UsageError(exc.for_option("--level")) from None
    except gate.ToleranceError as exc:
        raise UsageError(exc.for_option("--tolerance")) from None
    return gate_report.build_view(
        baseline.records,
        records,
        tolerances,
        level=level,
        force=args.force,
        baseline_label=str(args.baseline),
        tolerance_source=source,
    )


def _records_profile_tolerance(records: Sequence[Record]) -> tuple[str | None, str | None]:
    """The one profile the records name and its ``[gate] tolerance`` (None when not one)."""
    from pytest_longctx.profiles import ProfileError, load_profile

    names = {r.fingerprint.get("profile") for r in records if r.fingerprint} - {None}
    if len(names) != 1:
        return None, None
    name = str(next(iter(names)))
    try:
        return name, load_profile(name).gate.tolerance
    except ProfileError:
        return name, None


def _index_command(args: argparse.Namespace) -> int:
    root = Path(args.root)
    if not root.is_dir():
        raise UsageError(f"{str(root)!r} is not a folder; expected the root of run folders")
    print(write_index(root))
    return 0


def _compare_command(args: argparse.Namespace) -> int:
    from pytest_longctx.gate import DEFAULT_LEVEL, LevelError, parse_level
    from pytest_longctx.reporting.run_comparison import CompareError, write_comparison

    try:
        level = DEFAULT_LEVEL if args.level is None else parse_level(args.level)
        paths = write_comparison([Path(s) for s in args.sources], Path(args.output), level)
    except LevelError as exc:
        raise UsageError(exc.for_option("--level")) from None
    except CompareError as exc:
        raise UsageError(str(exc)) from None
    for path in paths:
        print(path)
    return 0


def _load_runs(run_dirs: Sequence[str]) -> list[Record]:
    from pytest_longctx.gate import BaselineError, load_baseline

    records: list[Record] = []
    for run_dir in run_dirs:
        try:
            records.extend(load_baseline(Path(run_dir)))
        except BaselineError as exc:
            raise UsageError(str(exc)) from None
    return records


def _positive(option: str, minimum: int) -> Any:
    def parse(text: str) -> int:
        if not text.strip().isdigit() or int(text) < minimum:
            raise argparse.ArgumentTypeError(
                f"{option}={text}: expected a whole number >= {minimum}"
            )
        return int(text)

    return parse


def _level(text: str) -> float:
    from pytest_longctx.gate import LevelError, parse_level

    try:
        return parse_level(text)
    except LevelError as exc:
        raise argparse.ArgumentTypeError(exc.for_option("--level")) from None


def _baseline_command(args: argparse.Namespace) -> int:
    from pytest_longctx import gate

    records = _load_runs(args.run_dirs)
    output = Path(args.output)
    info = gate.BaselineInfo(max_sessions=args.max_sessions)
    kept_before = 0
    if args.append and output.exists():
        try:
            existing = gate.load_baseline_file(output)
        except gate.BaselineError as exc:
            raise UsageError(f"--append: {exc}") from None
        if not args.force:
            differences = gate.fingerprint_differences(existing.records, records)
            if differences:
                raise UsageError(
                    f"--append: the new run(s) measured another setup than {output} "
                    "(start a new baseline without --append, or pass --force):\n  "
                    + "\n  ".join(differences)
                )
        new_ids = {record.run_id for record in records}
        kept = [record for record in existing.records if record.run_id not in new_ids]
        kept_before = gate.session_count(kept)
        records = kept + records
        info = gate.BaselineInfo(
            tolerance=existing.info.tolerance,
            max_sessions=args.max_sessions or existing.info.max_sessions,
            calibration=existing.info.calibration,
        )
    cap = info.max_sessions or gate.DEFAULT_MAX_SESSIONS
    total = gate.session_count(records)
    records = gate.keep_newest_sessions(records, cap)
    try:
        count = gate.write_baseline(records, output, info)
    except gate.BaselineError as exc:
        raise UsageError(str(exc)) from None
    sessions = gate.session_count(records)
    dropped = f", the {total - sessions} oldest dropped (cap {cap})" if total > sessions else ""
    kept_words = f" ({kept_before} kept from the file)" if args.append else ""
    print(
        f"{output}: {count} passed record(s) of {sessions} session(s){kept_words}{dropped}; "
        f"commit it and gate with --longctx-baseline={output}"
    )
    if sessions < 2:
        print(
            "note: one session, so the gate's noise estimate is within-session only; append "
            "more runs (--append) to include the spread between sessions"
        )
    return 0


def _calibrate_command(args: argparse.Namespace) -> int:
    from pytest_longctx import gate

    records = _load_runs(args.runs) if args.runs else _run_sessions(args)
    try:
        calibration = gate.calibrate(records, args.level)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(
        f"calibration over {len(calibration.run_ids)} sessions, level {calibration.level:g} "
        "(between CV: spread of per-session means; within CV: spread of repeats in a session)"
    )
    for line in calibration.table_lines():
        print(line)
    spec = calibration.tolerances().describe()
    print(f"proposed tolerances: {spec}")
    if args.output:
        try:
            count = gate.write_baseline(records, args.output, calibration.info(args.max_sessions))
        except gate.BaselineError as exc:
            raise UsageError(str(exc)) from None
        print(
            f"{args.output}: {count} passed record(s) of {len(calibration.run_ids)} sessions "
            f"and the proposed tolerances; gate with --longctx-baseline={args.output}"
        )
    return 0


def _run_sessions(args: argparse.Namespace) -> list[Record]:
    """K sessions of the sweep, each its own pytest process, so each launches its own server."""
    import subprocess
    import tempfile

    pytest_args = list(args.pytest_args)
    if pytest_args and pytest_args[0] == "--":
        pytest_args = pytest_args[1:]
    if any(arg.startswith("--longctx-url") for arg in pytest_args):
        print(
            "note: --longctx-url attaches to one server for every session, so the server is "
            "not restarted between sessions and its start-to-start spread is not measured",
            file=sys.stderr,
        )
    output = Path(args.reports or tempfile.mkdtemp(prefix="longctx-calibrate-"))
    records: list[Record] = []
    for session in range(1, args.sessions + 1):
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            *(SHIPPED_SWEEP if args.test is None else [args.test]),
            f"--longctx-output={output}",
            *pytest_args,
        ]
        print(f"session {session}/{args.sessions}: {' '.join(command)}", flush=True)
        latest = output / LATEST
        before = latest.resolve() if latest.exists() else None
        completed = subprocess.run(command, check=False)
        run_dir = latest.resolve() if latest.exists() else None
        if run_dir is None or run_dir == before:
            raise UsageError(
                f"session {session} wrote no run under {output} (pytest exit "
                f"{completed.returncode}); check the arguments after --"
            )
        if completed.returncode != 0:
            print(
                f"warning: session {session} exited {completed.returncode}; its passed points "
                "count, the others do not",
                file=sys.stderr,
            )
        records.extend(_load_runs([str(run_dir)]))
    return records


def _build_model_command(args: argparse.Namespace) -> int:
    from pytest_longctx.serving.embedded import main as build_main

    return build_main([args.name])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Work with the results of pytest-longctx sweeps."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    report = commands.add_parser(
        "report",
        help="rebuild report.md, report.html, benchmark.json and the plots from results.jsonl",
        description=(
            "Rebuild report.md, report.html, benchmark.json and the plots a session writes "
            f"({', '.join(ALWAYS_DRAWN)}; {', '.join(DRAWN_WHEN_CALLED_FOR[:-1])} and "
            f"{DRAWN_WHEN_CALLED_FOR[-1]} where the run's samples, its records or --baseline "
            "call for them) from one or more runs' results.jsonl. "
            "Several runs are merged into --output: records of the same length count as "
            "repeats. Corrupt lines are reported and skipped, never rewritten."
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
    report.add_argument(
        "--baseline",
        metavar="FILE",
        help="add the regression gate against this baseline (file, run folder or results.jsonl)"
        ": a table and gate.png of the baseline beside the runs, per length",
    )
    report.add_argument(
        "--tolerance",
        metavar="SPEC",
        help="the gate's tolerances (default: the baseline's calibration, else the profile's)",
    )
    report.add_argument("--level", metavar="P", help="the gate's level (default 0.01)")
    report.add_argument(
        "--force", action="store_true", help="compare with a baseline of another setup"
    )
    report.set_defaults(handler=_report_command)
    index = commands.add_parser(
        "index",
        help="write ROOT/index.html, the list of every run folder under ROOT",
        description=(
            "Write index.html in an output root (default: reports): every run folder with "
            "its date, profile, model, points passed of recorded, outcome and links to its "
            "reports. Sessions and the report command rewrite it themselves."
        ),
    )
    index.add_argument("root", nargs="?", default="reports", metavar="ROOT")
    index.set_defaults(handler=_index_command)
    baseline = commands.add_parser(
        "baseline",
        help="store runs' passed records as the baseline file a team commits",
        description=(
            "Store the passed records of one or more runs as a baseline file. Each run is a "
            "session; with two or more sessions the gate judges a new run against the spread "
            "between sessions. --append adds the runs to an existing baseline's history "
            "(keeping its calibrated tolerances), dropping the oldest sessions beyond the cap."
        ),
    )
    baseline.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="a run folder or its results.jsonl"
    )
    baseline.add_argument("--output", required=True, metavar="FILE", help="baseline file to write")
    baseline.add_argument(
        "--append",
        action="store_true",
        help="add the runs to FILE's sessions instead of replacing them (FILE may not exist yet)",
    )
    baseline.add_argument(
        "--max-sessions",
        type=_positive("--max-sessions", 1),
        metavar="N",
        help="sessions to keep, the newest (default: the file's cap, else 10)",
    )
    baseline.add_argument(
        "--force", action="store_true", help="append even when the fingerprints differ"
    )
    baseline.set_defaults(handler=_baseline_command)
    calibrate = commands.add_parser(
        "calibrate",
        help="run the sweep K times, report the noise between sessions, propose tolerances",
        description=(
            "Run the same sweep K times, each a separate pytest session that starts its own "
            "server, then report per length and metric the CV between sessions (of the "
            "per-session means) and within them, and propose the tolerances that keep an "
            "unchanged rerun's false-alarm rate below --level. With --output the sessions and "
            "the proposed tolerances are stored as a baseline file. Arguments after -- go to "
            "pytest, e.g. -- --longctx-to=4Ki --longctx-repeats=2."
        ),
    )
    calibrate.add_argument(
        "--sessions",
        type=_positive("--sessions", 2),
        default=5,
        metavar="K",
        help="sessions to run (default 5)",
    )
    calibrate.add_argument(
        "--runs",
        nargs="+",
        metavar="RUN_DIR",
        help="calibrate from these finished runs (one session each) instead of running any",
    )
    calibrate.add_argument(
        "--level",
        type=_level,
        default=0.01,
        metavar="P",
        help="one-sided false-alarm level the tolerances must keep (default 0.01)",
    )
    calibrate.add_argument("--output", metavar="FILE", help="baseline file to write")
    calibrate.add_argument(
        "--max-sessions",
        type=_positive("--max-sessions", 1),
        metavar="N",
        help="cap on sessions stored in FILE's header for later --append",
    )
    calibrate.add_argument(
        "--test",
        default=None,
        metavar="PATH",
        help="a sweep test file of your own (default: the shipped sweep, "
        + " ".join(SHIPPED_SWEEP)
        + ", which runs in any folder)",
    )
    calibrate.add_argument(
        "--reports", metavar="DIR", help="where the sessions write their runs (default: a temp dir)"
    )
    calibrate.add_argument("pytest_args", nargs=argparse.REMAINDER, metavar="-- PYTEST_ARGS")
    calibrate.set_defaults(handler=_calibrate_command)
    compare = commands.add_parser(
        "compare",
        help="put runs side by side: what differs, per-length figures, ratios, overlay plots",
        description=(
            "Compare runs made on purpose under different setups (KV dtype, vLLM version, "
            "node): the fingerprint differences first, then per length and metric each run's "
            "mean ± std, the ratio to the first run and the gate's one-sided t-test; "
            "compare.md, a self-contained compare.html and overlay plots."
        ),
    )
    compare.add_argument(
        "sources", nargs="+", metavar="RUN", help="run folders, results.jsonl or baseline files"
    )
    compare.add_argument("--output", required=True, metavar="DIR", help="where to write")
    compare.add_argument(
        "--level", default=None, help="the t-test's level (default: the gate's, 0.01)"
    )
    compare.set_defaults(handler=_compare_command)
    build = commands.add_parser(
        "build-model",
        help="build (or find) an embedded model",
        description="Build an embedded model into the cache (or find it there) and print its "
        "folder; a session builds the one its profile names by itself.",
    )
    names = list(EMBEDDED_MODELS)
    build.add_argument("name", help=f"{', '.join(names[:-1])} or {names[-1]}")
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
