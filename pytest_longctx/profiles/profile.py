"""Serving profiles: TOML files that say what to serve, how, on what, and over which range."""

from __future__ import annotations

import difflib
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_longctx.core.sizes import SizeError, parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PROFILE_DIR = Path(__file__).parent / "shipped"
#: What a session that names no profile and launches its server measures: the embedded model.
DEFAULT_PROFILE = "cpu-tiny"
EMBEDDED_PREFIX = "embedded:"
#: The name a session attached without a profile goes by in the plan and the reports (its
#: records say ``"profile": null`` and where their settings came from).
NO_PROFILE = "none"
#: How the plan, the header and the records name such a session's settings.
FROM_SERVER = "attached, no profile: settings from the server"


class ProfileError(ValueError):
    """A profile that cannot be found or read; the message names the file and the key."""


@dataclass(frozen=True)
class ModelSpec:
    source: str  # a hub id, a local folder, or "embedded:NAME"
    revision: str | None = None  # the commit or tag to serve; pin it, the records name it
    tokenizer: str | None = None  # a tokenizer other than the model's own
    served_name: str | None = None  # vLLM's --served-model-name
    trust_remote_code: bool = False  # vLLM's --trust-remote-code
    weights_bytes: int | None = None  # the checkpoint's size: the plan counts it per rank
    #: A copy of the checkpoint's config.json, so the capacity plan needs no download.
    config: Path | None = None
    #: Fixed memory the KV-cache plot compares against (label -> bytes), e.g. the checkpoint.
    memory_marks: Mapping[str, int] = field(default_factory=dict)

    @property
    def embedded_name(self) -> str | None:
        if self.source.startswith(EMBEDDED_PREFIX):
            return self.source[len(EMBEDDED_PREFIX) :]
        return None


@dataclass(frozen=True)
class ServingSpec:
    device: str = "cuda"  # cpu, cuda or rocm
    dtype: str = "auto"  # vLLM's --dtype
    kv_cache_dtype: str = "auto"  # vLLM's --kv-cache-dtype, e.g. fp8_e4m3
    tensor_parallel_size: int = 1  # vLLM's --tensor-parallel-size
    data_parallel_size: int = 1  # vLLM's --data-parallel-size
    pipeline_parallel_size: int = 1  # vLLM's --pipeline-parallel-size (stages over nodes)
    #: vLLM's --decode-context-parallel-size: the KV cache sharded over this many TP ranks.
    decode_context_parallel_size: int = 1
    attention_backend: str | None = None  # vLLM's --attention-backend, e.g. FLASHMLA
    kv_cache_memory: int | None = None  # bytes, explicit cache size (required on CPU)
    gpu_memory_utilization: float | None = None  # vLLM's --gpu-memory-utilization
    #: vLLM's --max-num-seqs; unset, vLLM's own default (the sweep sends one request at a time).
    max_num_seqs: int | None = None
    enforce_eager: bool = False  # vLLM's --enforce-eager
    executor: str | None = None  # --distributed-executor-backend
    compilation_config: str | None = None  # vLLM's --compilation-config, as JSON text
    #: Any other vLLM flags; those a key owns are refused, those that shape the cache are read.
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)  # [serving.env]: the server's environment
    #: Versions the profile was measured with (``vllm = "0.32.0"``): another is warned of.
    expected_versions: Mapping[str, str] = field(default_factory=dict)
    #: ``[serving.versions_needed_from]``: the length (tokens) from which a package must be
    #: at its expected version (``aiter = "32Mi"``: its 64-bit KV addressing); another
    #: version is a plan warning naming the lengths.
    versions_needed_from: Mapping[str, int] = field(default_factory=dict)
    api_key_env: str | None = None  # the variable holding the API key (never the key)
    startup_timeout_s: float = 1800.0  # how long the server may take to answer /health


