"""Options and ini keys, read once and validated into one frozen object.

Every option also exists as an ini key of the same name with underscores (``--longctx-to`` ->
``longctx_to``); the command line wins. Errors name the option and the accepted form.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from .sizes import ACCEPTED_FORM, SizeError, parse_size

ORDERS = ("pass", "length")
PROMPT_FORMATS = ("ids", "text")


@dataclass(frozen=True)
class OptionSpec:
    name: str  # without the leading dashes
    help: str
    metavar: str | None = None
    flag: bool = False
    ini: bool = True

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
        "attach to a running OpenAI-compatible server instead of launching one",
        "URL",
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


@dataclass(frozen=True)
class Settings:
    from_length: int | None
    to_length: int | None
    repeats: int
    order: str
    profile: str
    url: str | None
    api_key_env: str | None
    output: Path
    decode_tokens: int | None
    ttft_timeout_s: float | None
    prompt_format: str
    seed: int
    baseline: Path | None
    tolerance: str | None
    baseline_force: bool
    plan_only: bool
    resume: str | None
    allow_unverified: bool = False
    gate_level: float = 0.01


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
    from .gate import DEFAULT_LEVEL, LevelError, parse_level

    if value in (None, ""):
        return DEFAULT_LEVEL
    try:
        return parse_level(value)
    except LevelError as exc:
        raise pytest.UsageError(str(exc)) from None


def read_settings(config: pytest.Config) -> Settings:
    """Validate every option before collection, so bad input never becomes a traceback."""
    raw = {spec.name: _raw(config, spec) for spec in OPTIONS}

    def size(name: str) -> int | None:
        value = raw[name]
        if value in (None, ""):
            return None
        try:
            return parse_size(str(value))
        except SizeError:
            raise _fail(name, value, ACCEPTED_FORM) from None

    def positive_int(name: str, default: int | None, minimum: int = 1) -> int | None:
        value = raw[name]
        if value in (None, ""):
            return default
        text = str(value).strip()
        if not text.isdigit() or int(text) < minimum:
            raise _fail(name, value, f"a whole number >= {minimum}")
        return int(text)

    def choice(name: str, choices: tuple[str, ...], default: str) -> str:
        value = raw[name]
        if value in (None, ""):
            return default
        if str(value) not in choices:
            raise _fail(name, value, " or ".join(repr(c) for c in choices))
        return str(value)

    def flag(name: str) -> bool:
        value = raw[name]
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "on")
        return bool(value)

    from_length, to_length = size("longctx-from"), size("longctx-to")
    if from_length is not None and to_length is not None and from_length > to_length:
        raise pytest.UsageError(
            f"--longctx-from={raw['longctx-from']} is above --longctx-to={raw['longctx-to']}: "
            "expected FROM <= TO"
        )
    timeout = raw["longctx-ttft-timeout"]
    ttft_timeout_s = None
    if timeout not in (None, ""):
        try:
            ttft_timeout_s = float(str(timeout))
        except ValueError:
            ttft_timeout_s = -1.0
        if not ttft_timeout_s > 0:
            raise _fail("longctx-ttft-timeout", timeout, "a number of seconds > 0")
    url = raw["longctx-url"]
    if url and not str(url).startswith(("http://", "https://")):
        raise _fail("longctx-url", url, "an http:// or https:// URL such as http://127.0.0.1:8000")
    baseline = raw["longctx-baseline"]
    resume = config.getoption("longctx_resume", None)
    return Settings(
        from_length=from_length,
        to_length=to_length,
        repeats=positive_int("longctx-repeats", 1) or 1,
        order=choice("longctx-order", ORDERS, "pass"),
        profile=str(raw["longctx-profile"] or "cpu-tiny"),
        url=str(url).rstrip("/") if url else None,
        api_key_env=str(raw["longctx-api-key-env"]) if raw["longctx-api-key-env"] else None,
        output=Path(str(raw["longctx-output"] or "reports")),
        decode_tokens=positive_int("longctx-decode-tokens", None, minimum=2),
        ttft_timeout_s=ttft_timeout_s,
        prompt_format=choice("longctx-prompt-format", PROMPT_FORMATS, "ids"),
        seed=positive_int("longctx-seed", 0, minimum=0) or 0,
        baseline=Path(str(baseline)) if baseline else None,
        tolerance=str(raw["longctx-tolerance"]) if raw["longctx-tolerance"] else None,
        baseline_force=flag("longctx-baseline-force"),
        plan_only=bool(config.getoption("longctx_plan", False)),
        resume=str(resume) if resume else None,
        allow_unverified=flag("longctx-allow-unverified"),
        gate_level=_gate_level(raw["longctx-gate-level"]),
    )
