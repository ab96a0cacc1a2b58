"""Options and ini keys: declared and parsed here, once, into plan/settings.py's frozen Settings.

Every option but ``--longctx-plan`` and ``--longctx-resume`` also exists as an ini key of the
same name with underscores (``--longctx-to`` -> ``longctx_to``); the command line wins. A flag
set in the ini file is turned off for one session by its ``--no-`` form
(``--no-longctx-allow-unverified``). Errors name the option and the accepted form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import overload

import pytest

from pytest_longctx.core.sizes import ACCEPTED_FORM, SizeError, parse_size
from pytest_longctx.gate.tolerances import parse_percent
from pytest_longctx.measure.agreement import DEFAULT_STREAM_TOLERANCE
from pytest_longctx.plan.points import (
    COLD,
    CONCURRENCY,
    DEFAULT_BACKGROUND_STREAMS,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_WARM_QUESTIONS,
    DEFAULT_WARM_SUFFIX,
    INTERFERENCE,
    WARM,
)
from pytest_longctx.plan.settings import Settings
from pytest_longctx.prompts.probe import FIDELITY_HELP, FIDELITY_MODES
from pytest_longctx.workloads import BY_NAME

ORDERS = ("pass", "length")
PROMPT_FORMATS = ("ids", "text")
PROGRESS_MODES = ("auto", "line", "plain", "off")
#: A follow-up's suffix opens with its own nonce and a readable tag: room for both and text.
MIN_WARM_SUFFIX = 32
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|min|m|h)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class OptionSpec:
    name: str  # without the leading dashes
    help: str
    metavar: str | None = None
    flag: bool = False
    ini: bool = True
    #: Given several times (and comma-separated): a list.
    multiple: bool = False

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def negation(self) -> str | None:
        """``no-longctx-...``: the flag's off switch, for a flag the ini file can turn on."""
        return f"no-{self.name}" if self.flag and self.ini else None

    @property
    def default(self) -> bool | None:
        """None where "not given" must be told apart from "turned off" (an ini key decides)."""
        return False if self.flag and self.negation is None else None


OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec(
        "longctx-from",
        "smallest prompt length, rounded up to a power of two "
        "(1Ki, 64Mi, 1Gi or a token count; default: the profile's)",
        "SIZE",
    ),
    OptionSpec(
        "longctx-to",
        "largest prompt length, rounded down to a power of two (default: the profile's)",
        "SIZE",
    ),
    OptionSpec("longctx-repeats", "measured runs per length (default 1)", "N"),
    OptionSpec(
        "longctx-order",
        "'pass' runs every length once, then again (default); "
        "'length' runs a length's repeats back to back",
        "pass|length",
    ),
    OptionSpec(
        "longctx-profile",
        "serving profile: a shipped name or a .toml path (default: cpu-tiny, the embedded "
        "model, for a launched server; none for one attached with --longctx-url: the server's "
        "own settings and generic defaults)",
        "NAME|PATH",
    ),
    OptionSpec(
        "longctx-url",
        "attach to a running OpenAI-compatible server instead of launching one; give it "
        "several times or comma-separated for several servers, one per pytest-xdist worker",
        "URL",
        multiple=True,
    ),
    OptionSpec(
        "longctx-devices-per-server",
        "under pytest-xdist -n, devices each launched server gets (its own "
        "CUDA_VISIBLE_DEVICES or HIP_VISIBLE_DEVICES; default: the profile's parallel size)",
        "K",
    ),
    OptionSpec(
        "longctx-allow-mixed-servers",
        "keep points from servers whose fingerprints differ (model, vLLM version, hardware) "
        "in one run",
        flag=True,
    ),
    OptionSpec(
        "longctx-api-key-env",
        "name of the environment variable holding the server's API key (never the key itself)",
        "VAR",
    ),
    OptionSpec("longctx-output", "root folder of run outputs (default reports)", "DIR"),
    OptionSpec(
        "longctx-decode-tokens", "tokens generated per request (default: the profile's)", "N"
    ),
    OptionSpec(
        "longctx-plots",
        "draw the reports' PNG plots (default on); off writes report.md, report.html and "
        "benchmark.json without them, for a session that only measures or gates",
        "on|off",
    ),
    OptionSpec(
        "longctx-warmup-prompts",
        "unmeasured requests sent before the first point (default: the profile's); the last "
        "shows how the server streams, so with 0 the run's fingerprint has no stream figures",
        "N",
    ),
    OptionSpec(
        "longctx-ttft-timeout",
        "time allowed for the first token, e.g. 90s, 30m, 6h or plain seconds, overriding the "
        "budget grown from measured points",
        "DURATION",
    ),
    OptionSpec(
        "longctx-prompt-format", "send prompts as token 'ids' (default) or 'text'", "ids|text"
    ),
    OptionSpec("longctx-fidelity", FIDELITY_HELP, "|".join(FIDELITY_MODES)),
    OptionSpec("longctx-seed", "seed of the prompt text (default 0)", "N"),
    OptionSpec(
        "longctx-baseline",
        "what to gate against: a baseline file (python -m pytest_longctx baseline or "
        "calibrate writes it), a results.jsonl or its run folder",
        "PATH",
    ),
    OptionSpec(
        "longctx-tolerance",
        "allowed change in the bad direction, e.g. ttft=10%,decode=5%,64Ki:ttft=20%",
        "SPEC",
    ),
    OptionSpec("longctx-baseline-force", "compare even when fingerprints differ", flag=True),
    OptionSpec(
        "longctx-allow-unverified",
        "keep points whose cold prefill and one-request checks could not run because the "
        "server's /metrics is unreadable (recorded in the fingerprint and the reports)",
        flag=True,
    ),
    OptionSpec(
        "longctx-stream-tolerance",
        "how far a point's decode rate from the stream may stray from the server's own, and "
        "what share of its tokens may arrive ahead of the server's decode in one burst, in "
        "percent (default 50%)",
        "PERCENT",
    ),
    OptionSpec(
        "longctx-strict-stream",
        "fail points whose stream disagrees with the server's decode (a burst, a rate off the "
        "server's), which by default keep the server's decode throughput, or their TTFT alone",
        flag=True,
    ),
    OptionSpec(
        "longctx-allow-unconfirmed",
        "keep and gate the background figures (bg_*, the stall) of interference points whose "
        "background streams' gaps the server's own figures refute (its inter-token histogram, "
        "its timing of each request); by default such a point passes with them set aside, "
        "recorded but neither reported nor gated (--longctx-strict-stream fails it)",
        flag=True,
    ),
    OptionSpec(
        "longctx-allow-bursts",
        "now the default (accepted as before); --no-longctx-allow-bursts: --longctx-strict-stream",
        flag=True,
    ),
    OptionSpec(
        "longctx-workload",
        "what each length measures, comma-separated: 'cold' (a cold prefill per point; "
        "default), 'warm' with cold (then follow-up questions on the same prefix, served from "
        "the cache), 'interference' (the prefill on a server that also carries background "
        "streams, and what it costs them), 'concurrency' (c cold prompts of each length sent "
        "at once: how many fit the KV cache, and what each decodes)",
        "cold|cold,warm|interference|cold,interference|concurrency",
    ),
    OptionSpec(
        "longctx-max-concurrency",
        "with --longctx-workload=...concurrency: the highest level, requests of one length "
        "sent at once (levels 1, 2, 4, ... and the plan's fit and one past it; default "
        f"{DEFAULT_MAX_CONCURRENCY})",
        "N",
    ),
    OptionSpec(
        "longctx-warm-questions",
        "with --longctx-workload=cold,warm: follow-up questions after each cold point "
        f"(default {DEFAULT_WARM_QUESTIONS})",
        "Q",
    ),
    OptionSpec(
        "longctx-warm-suffix",
        "with --longctx-workload=cold,warm: new tokens each follow-up appends to the cold "
        f"point's prompt (default {DEFAULT_WARM_SUFFIX}; 256, 1Ki)",
        "SIZE",
    ),
    OptionSpec(
        "longctx-background-streams",
        "with --longctx-workload=...interference: short background streams running beside "
        f"each interference point's long prompt (default {DEFAULT_BACKGROUND_STREAMS})",
        "K",
    ),
    OptionSpec(
        "longctx-max-num-batched-tokens",
        "with --longctx-workload=...interference: vLLM's --max-num-batched-tokens (the "
        "prefill chunk) for the launched server of the interference points; one value per "
        "run, compared across runs with `python -m pytest_longctx compare` (default: the "
        "profile's)",
        "N",
    ),
    OptionSpec(
        "longctx-gate-level",
        "one-sided false-alarm level of the gate's noise test, a probability below 0.5 "
        "(default 0.01)",
        "P",
    ),
    OptionSpec(
        "longctx-progress",
        "progress inside each point: 'auto' (a live line on a terminal, plain lines without "
        "one; default), 'line', 'plain' or 'off' (prints nothing; progress.json is still "
        "written)",
        "auto|line|plain|off",
    ),
    OptionSpec(
        "longctx-progress-interval",
        "time between progress samples of the server's KV usage and the devices inside a "
        "point, e.g. 1s, 500ms (default 1s); 0 samples nothing",
        "DURATION",
    ),
    OptionSpec(
        "longctx-progress-throttle",
        "least time between two plain progress lines of one point (default 1m)",
        "DURATION",
    ),
    OptionSpec(
        "longctx-max-relaunches",
        "times a session starts its launched server again after it died or hung (default 3; "
        "0 never)",
        "N",
    ),
    OptionSpec(
        "longctx-max-crashes-per-length",
        "crashes one length may cause before its remaining repeats are skipped (default 2)",
        "N",
    ),
    OptionSpec(
        "longctx-reattach-timeout",
        "how long to wait for an attached server that stopped answering to answer again, "
        "e.g. 60s, 10m (default 60s; 0 fails its points at once)",
        "DURATION",
    ),
    OptionSpec(
        "longctx-tcp-keepalive",
        "TCP keepalive probe interval on the measured connection, so a NAT or load balancer "
        "keeps a silent prefill's connection (default 15s; 0 off)",
        "DURATION",
    ),
    OptionSpec(
        "longctx-sse-keep-alive",
        "vLLM's --sse-keep-alive-interval for launched servers: a comment on an idle stream "
        "every so often, for HTTP proxies' idle timers (whole seconds, default 30s; 0 off)",
        "DURATION",
    ),
    OptionSpec(
        "longctx-plan",
        "print the points, capacity and server command, then exit",
        flag=True,
        ini=False,
    ),
)