@dataclass(frozen=True)
class SweepSpec:
    from_length: int = 1024  # [sweep] from: the smallest length
    to_length: int = 64 * 1024**2  # [sweep] to: the largest length
    decode_tokens: int = 64  # tokens generated per request
    slow_from: int | None = None  # lengths from here are marked longctx_slow
    very_slow_from: int | None = None  # lengths from here are marked longctx_very_slow
    warmup_prompts: int = 3  # unmeasured requests after the server starts
    #: First-token limit before any length is measured (then it grows from measurements),
    #: where nothing is known of a length's TTFT (no record of the run, no expected_ttft).
    first_token_timeout_s: float = 6 * 3600.0
    #: Seconds to the first token expected at some lengths on this setup (a table of lengths
    #: to seconds, e.g. a study's: ``{ "1Mi" = 18.44, "64Mi" = 40171.67 }``). A length no
    #: point of the session has measured gets its first-token budget, and the plan its
    #: longest engine step, from them.
    expected_ttft: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class HardwareSpec:
    devices: int = 1  # per node
    memory_per_device: int | None = None  # bytes
    #: Nodes one server spans (vLLM's Ray executor, tensor or pipeline parallel across them).
    nodes: int = 1
    #: Bytes per device vLLM holds beyond weights and cache (activations, graphs, attention
    #: workspaces, which grow with context): the plan counts them against each point.
    reserve_per_device: int = 0


@dataclass(frozen=True)
class GateSpec:
    #: Default ``--longctx-tolerance`` spec for this profile's gate (see gate/tolerances.py).
    tolerance: str | None = None


@dataclass(frozen=True)
class ServerSettings:
    """What an attached server says of itself, for a session that chose no profile: the
    sweep's settings come from here, and the rest are the generic defaults (a profile's that
    sets nothing), never the embedded default's."""

    url: str
    model: str | None = None  # /v1/models' id
    model_root: str | None = None  # /v1/models' root: where the server loaded it from
    max_model_len: int | None = None
    #: vllm:cache_config_info's labels, where /metrics has them.
    block_size: int | None = None
    cache_dtype: str | None = None
    kv_cache_tokens: int | None = None
    kv_cache_blocks: int | None = None  # num_gpu_blocks, its null block included
    #: Why the server said nothing, when it did not answer /v1/models as the plan was made.
    unanswered: str | None = None
    #: The generic defaults the session measures with (what no option set), by name.
    generic_defaults: Mapping[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The records' ``settings``: where the settings came from, the server's and the
        generic ones."""
        server = {
            "url": self.url,
            "model": self.model,
            "model_root": self.model_root,
            "max_model_len": self.max_model_len,
            "block_size": self.block_size,
            "cache_dtype": self.cache_dtype,
            "kv_cache_tokens": self.kv_cache_tokens,
            "kv_cache_blocks": self.kv_cache_blocks,
        }
        if self.unanswered is not None:
            server["unanswered"] = self.unanswered
        return {
            "source": FROM_SERVER,
            "server": server,
            "generic_defaults": dict(self.generic_defaults),
        }


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    description: str
    model: ModelSpec
    serving: ServingSpec
    sweep: SweepSpec
    hardware: HardwareSpec
    gate: GateSpec = field(default_factory=GateSpec)
    #: Set when the session attached without choosing a profile: this one is then the
    #: generic defaults with the server's settings (:func:`from_server`), named ``none``.
    from_server: ServerSettings | None = None

    @property
    def chosen(self) -> bool:
        """Whether the user chose this profile (or the embedded default applies): False for
        the settings of an attached server."""
        return self.from_server is None


def from_server(server: ServerSettings, description: str, to_length: int | None) -> Profile:
    """The profile of a session attached without one: the model the server serves, its KV
    cache's dtype, the range up to ``to_length`` (what its max_model_len holds; None: the
    generic range) and every other setting a profile's default."""
    sweep = SweepSpec() if to_length is None else SweepSpec(to_length=to_length)
    return Profile(
        name=NO_PROFILE,
        path=Path(NO_PROFILE),
        description=description,
        model=ModelSpec(
            source=server.model or f"as {server.url} serves it", served_name=server.model
        ),
        serving=ServingSpec(kv_cache_dtype=server.cache_dtype or "auto"),
        sweep=sweep,
        hardware=HardwareSpec(),
        from_server=server,
    )


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def load_profile(name_or_path: str) -> Profile:
    """A shipped profile by name, or a user's own TOML file by path."""
    path = Path(name_or_path)
    if not (path.suffix == ".toml" or path.exists()):
        path = PROFILE_DIR / f"{name_or_path}.toml"
        if not path.exists():
            raise ProfileError(
                f"--longctx-profile={name_or_path!r}: no such profile; expected one of "
                f"{', '.join(available_profiles())} or the path of a .toml file"
            )
    elif not path.exists():
        raise ProfileError(f"--longctx-profile={name_or_path!r}: file {path} does not exist")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ProfileError(f"profile {path}: cannot read it as TOML ({exc})") from None
    return _profile_from_toml(path, data)


