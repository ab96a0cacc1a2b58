"""The sweep's items: one per (length, repeat), their marks, order and plan printout."""

from __future__ import annotations

import pytest

from pytest_longctx.core.sizes import format_size
from pytest_longctx.plan.sweep import SLOW_MARK, VERY_SLOW_MARK, Point
from pytest_longctx.session.selection import Comparison
from pytest_longctx.session.stash import CAPACITY_KEY, COMPARISONS_KEY, RUN_KEY

POINT_FIXTURE = "longctx_point"
REGRESSION_FIXTURE = "longctx_regression_length"


def _marks(point: Point, bands: tuple[str, ...], comparisons: tuple[Comparison, ...]) -> list:
    marks = [pytest.mark.longctx(len=point.length, rep=point.repeat)]
    marks += [getattr(pytest.mark, band) for band in bands]
    if VERY_SLOW_MARK in bands:  # very slow is also slow: -m "not longctx_slow" drops both
        marks.append(getattr(pytest.mark, SLOW_MARK))
    marks += [
        getattr(pytest.mark, c.marker_name)
        for c in comparisons
        if c.holds(point.length, point.repeat)
    ]
    return marks


def parametrize(metafunc: pytest.Metafunc) -> None:
    config = metafunc.config
    if RUN_KEY not in config.stash:
        return
    run, comparisons = config.stash[RUN_KEY], config.stash.get(COMPARISONS_KEY, ())
    plan = run.plan
    if POINT_FIXTURE in metafunc.fixturenames:
        metafunc.parametrize(
            POINT_FIXTURE,
            [
                pytest.param(p, id=p.id, marks=_marks(p, plan.band_marks(p.length), comparisons))
                for p in plan.points
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


def point_of(item: pytest.Item) -> Point | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    point = callspec.params.get(POINT_FIXTURE)
    return point if isinstance(point, Point) else None


def regression_length_of(item: pytest.Item) -> int | None:
    callspec = getattr(item, "callspec", None)
    return None if callspec is None else callspec.params.get(REGRESSION_FIXTURE)


def arrange(config: pytest.Config, items: list[pytest.Item]) -> None:
    """After selection: note the points, mark those that cannot fit, place regression items."""
    if RUN_KEY not in config.stash:
        return
    run = config.stash[RUN_KEY]
    if not run.settings.baseline:
        unused = [i for i in items if REGRESSION_FIXTURE in getattr(i, "fixturenames", ())]
        if unused:
            config.hook.pytest_deselected(items=unused)
            items[:] = [i for i in items if i not in unused]
    points = [p for p in map(point_of, items) if p is not None]
    run.selected_points = points
    from pytest_longctx.session import outputs as reporting

    reporting.drop_unused_outputs(config, run)
    if not points and any(c.field == "len" for c in config.stash.get(COMPARISONS_KEY, ())):
        plan = run.plan
        run.problems.append(
            f"the length selection matched no point of {format_size(plan.lengths[0])}.."
            f"{format_size(plan.lengths[-1])} (profile {plan.profile.name}); widen the range "
            "with --longctx-from/--longctx-to"
        )
    from pytest_longctx.capacity import profile as capacity_plan

    lengths = sorted({p.length for p in points})
    from pytest_longctx.capacity import ParallelLayoutError
    from pytest_longctx.serving.profiles import ProfileError

    try:
        verdicts = {} if run.settings.url else capacity_plan.check_points(run.plan, lengths)
    except (ParallelLayoutError, ProfileError) as exc:
        raise pytest.UsageError(f"profile {run.plan.profile.name}: {exc}") from None
    run.unfit_lengths = {length for length, fit in verdicts.items() if not fit.fits}
    for item in items:
        point = point_of(item)
        if point is None:
            continue
        verdict = verdicts.get(point.length)
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


def print_plan(session: pytest.Session) -> None:
    from pytest_longctx.capacity import profile as capacity_plan
    from pytest_longctx.session import server as serving

    config = session.config
    run = config.stash[RUN_KEY]
    write = config.get_terminal_writer().line
    profile = run.plan.profile
    write("")
    write(f"pytest-longctx plan: profile {profile.name} ({profile.description})")
    write(
        f"model {profile.model.source}"
        + (f" @ {profile.model.revision}" if profile.model.revision else "")
    )
    write(
        f"{len(session.items)} item(s), decode {run.plan.decode_tokens} tokens per request, "
        f"order {run.plan.order}"
    )
    for item in session.items:
        point = point_of(item)
        length = point.length if point else regression_length_of(item)
        bands = run.plan.band_marks(length) if length else ()
        skip = next((m.kwargs.get("reason") for m in item.iter_markers("skip")), None)
        label = point.id if point else item.name
        extra = (f" [{bands[0]}]" if bands else "") + (f" SKIP: {skip}" if skip else "")
        write(f"  {label}{extra}")
    write("")
    write(serving.describe_server(config, run))
    table = capacity_plan.render_table(run.plan, sorted({p.length for p in run.selected_points}))
    if table:
        write("")
        write(table)


def shutdown(config: pytest.Config) -> None:
    from pytest_longctx.session import server as serving

    serving.stop(config)