#: The shipped sweep, as ``--pyargs`` names it.
SHIPPED_SUITE = "pytest_longctx.suite"


#: What pytest reads as an ini file's boolean (``_pytest.config._strtobool``), any case.
INI_TRUTH = (
    "true or false (in an ini file also 1/0, yes/no, on/off, y/n, t/f; in pyproject.toml's "
    "[tool.pytest] table, true or false unquoted)"
)


def _ini_value(config: pytest.Config, spec: OptionSpec) -> object:
    """The ini key's value, or None where the project's configuration does not set it."""
    if not spec.ini:
        return None
    try:
        value = config.getini(spec.dest)
    except (ValueError, TypeError, pytest.UsageError) as exc:  # naming no key, no option
        if not spec.flag:
            raise
        raise pytest.UsageError(
            f"{spec.dest} in {config.inipath or 'the ini file'} (--{spec.name}): {exc}; "
            f"expected {INI_TRUTH}"
        ) from None
    return None if value in (None, "", []) else value


def _raw(config: pytest.Config, spec: OptionSpec) -> object:
    value = config.getoption(spec.dest, None)
    if value is None:  # not on the command line (a flag's --no- form gives False)
        ini = _ini_value(config, spec)
        if ini is not None:
            return ini
    return value


def asks_for_sweep(config: pytest.Config) -> bool:
    """Whether the session names the sweep before anything is collected: a ``--longctx-*``
    option on the command line, a ``longctx_*`` key in the project's configuration, or the
    shipped sweep given by name. Only such a session gets the sweep's report header; any
    other stays as it would be without the plugin until it collects a sweep item."""
    if config.getoption("longctx_resume", None) is not None:
        return True
    for spec in OPTIONS:
        if config.getoption(spec.dest, None) not in (None, spec.default):
            return True
        if _ini_value(config, spec) is not None:
            return True
    args = config.invocation_params.args
    return any(str(arg).split("::", 1)[0] == SHIPPED_SUITE for arg in args)


def _fail(spec_name: str, value: object, accepted: str) -> pytest.UsageError:
    return pytest.UsageError(f"--{spec_name}={value}: expected {accepted}")