def _profile_from_toml(path: Path, data: Mapping[str, Any]) -> Profile:
    profile = _read_profile(path, data)
    _check_nodes(profile)
    return profile


def _check_nodes(profile: Profile) -> None:
    """A server over several nodes is vLLM's Ray executor with its ranks spread over them."""
    nodes, serving = profile.hardware.nodes, profile.serving
    if nodes == 1:
        return
    if serving.executor != "ray":
        raise ProfileError(
            f"profile {profile.path}: [hardware] nodes = {nodes} needs [serving] executor = "
            f'"ray" (vLLM serves across nodes through Ray); got {serving.executor!r}'
        )
    ranks = serving.tensor_parallel_size * serving.pipeline_parallel_size
    if ranks != nodes * profile.hardware.devices:
        raise ProfileError(
            f"profile {profile.path}: [hardware] nodes = {nodes} x devices = "
            f"{profile.hardware.devices} should equal tensor_parallel_size x "
            f"pipeline_parallel_size = {ranks}: every device of every node holds one rank"
        )


#: Every key a profile may hold, per table; tables mapped to None take any key.
PROFILE_KEYS: Mapping[str, frozenset[str] | None] = {
    "profile": frozenset({"description"}),
    "model": frozenset(
        {
            "source",
            "revision",
            "tokenizer",
            "served_name",
            "trust_remote_code",
            "weights_bytes",
            "config",
            "memory_marks",
        }
    ),
    "model.memory_marks": None,
    "serving": frozenset(
        {
            "device",
            "dtype",
            "kv_cache_dtype",
            "tensor_parallel_size",
            "data_parallel_size",
            "pipeline_parallel_size",
            "decode_context_parallel_size",
            "attention_backend",
            "kv_cache_memory",
            "gpu_memory_utilization",
            "max_num_seqs",
            "enforce_eager",
            "executor",
            "compilation_config",
            "extra_args",
            "env",
            "expected_versions",
            "versions_needed_from",
            "api_key_env",
            "startup_timeout_s",
        }
    ),
    "serving.env": None,
    "serving.expected_versions": None,
    "serving.versions_needed_from": None,
    "sweep": frozenset(
        {
            "from",
            "to",
            "decode_tokens",
            "slow_from",
            "very_slow_from",
            "warmup_prompts",
            "first_token_timeout_s",
            "expected_ttft",
        }
    ),
    "sweep.expected_ttft": None,
    "hardware": frozenset({"devices", "memory_per_device", "nodes", "reserve_per_device"}),
    "gate": frozenset({"tolerance"}),
}


