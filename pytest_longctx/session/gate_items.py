"""The regression gate inside a session: ``test_regression[len=N]`` items over records.

The baseline and tolerances are read and checked when the session is configured, so a
missing or malformed baseline stops the session before any server starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from pytest_longctx import gate
from pytest_longctx.campaign.run import Run
from pytest_longctx.core.records import Record
from pytest_longctx.core.sizes import format_size

TOLERANCE_OPTION = "--longctx-tolerance"


def configure(run: Run) -> None:
    """Load and check the baseline and tolerances; raise a usage error naming what is wrong.

    Tolerances: ``--longctx-tolerance`` when given, else the baseline file's calibrated ones,
    else the profile's ``[gate] tolerance``, else the built-in defaults.
    """
    profile = run.plan.profile
    try:  # checked even without a baseline: a typo is a typo
        gate.parse_tolerances(run.settings.tolerance)
    except gate.ToleranceError as exc:
        raise pytest.UsageError(exc.for_option(TOLERANCE_OPTION)) from None
    try:
        gate.parse_tolerances(profile.gate.tolerance)
    except gate.ToleranceError as exc:
        raise pytest.UsageError(f"profile {profile.path}: [gate] tolerance: {exc}") from None
    if run.settings.baseline is None:
        return
    try:
        problems: list[str] = []
        baseline = gate.load_baseline_file(run.settings.baseline, problems)
    except gate.BaselineError as exc:
        raise pytest.UsageError(f"--longctx-baseline: {exc}") from None
    tolerances, source = gate.choose_tolerances(
        run.settings.tolerance,
        TOLERANCE_OPTION,
        baseline.tolerances(),
        f"the baseline's calibration ({baseline.path})",
        profile.gate.tolerance,
        profile.name,
    )
    run.reports.gate = gate.GateState(
        baseline.records,
        tolerances,
        level=run.settings.gate_level,
        tolerance_source=source,
    )
    run.reports.problems.extend(problems)


def baseline_records(run: Run) -> list[Record]:
    state: gate.GateState | None = run.reports.gate
    if state is None:
        raise pytest.UsageError("test_regression needs --longctx-baseline=PATH")
    return state.baseline


def gate_properties(
    length: int, status: str, verdicts: Sequence[gate.MetricVerdict] = ()
) -> list[tuple[str, object]]:
    """A ``test_regression[len=N]`` item's properties (``--junitxml``): the length, its status
    (one of ``gate.LENGTH_STATUSES``, or ``refused``) and each metric's verdict, change and
    tolerance."""
    properties: list[tuple[str, object]] = [
        ("longctx_gate_length", length),
        ("longctx_gate_status", status),
    ]
    for verdict in verdicts:
        properties.append((f"longctx_gate_{verdict.metric}", verdict.status))
        if verdict.change_pct is not None:
            properties.append((f"longctx_gate_{verdict.metric}_change_pct", verdict.change_pct))
        properties.append((f"longctx_gate_{verdict.metric}_tolerance_pct", verdict.tolerance_pct))
    return properties


@dataclass
class Gate:
    run: Run
    baseline: list[Record]
    #: The item judging: its ``user_properties`` get the verdicts (``--junitxml``).
    item: pytest.Item | None = None

    def _set_properties(
        self, length: int, status: str, verdicts: tuple[gate.MetricVerdict, ...] = ()
    ) -> None:
        if self.item is None:
            return
        self.item.user_properties.extend(gate_properties(length, status, verdicts))

    def check(self, length: int) -> gate.LengthVerdict:
        """Fail like a reviewer would if ``length`` got slower than the baseline."""
        __tracebackhide__ = True  # a skip names the test's line, not this module's
        state = self.run.reports.gate
        assert state is not None  # the item exists only with a baseline (baseline_records)
        if self.run.worker is not None and self.run.started_at is not None:
            from pytest_longctx.session.workers import wait_for_length

            wait_for_length(self.run, length, self.run.started_at)
        current = self.run.results.all_records()
        if not self.run.settings.baseline_force:
            # Only measurements count: a point that errored before any server was up carries
            # no fingerprint, and must not make the passed ones look incomparable.
            measured = [record for record in current if record.outcome == "passed"]
            differences = gate.fingerprint_differences(self.baseline, measured)
            if differences:
                self._set_properties(length, "refused")
                pytest.fail(
                    "refusing to compare unlike with unlike (use --longctx-baseline-force to "
                    "compare anyway):\n  " + "\n  ".join(differences),
                    pytrace=False,
                )
        verdict = gate.compare_length(
            self.baseline, current, length, state.tolerances, level=state.level
        )
        self._set_properties(length, verdict.status, verdict.verdicts)
        if verdict.status == "missing_in_baseline":
            pytest.skip(verdict.message)
        if verdict.status == "improved":  # only what improved: "ok" lines are no news
            state.improved.extend(v.message for v in verdict.verdicts if v.status == "improved")
        if verdict.status in ("regressed", "missing_in_current", "insufficient"):
            pytest.fail(verdict.message, pytrace=False)
        return verdict


def summary_lines(run: Run, starts: Sequence[dict]) -> list[str]:
    """The gate's settings and noise model, improvements, and baseline lengths not measured;
    ``starts``: the session's server starts."""
    state: gate.GateState | None = run.reports.gate
    if state is None:
        return []
    lines = [
        f"tolerances {state.tolerances.describe()} (from {state.tolerance_source}), "
        f"level {state.level:g}, {gate.noise_model_words(state.sessions)}"
    ]
    if state.sessions < 2:
        lines.append(
            "the baseline holds one session, so the noise estimate is within-session only; "
            "add sessions with `python -m pytest_longctx baseline RUN_DIR --output FILE --append`"
        )
    if len(starts) > 1:
        lines.append(
            f"this session's points came from {len(starts)} server starts "
            f"({len(starts) - 1} after a crash): a baseline made from it counts each "
            "start as a session of its own, since repeats on different starts spread like "
            "separate sessions (each record's server_start says which)"
        )
    lines += state.improved  # each ends saying to refresh the baseline
    measured = {p.length for p in run.selected_points}
    unmeasured = sorted({r.length for r in state.baseline} - measured)
    if unmeasured:
        lines.append(
            "baseline lengths not measured in this session: "
            + ", ".join(format_size(n) for n in unmeasured)
        )
    return lines
