"""Options and ini keys, read once and validated into one frozen object.

Every option also exists as an ini key of the same name with underscores (``--longctx-to`` ->
``longctx_to``); the command line wins. Errors name the option and the accepted form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_longctx.core.sizes import ACCEPTED_FORM, SizeError, parse_size
from pytest_longctx.plan.settings import Settings
from pytest_longctx.profiles import DEFAULT_PROFILE

ORDERS = ("pass", "length")
PROMPT_FORMATS = ("ids", "text")
PROGRESS_MODES = ("auto", "line", "plain", "off")
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
        "serving profile: a shipped name or a .toml path (default cpu-tiny)",
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
        "longctx-ttft-timeout",
        "seconds allowed for the first token, overriding the budget grown from measured points",
        "SECONDS",
    ),
    OptionSpec(
        "longctx-prompt-format", "send prompts as token 'ids' (default) or 'text'", "ids|text"
    ),
    OptionSpec("longctx-seed", "seed of the prompt text (default 0)", "N"),
    OptionSpec("longctx-baseline", "run folder or results.jsonl to gate against", "PATH"),
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


RESUME_FLAG = "--longctx-resume"


def attach_resume_value(args: list[str]) -> None:
    """Give a bare ``--longctx-resume`` its value, ``latest``, in place.

    The option takes an optional run id, and argparse would read the next argument as that
    id: ``--longctx-resume tests/test_sweep.py`` would resume a run named after the test file
    and collect everything else. A run id is only ever given attached (``=RUN_ID``).
    """
    for index, arg in enumerate(args):
        if arg == "--":
            return
        if arg == RESUME_FLAG:
            args[index] = f"{RESUME_FLAG}=latest"


def _raw(config: pytest.Config, spec: OptionSpec) -> object:
    value = config.getoption(spec.dest, None)
    if value in (None, False) and spec.ini:
        ini = config.getini(spec.dest)
        if ini not in (None, "", []):
            return ini
    return value


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
        value = self.values[name]
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "on")
        return bool(value)

    def seconds(self, name: str) -> float | None:
        if not self.given(name):
            return None
        try:
            value = float(str(self.values[name]))
        except ValueError:
            value = -1.0
        if not value > 0:
            raise _fail(name, self.values[name], "a number of seconds > 0")
        return value

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

    def duration(self, name: str, default: float, zero: bool = False) -> float:
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

    def lengths(self) -> tuple[int | None, int | None]:
        low, high = self.size("longctx-from"), self.size("longctx-to")
        if low is not None and high is not None and low > high:
            raise pytest.UsageError(
                f"--longctx-from={self.values['longctx-from']} is above "
                f"--longctx-to={self.values['longctx-to']}: expected FROM <= TO"
            )
        return low, high


def read_settings(config: pytest.Config) -> Settings:
    """Validate every option before collection, so bad input never becomes a traceback."""
    raw = _RawOptions({spec.name: _raw(config, spec) for spec in OPTIONS})
    from_length, to_length = raw.lengths()
    baseline, resume = raw.text("longctx-baseline"), config.getoption("longctx_resume", None)
    return Settings(
        from_length=from_length,
        to_length=to_length,
        repeats=raw.whole("longctx-repeats", 1) or 1,
        order=raw.choice("longctx-order", ORDERS, "pass"),
        profile=raw.text("longctx-profile", DEFAULT_PROFILE) or DEFAULT_PROFILE,
        urls=raw.urls("longctx-url"),
        api_key_env=raw.text("longctx-api-key-env"),
        output=Path(raw.text("longctx-output", "reports") or "reports"),
        decode_tokens=raw.whole("longctx-decode-tokens", None, minimum=2),
        ttft_timeout_s=raw.seconds("longctx-ttft-timeout"),
        prompt_format=raw.choice("longctx-prompt-format", PROMPT_FORMATS, "ids"),
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
        max_relaunches=raw.whole("longctx-max-relaunches", 3, minimum=0) or 0,
        max_crashes_per_length=raw.whole("longctx-max-crashes-per-length", 2) or 2,
        reattach_timeout_s=raw.duration("longctx-reattach-timeout", 60.0, zero=True),
        tcp_keepalive_s=raw.duration("longctx-tcp-keepalive", 15.0, zero=True),
        sse_keep_alive_s=_whole_seconds(raw, "longctx-sse-keep-alive", 30),
    )


def _whole_seconds(raw: _RawOptions, name: str, default: int) -> int:
    """A duration vLLM takes as whole seconds."""
    value = raw.duration(name, float(default), zero=True)
    if value != int(value):
        raise _fail(name, raw.values[name], "a duration of whole seconds such as 30s or 2m")
    return int(value)
