"""The regression gate: does this run serve long contexts slower than the committed baseline?

The gate reads records only (:mod:`pytest_longctx.core.records`); it never talks to a server.

The rule
--------
At every length, for every gated metric, the gate compares the mean of this run's passed repeats
with the baseline's. A point **regresses** only when the change in the bad direction (TTFT or
inter-token latency up, decode throughput down) is beyond BOTH

1. the tolerance: ``|mean_now - mean_base| > tolerance% * mean_base``, the change the team has
   declared it cares about, and
2. the noise: a one-sided t-test at the gate's level (``--longctx-gate-level``, default
   :data:`DEFAULT_LEVEL`) says the change is unlikely to be noise, ``p < level``.

The noise model depends on what the baseline holds:

* **Several sessions** (records of two or more run ids, see ``python -m pytest_longctx
  baseline --append``): the current run is one more session, judged against the distribution of
  the baseline's per-session means. With K session means of sample variance ``S_m**2`` (K - 1
  degrees of freedom), ``SE**2 = S_m**2 * (1 + 1/K)``: the noise of the baseline's mean plus that
  of a new session's mean, the spread *between* sessions (server start, machine state) included.
  When this run has fewer repeats than the baseline's sessions, its mean is noisier by
  ``s_w**2 * (1/n_now - 1/n_base)`` (``s_w`` the pooled spread *within* sessions); that term is
  added and the degrees of freedom come from Welch-Satterthwaite over the two terms.
* **One session**: Welch's t-test between the baseline's repeats and this run's, with
  Welch-Satterthwaite degrees of freedom. Repeats of one session share a server start, so this
  noise estimate is within-session only and understates the difference between two sessions;
  every message says so. With a single repeat on either side there is no spread to test: the
  tolerance alone decides, and the message says that too.

The t distribution is computed here (regularized incomplete beta), so the gate needs no SciPy.

An **improvement** beyond the tolerance and significant at the same level in the good direction
is reported (``improved``) so the team refreshes the baseline; it never fails. A change beyond the
tolerance but not significant is ``ok`` with a message saying it is noise-sized. Lengths measured
on one side only are reported (``missing_in_current`` / ``missing_in_baseline``), never silently
dropped.

Baseline files
--------------
A baseline file is JSON lines: passed records (each carries its session's ``run_id``), optionally
preceded by one header object ``{"longctx_baseline": 1, ...}`` holding the tolerances a
calibration proposed (``tolerance``), the cap on sessions kept (``max_sessions``) and the
calibration's table (``calibration``). Tolerances are taken from ``--longctx-tolerance`` when
given, else from the baseline's header, else from the profile's ``[gate] tolerance``, else the
built-in defaults."""

from __future__ import annotations

from .baseline import (
    BASELINE_FORM,
    HEADER_KEY,
    HEADER_VERSION,
    Baseline,
    BaselineError,
    BaselineInfo,
    keep_newest_sessions,
    load_baseline,
    load_baseline_file,
    sessions_of,
    write_baseline,
)
from .calibrate import (
    Calibration,
    CalibrationRow,
    calibrate,
)
from .fingerprint import (
    FINGERPRINT_KEYS,
    HARDWARE_KEYS,
    fingerprint_differences,
    fingerprint_mismatch,
    hardware_identity,
)
from .noise import (
    DEFAULT_LEVEL,
    DEFAULT_MAX_SESSIONS,
    LEVEL_FORM,
    LevelError,
    NoiseTest,
    parse_level,
    regularized_beta,
    session_test,
    student_t_isf,
    student_t_sf,
    welch_test,
)
from .setup import BUILT_IN, GateState, choose_tolerances
from .tolerances import (
    DEFAULT_TOLERANCES,
    METRICS,
    TOLERANCE_FORM,
    Metric,
    ToleranceError,
    Tolerances,
    parse_tolerances,
)
from .verdicts import (
    ANSWERS_METRIC,
    LENGTH_STATUSES,
    VERDICT_STATUSES,
    WITHIN_ONLY,
    GateReport,
    LengthVerdict,
    MetricVerdict,
    Stats,
    compare,
    compare_length,
    noise_model_words,
    session_count,
    session_key,
)

__all__ = [
    "ANSWERS_METRIC",
    "BUILT_IN",
    "GateState",
    "choose_tolerances",
    "BASELINE_FORM",
    "Baseline",
    "BaselineError",
    "BaselineInfo",
    "Calibration",
    "CalibrationRow",
    "DEFAULT_LEVEL",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_TOLERANCES",
    "FINGERPRINT_KEYS",
    "GateReport",
    "HARDWARE_KEYS",
    "HEADER_KEY",
    "HEADER_VERSION",
    "LENGTH_STATUSES",
    "LEVEL_FORM",
    "LengthVerdict",
    "LevelError",
    "METRICS",
    "Metric",
    "MetricVerdict",
    "NoiseTest",
    "Stats",
    "TOLERANCE_FORM",
    "ToleranceError",
    "Tolerances",
    "VERDICT_STATUSES",
    "WITHIN_ONLY",
    "calibrate",
    "compare",
    "compare_length",
    "fingerprint_differences",
    "fingerprint_mismatch",
    "hardware_identity",
    "keep_newest_sessions",
    "load_baseline",
    "load_baseline_file",
    "noise_model_words",
    "parse_level",
    "parse_tolerances",
    "regularized_beta",
    "session_count",
    "session_key",
    "session_test",
    "sessions_of",
    "student_t_isf",
    "student_t_sf",
    "welch_test",
    "write_baseline",
]
