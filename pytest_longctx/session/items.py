"""The sweep's items: one per (length, repeat), their marks, order and plan printout."""

from __future__ import annotations

import pytest

from pytest_longctx.campaign import resume
from pytest_longctx.campaign.run import Run
from pytest_longctx.capacity import ModelConfigError, ParallelLayoutError
from pytest_longctx.core.sizes import format_size
from pytest_longctx.plan import capacity_check
from pytest_longctx.plan.points import SLOW_MARK, VERY_SLOW_MARK, Point, SweepPlan
from pytest_longctx.profiles import ProfileError
from pytest_longctx.session.selection import Comparison
from pytest_longctx.session.stash import CAPACITY_KEY, POINT_FIXTURE, REGRESSION_FIXTURE
from pytest_longctx.workloads import points_of, sized_for, workload_of


def _marks(point: Point, bands: tuple[str, ...], comparisons: tuple[Comparison, ...]) -> list:
    workload = workload_of(point)
    marks = [pytest.mark.longctx(len=point.length, rep=point.repeat, **workload.mark_kwargs(point))]
    marks += [getattr(pytest.mark, name) for name in (workload.mark, *bands) if name]
    if VERY_SLOW_MARK in bands:  # very slow is also slow: -m "not longctx_slow" drops both
        marks.append(getattr(pytest.mark, SLOW_MARK))
    marks += [
        getattr(pytest.mark, c.marker_name)
        for c in comparisons
        if c.holds(point.length, point.repeat)
    ]
    return marks


def parametrize(metafunc: pytest.Metafunc, run: Run, comparisons: tuple[Comparison, ...]) -> None:
    """One item per (length, repeat), or per length for the gate's items."""
    plan = run.plan
    if POINT_FIXTURE in metafunc.fixturenames:
        metafunc.parametrize(
            POINT_FIXTURE,
            [
                pytest.param(p, id=p.id, marks=_marks(p, plan.band_marks(p.length), comparisons))
                for p in points_of(plan)
            ],
        )
    elif REGRESSION_FIXTURE in metafunc.fixturenames:
        lengths = plan.lengths if run.settings.baseline else ()
        # A length comparison holds for the regression item of that length; a repeat
        # comparison never does (the item covers all repeats).
        length_only = tuple(c for c in comparisons if c.field == "len")
        metafunc.parametrize(
            REGRESSION_FIXTURE,
            [
                pytest.param(
                    n,
                    id=f"len={format_size(n)}",
                    marks=[pytest.mark.longctx_regression(len=n)]
                    + _marks(Point(n, -1), plan.band_marks(n), length_only)[1:],
                )
                for n in lengths
            ],
        )


def record_identity(point: Point) -> dict:
    """The fields of a record that say which point it is (``Record(**..., outcome=...)``)."""
    return {
        "length": point.length,
        "repeat": point.repeat,
        "cache_state": point.cache_state,
        **workload_of(point).identity(point),
    }


def point_of(item: pytest.Item) -> Point | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    point = callspec.params.get(POINT_FIXTURE)
    return point if isinstance(point, Point) else None


def regression_length_of(item: pytest.Item) -> int | None:
    callspec = getattr(item, "callspec", None)
    return None if callspec is None else callspec.params.get(REGRESSION_FIXTURE)


def point_of_nodeid(plan: SweepPlan, nodeid: str) -> Point | None:
    """The sweep point a test id names: its ``[len=..-rep=..]`` parameter id (a warm one's
    ``[len=..-rep=..-warm=..]``, which a cold point's id is the start of: exact ids first)."""
    if "[" not in nodeid:
        return None
    params = nodeid[nodeid.index("[") + 1 : nodeid.rindex("]")]
    points = sorted(points_of(plan), key=lambda p: -len(p.id))
    for point in points:
        if point.id == params:
            return point
    parts = params.split("-")
    for point in points:
        width = len(point.id.split("-"))
        if "-".join(parts[:width]) == point.id or "-".join(parts[-width:]) == point.id:
            return point
    return None


def arrange(
    config: pytest.Config, run: Run, comparisons: tuple[Comparison, ...], items: list[pytest.Item]
) -> None:
    """After selection: note the points, mark those that cannot fit, place regression items."""
    if not run.settings.baseline:
        unused = [i for i in items if REGRESSION_FIXTURE in getattr(i, "fixturenames", ())]
        if unused:
            config.hook.pytest_deselected(items=unused)
            items[:] = [i for i in items if i not in unused]
    points = [p for p in map(point_of, items) if p is not None]
    run.selected_points = points
    if not points and any(c.field == "len" for c in comparisons):
        plan = run.plan
        run.reports.problems.append(
            f"the length selection matched no point of {format_size(plan.lengths[0])}.."
            f"{format_size(plan.lengths[-1])} (profile {plan.profile.name}); widen the range "
            "with --longctx-from/--longctx-to"
        )
    beside = {p for p in points if workload_of(p).checked_under_load}
    lengths = sorted({p.length for p in points if p not in beside})
    loaded = sorted({p.length for p in beside})
    try:
        # the profile's config.json, read (and its model's class run) once: a file the class
        # rejects is the user's to fix, for an attached server's session too
        capacity_check.model_config(run.plan.profile)
        sized = sized_for(run.plan, points)
        verdicts = {} if run.settings.url else capacity_check.check_points(sized, lengths)
        under_load = (
            {}
            if run.settings.url
            else capacity_check.check_points(run.plan, loaded, under_load=True)
        )
    except (ParallelLayoutError, ModelConfigError, ProfileError) as exc:
        raise pytest.UsageError(f"profile {run.plan.profile.name}: {exc}") from None
    resume.redo_cold_points(run.results, points)
    run.unfit_lengths = {length for length, fit in verdicts.items() if not fit.fits}
    # A length whose interference point cannot fit beside its background is left out of the
    # server's --max-model-len only when no cold point of it is selected either.
    run.unfit_lengths |= {
        n for n, fit in under_load.items() if not fit.fits and n not in verdicts
    }
    for item in items:
        point = point_of(item)
        if point is None:
            continue
        verdict = (under_load if point in beside else verdicts).get(point.length)
        if verdict is not None:
            item.stash[CAPACITY_KEY] = verdict
            if not verdict.fits:
                item.add_marker(pytest.mark.skip(reason=verdict.reason))
    _place_regression_items(items)


def _place_regression_items(items: list[pytest.Item]) -> None:
    regression = [i for i in items if regression_length_of(i) is not None]
    if not regression:
        return
    rest = [i for i in items if regression_length_of(i) is None]
    for item in regression:
        length = regression_length_of(item)
        last = max(
            (k for k, i in enumerate(rest) if (p := point_of(i)) and p.length == length),
            default=len(rest) - 1,
        )
        rest.insert(last + 1, item)
    items[:] = rest