def _gate_level(value: object) -> float:
    from pytest_longctx.gate import DEFAULT_LEVEL, LevelError, parse_level

    if value in (None, ""):
        return DEFAULT_LEVEL
    try:
        return parse_level(value)
    except LevelError as exc:
        raise pytest.UsageError(exc.for_option("--longctx-gate-level")) from None


@dataclass(frozen=True)
class _RawOptions:
    """Option and ini values as given, read into typed values with errors naming the option."""

    values: dict[str, object]
    #: What the ini file sets, by option name (the command line may override it).
    ini: dict[str, object] = field(default_factory=dict)
    #: The options whose value is the ini file's (the command line did not give them).
    from_ini: frozenset[str] = frozenset()

    def given(self, name: str) -> bool:
        return self.values[name] not in (None, "")

    def text(self, name: str, default: str | None = None) -> str | None:
        return str(self.values[name]) if self.given(name) else default

    def size(self, name: str) -> int | None:
        if not self.given(name):
            return None
        try:
            return parse_size(str(self.values[name]))
        except SizeError:
            raise _fail(name, self.values[name], ACCEPTED_FORM) from None

    def whole(self, name: str, default: int | None, minimum: int = 1) -> int | None:
        if not self.given(name):
            return default
        text = str(self.values[name]).strip()
        if not text.isdigit() or int(text) < minimum:
            raise _fail(name, self.values[name], f"a whole number >= {minimum}")
        return int(text)

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        if not self.given(name):
            return default
        if str(self.values[name]) not in choices:
            raise _fail(name, self.values[name], " or ".join(repr(c) for c in choices))
        return str(self.values[name])

    def flag(self, name: str) -> bool:
        """A switch: None (not given) is off; an ini file's text pytest already read."""
        return bool(self.values[name])

    def urls(self, name: str) -> tuple[str, ...]:
        value = self.values[name]
        given = value if isinstance(value, (list, tuple)) else [value]
        urls = [
            part.strip()
            for entry in given
            if entry
            for part in str(entry).replace(",", " ").split()
        ]
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise _fail(
                    name,
                    url,
                    "http:// or https:// URLs such as http://127.0.0.1:8000, given several "
                    "times or comma-separated",
                )
        unique = tuple(dict.fromkeys(url.rstrip("/") for url in urls))
        if len(unique) != len(urls):
            raise _fail(name, ",".join(urls), "each server's URL once")
        return unique

    def percent(self, name: str, default: float) -> float:
        """``25%`` or ``25`` as the fraction 0.25; a bare number below 1 is ambiguous."""
        if not self.given(name):
            return default
        try:
            return parse_percent(str(self.values[name]).strip()) / 100.0
        except ValueError as exc:
            raise _fail(name, self.values[name], f"a percentage such as 25% ({exc})") from None

    @overload
    def duration(self, name: str, default: float, zero: bool = False) -> float: ...

    @overload
    def duration(self, name: str, default: None, zero: bool = False) -> float | None: ...

    def duration(self, name: str, default: float | None, zero: bool = False) -> float | None:
        """``1s``, ``500ms``, ``2m``, ``1h`` or plain seconds; 0 only where ``zero``."""
        if not self.given(name):
            return default
        match = _DURATION_RE.match(str(self.values[name]))
        value = (
            float(match.group(1)) * _DURATION_UNITS[(match.group(2) or "").lower()] if match else -1
        )
        if value < 0 or (value == 0 and not zero):
            floor = ">= 0" if zero else "> 0"
            raise _fail(name, self.values[name], f"a duration {floor} such as 1s, 500ms or 2m")
        return value

    def workload(self, prompt_format: str) -> tuple[str, ...]:
        """Some of ``cold``, ``warm``, ``interference``, ``concurrency``: a warm follow-up
        needs its cold point's prefix, so ``warm`` comes with ``cold``."""
        name = "longctx-workload"
        if not self.given(name):
            return (COLD,)
        parts = _workload_parts(self.values[name])
        known = tuple(BY_NAME)
        accepted = (
            f"a comma-separated list of {', '.join(known[:-1])} and {known[-1]}, such as "
            "'cold', 'cold,warm', 'interference', 'cold,interference' or 'concurrency' "
            "(warm needs cold)"
        )
        if (
            not parts
            or any(part not in known for part in parts)
            or (WARM in parts and COLD not in parts)
        ):
            extra = (
                " (warm follow-ups reuse their cold point's prefix; select only them with -k warm)"
                if WARM in parts and COLD not in parts
                else ""
            )
            raise _fail(name, self.values[name], accepted + extra)
        chosen = tuple(w for w in known if w in parts)
        if WARM in chosen and prompt_format != "ids":
            raise pytest.UsageError(
                f"--{name}={self.values[name]} needs --longctx-prompt-format=ids: a follow-up "
                "appends token ids to its cold point's exact ids, which text would re-tokenize"
            )
        return chosen

    def of_workload(
        self, wanted: str, workload: tuple[str, ...], names: tuple[str, ...], example: str
    ) -> None:
        """Options of one workload are refused where it is not measured, as a mistake: given on
        the command line, when the session's workload lacks it; set in the ini file, when
        neither the ini file's ``longctx_workload`` nor the session's has it (an ini file that
        sets a workload and its keys stays valid for a session whose command line measures
        another)."""
        in_ini = wanted in _workload_parts(self.ini.get("longctx-workload"))
        for name in names:
            if not self.given(name) or wanted in workload:
                continue
            if name not in self.from_ini:
                given = f"--{name}={self.values[name]}"
            elif in_ini:
                continue
            else:
                given = f"{name.replace('-', '_')} = {self.values[name]} (ini file)"
            raise pytest.UsageError(
                f"{given} applies to the {wanted} workload, which this session does not measure: "
                f"add {wanted} to --longctx-workload (e.g. --longctx-workload={example}, or "
                f"longctx_workload = {example} in the ini file)"
            )

    def interference(self, workload: tuple[str, ...], attached: bool) -> tuple[int, int | None]:
        """The background streams K and the interference server's chunk; each option only
        with the interference workload, and the chunk only for a server this session
        launches."""
        streams_name, chunk_name = "longctx-background-streams", "longctx-max-num-batched-tokens"
        self.of_workload(INTERFERENCE, workload, (streams_name, chunk_name), "cold,interference")
        streams = self.whole(streams_name, DEFAULT_BACKGROUND_STREAMS) or DEFAULT_BACKGROUND_STREAMS
        chunk = self.size(chunk_name)
        if chunk is not None and attached:
            raise pytest.UsageError(
                f"--{chunk_name}={self.values[chunk_name]} sets the flag of a server this "
                "session launches; an attached server (--longctx-url) runs with its own: start "
                f"it with --max-num-batched-tokens {chunk}"
            )
        return streams, chunk

    def lengths(self) -> tuple[int | None, int | None]:
        low, high = self.size("longctx-from"), self.size("longctx-to")
        if low is not None and high is not None and low > high:
            raise pytest.UsageError(
                f"--longctx-from={self.values['longctx-from']} is above "
                f"--longctx-to={self.values['longctx-to']}: expected FROM <= TO"
            )
        return low, high