def _did_you_mean(word: str, known: Any) -> str:
    close = difflib.get_close_matches(word, sorted(known), n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else ""


def _check_keys(path: Path, data: Mapping[str, Any], table: str = "") -> None:
    """Refuse a key no reader uses: a misspelt one would otherwise silently do nothing."""
    known = (
        {name for name in PROFILE_KEYS if "." not in name} if not table else PROFILE_KEYS.get(table)
    )
    if known is None:
        return
    for key, value in data.items():
        name = f"{table}.{key}" if table else key
        if key not in known:
            where = f"[{table}] " if table else "top level: table "
            raise ProfileError(
                f"profile {path}: {where}{key!r} is not a known key{_did_you_mean(key, known)} "
                f"(known: {', '.join(sorted(known))})"
            )
        if isinstance(value, Mapping) and name in PROFILE_KEYS:
            _check_keys(path, value, name)


def _read_profile(path: Path, data: Mapping[str, Any]) -> Profile:
    _check_keys(path, data)
    reader = _Reader(path, data)
    serving = reader.table("serving")
    expected = {str(k): str(v) for k, v in dict(serving.get("expected_versions", {})).items()}
    needed = {
        str(package): reader.size_value("serving.versions_needed_from", package, value)
        for package, value in dict(serving.get("versions_needed_from", {})).items()
    }
    for package in needed:
        if package not in expected:
            raise ProfileError(
                f"profile {path}: [serving.versions_needed_from] {package}: name its version in "
                f'[serving.expected_versions] too ({package} = "VERSION")'
            )
    return Profile(
        name=path.stem,
        path=path,
        description=str(reader.table("profile").get("description", "")),
        model=ModelSpec(
            source=reader.required("model", "source", str),
            revision=reader.optional("model", "revision", str),
            tokenizer=reader.optional("model", "tokenizer", str),
            served_name=reader.optional("model", "served_name", str),
            trust_remote_code=reader.optional("model", "trust_remote_code", bool) or False,
            weights_bytes=reader.size("model", "weights_bytes"),
            config=_beside(path, reader.optional("model", "config", str)),
            memory_marks={
                str(label): reader.size_value("model.memory_marks", label, value)
                for label, value in dict(reader.table("model").get("memory_marks", {})).items()
            },
        ),
        serving=ServingSpec(
            device=reader.optional("serving", "device", str) or "cuda",
            dtype=reader.optional("serving", "dtype", str) or "auto",
            kv_cache_dtype=reader.optional("serving", "kv_cache_dtype", str) or "auto",
            tensor_parallel_size=reader.number("serving", "tensor_parallel_size", int, 1, 1),
            data_parallel_size=reader.number("serving", "data_parallel_size", int, 1, 1),
            pipeline_parallel_size=reader.number("serving", "pipeline_parallel_size", int, 1, 1),
            decode_context_parallel_size=reader.number(
                "serving", "decode_context_parallel_size", int, 1, 1
            ),
            attention_backend=reader.optional("serving", "attention_backend", str),
            kv_cache_memory=reader.size("serving", "kv_cache_memory"),
            gpu_memory_utilization=reader.optional("serving", "gpu_memory_utilization", float),
            max_num_seqs=reader.optional("serving", "max_num_seqs", int),
            enforce_eager=reader.optional("serving", "enforce_eager", bool) or False,
            executor=reader.optional("serving", "executor", str),
            compilation_config=reader.optional("serving", "compilation_config", str),
            extra_args=tuple(str(a) for a in serving.get("extra_args", ())),
            env={str(k): str(v) for k, v in dict(serving.get("env", {})).items()},
            expected_versions=expected,
            versions_needed_from=needed,
            api_key_env=reader.optional("serving", "api_key_env", str),
            startup_timeout_s=reader.number("serving", "startup_timeout_s", float, 1800.0, 1.0),
        ),
        sweep=SweepSpec(
            # Sizes are positive or refused (parse_size), so "or" only fills in absent keys.
            from_length=reader.size("sweep", "from") or 1024,
            to_length=reader.size("sweep", "to") or 64 * 1024**2,
            decode_tokens=reader.number("sweep", "decode_tokens", int, 64, 2),
            slow_from=reader.size("sweep", "slow_from"),
            very_slow_from=reader.size("sweep", "very_slow_from"),
            warmup_prompts=reader.number("sweep", "warmup_prompts", int, 3, 0),
            first_token_timeout_s=reader.number(
                "sweep", "first_token_timeout_s", float, 6 * 3600.0, 0.001
            ),
            expected_ttft=reader.seconds_by_length("sweep", "expected_ttft"),
        ),
        hardware=HardwareSpec(
            devices=reader.number("hardware", "devices", int, 1, 1),
            memory_per_device=reader.size("hardware", "memory_per_device"),
            nodes=reader.number("hardware", "nodes", int, 1, 1),
            reserve_per_device=reader.size("hardware", "reserve_per_device") or 0,
        ),
        gate=GateSpec(tolerance=reader.optional("gate", "tolerance", str)),
    )


def _beside(profile_path: Path, name: str | None) -> Path | None:
    """A relative path in a profile is relative to it; shipped data lives in ../data."""
    if name is None:
        return None
    for base in (profile_path.parent, PROFILE_DIR.parent / "data"):
        candidate = (base / name).resolve()
        if candidate.exists():
            return candidate
    raise ProfileError(f"profile {profile_path}: [model] config = {name!r} does not exist")


@dataclass(frozen=True)
class _Reader:
    path: Path
    data: Mapping[str, Any]

    def table(self, name: str) -> Mapping[str, Any]:
        value = self.data.get(name, {})
        if not isinstance(value, Mapping):
            raise ProfileError(f"profile {self.path}: [{name}] must be a table")
        return value

    def optional(self, table: str, key: str, kind: type) -> Any:
        value = self.table(table).get(key)
        if value is None:
            return None
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ProfileError(
                f"profile {self.path}: [{table}] {key} = {value!r} must be a {kind.__name__}"
            )
        return value

    def number(self, table: str, key: str, kind: type, default: Any, minimum: Any) -> Any:
        """A number that is honoured as written, 0 included, or refused below ``minimum``."""
        value = self.optional(table, key, kind)
        if value is None:
            return default
        if value < minimum:
            raise ProfileError(
                f"profile {self.path}: [{table}] {key} = {value!r} must be >= {minimum}"
            )
        return value

    def required(self, table: str, key: str, kind: type) -> Any:
        value = self.optional(table, key, kind)
        if value is None:
            raise ProfileError(f"profile {self.path}: [{table}] {key} is required")
        return value

    def size(self, table: str, key: str) -> int | None:
        value = self.table(table).get(key)
        return None if value is None else self.size_value(table, key, value)

    def seconds_by_length(self, table: str, key: str) -> dict[int, float]:
        """A table of lengths to positive seconds (``{ "64Mi" = 40171.67 }``)."""
        value = self.table(table).get(key, {})
        form = 'a table of lengths to seconds, e.g. { "1Mi" = 18.44, "64Mi" = 40171.67 }'
        if not isinstance(value, Mapping):
            raise ProfileError(f"profile {self.path}: [{table}] {key} must be {form}")
        figures: dict[int, float] = {}
        for length, seconds in value.items():
            tokens = self.size_value(f"{table}.{key}", str(length), length)
            number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
            if not (number and math.isfinite(seconds) and seconds > 0):
                raise ProfileError(
                    f"profile {self.path}: [{table}.{key}] {length!r} = {seconds!r} must be a "
                    f"positive number of seconds ({form})"
                )
            figures[tokens] = float(seconds)
        return figures

    def size_value(self, table: str, key: str, value: Any) -> int:
        try:
            return parse_size(value)
        except SizeError as exc:
            raise ProfileError(f"profile {self.path}: [{table}] {key}: {exc}") from None
