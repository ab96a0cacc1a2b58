"""The length axis every report plot shares, the study's and each workload's alike."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_longctx.core.sizes import format_size


def length_axis(axes, lengths: Sequence[int], *, log_y: bool, pad: bool = True) -> None:  # noqa: ANN001
    """The x axis every report plot shares: powers of two as 1Ki..64Mi, log2, no minor ticks.

    ``pad`` leaves half an octave of room at each end (always with a single length).
    """
    from matplotlib.ticker import NullLocator

    axes.set_xscale("log", base=2)
    if log_y:
        axes.set_yscale("log")
    else:
        axes.set_ylim(bottom=0)
    axes.set_xticks(list(lengths))
    axes.set_xticklabels([format_size(n) for n in lengths], rotation=45, ha="right")
    axes.xaxis.set_minor_locator(NullLocator())
    if pad or len(lengths) == 1:
        axes.set_xlim(lengths[0] / 2, lengths[-1] * 2)