def _workload_parts(value: object) -> list[str]:
    """``cold, warm`` -> ``["cold", "warm"]``; nothing for an unset workload."""
    if value in (None, ""):
        return []
    return [part.strip() for part in str(value).split(",") if part.strip()]


def read_settings(config: pytest.Config) -> Settings:
    """Validate every option before collection, so bad input never becomes a traceback."""
    # A flag given on the command line wins without its ini value being read (a bad one there
    # must not stop a session that overrides it); other keys are read as the ini file has them.
    ini = {
        spec.name: None
        if spec.flag and config.getoption(spec.dest, None) is not None
        else _ini_value(config, spec)
        for spec in OPTIONS
    }
    raw = _RawOptions(
        {spec.name: _raw(config, spec) for spec in OPTIONS},
        {name: value for name, value in ini.items() if value is not None},
        frozenset(
            spec.name
            for spec in OPTIONS
            if ini[spec.name] is not None and config.getoption(spec.dest, None) is None
        ),
    )
    from_length, to_length = raw.lengths()
    baseline, resume = raw.text("longctx-baseline"), config.getoption("longctx_resume", None)
    prompt_format = raw.choice("longctx-prompt-format", PROMPT_FORMATS, "ids")
    suffix = raw.size("longctx-warm-suffix")
    workload = raw.workload(prompt_format)
    raw.of_workload(WARM, workload, ("longctx-warm-questions", "longctx-warm-suffix"), "cold,warm")
    streams, chunk = raw.interference(workload, attached=bool(raw.urls("longctx-url")))
    raw.of_workload(CONCURRENCY, workload, ("longctx-max-concurrency",), "cold,concurrency")
    if suffix is not None and suffix < MIN_WARM_SUFFIX:
        raise _fail(
            "longctx-warm-suffix",
            raw.values["longctx-warm-suffix"],
            f"a size of at least {MIN_WARM_SUFFIX} tokens (a question's nonce and tag come first)",
        )
    return Settings(
        from_length=from_length,
        to_length=to_length,
        repeats=raw.whole("longctx-repeats", 1) or 1,
        order=raw.choice("longctx-order", ORDERS, "pass"),
        profile=raw.text("longctx-profile"),
        urls=raw.urls("longctx-url"),
        api_key_env=raw.text("longctx-api-key-env"),
        output=Path(raw.text("longctx-output", "reports") or "reports"),
        decode_tokens=raw.whole("longctx-decode-tokens", None, minimum=2),
        warmup_prompts=raw.whole("longctx-warmup-prompts", None, minimum=0),
        plots=raw.choice("longctx-plots", ("on", "off"), "on") == "on",
        ttft_timeout_s=raw.duration("longctx-ttft-timeout", None),
        prompt_format=prompt_format,
        fidelity=raw.choice("longctx-fidelity", FIDELITY_MODES, "auto"),
        seed=raw.whole("longctx-seed", 0, minimum=0) or 0,
        baseline=Path(baseline) if baseline else None,
        tolerance=raw.text("longctx-tolerance"),
        baseline_force=raw.flag("longctx-baseline-force"),
        plan_only=bool(config.getoption("longctx_plan", False)),
        resume=str(resume) if resume else None,
        allow_unverified=raw.flag("longctx-allow-unverified"),
        gate_level=_gate_level(raw.values["longctx-gate-level"]),
        devices_per_server=raw.whole("longctx-devices-per-server", None),
        allow_mixed_servers=raw.flag("longctx-allow-mixed-servers"),
        progress=raw.choice("longctx-progress", PROGRESS_MODES, "auto"),
        progress_interval_s=raw.duration("longctx-progress-interval", 1.0, zero=True),
        progress_throttle_s=raw.duration("longctx-progress-throttle", 60.0, zero=True),
        stream_tolerance=raw.percent("longctx-stream-tolerance", DEFAULT_STREAM_TOLERANCE),
        strict_stream=_strict_stream(raw),
        allow_unconfirmed=raw.flag("longctx-allow-unconfirmed"),
        workload=workload,
        warm_questions=raw.whole("longctx-warm-questions", DEFAULT_WARM_QUESTIONS)
        or DEFAULT_WARM_QUESTIONS,
        warm_suffix=DEFAULT_WARM_SUFFIX if suffix is None else suffix,
        background_streams=streams,
        max_num_batched_tokens=chunk,
        max_concurrency=raw.whole("longctx-max-concurrency", DEFAULT_MAX_CONCURRENCY)
        or DEFAULT_MAX_CONCURRENCY,
        max_relaunches=raw.whole("longctx-max-relaunches", 3, minimum=0) or 0,
        max_crashes_per_length=raw.whole("longctx-max-crashes-per-length", 2) or 2,
        reattach_timeout_s=raw.duration("longctx-reattach-timeout", 60.0, zero=True),
        tcp_keepalive_s=raw.duration("longctx-tcp-keepalive", 15.0, zero=True),
        sse_keep_alive_s=_whole_seconds(raw, "longctx-sse-keep-alive", 30),
    )


def _strict_stream(raw: _RawOptions) -> bool:
    """``--longctx-strict-stream``, or ``--no-longctx-allow-bursts`` (the plain flag asks for
    the default); the command line wins over the ini file, the first over the second."""
    for from_ini in (False, True):
        for name, strict_when in (("longctx-strict-stream", True), ("longctx-allow-bursts", False)):
            value = raw.values[name]
            if value is not None and (name in raw.from_ini) == from_ini:
                return bool(value) == strict_when
    return False


def _whole_seconds(raw: _RawOptions, name: str, default: int) -> int:
    """A duration vLLM takes as whole seconds."""
    value = raw.duration(name, float(default), zero=True)
    if value != int(value):
        raise _fail(name, raw.values[name], "a duration of whole seconds such as 30s or 2m")
    return int(value)
