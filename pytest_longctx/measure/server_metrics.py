"""vLLM's own view of a request, from two ``/metrics`` snapshots taken around it.

Only the slice of the Prometheus text exposition format that vLLM emits is parsed: samples
``name{label="value",...} value [timestamp]``, ``# HELP``/``# TYPE`` comments, escaped label
values. A metric may appear under several label sets (engine, model_name, source...): its
total is their sum. Metrics another engine lacks come out as None, never as an error.

Which tier of the KV cache served a prompt's cached tokens is read from the connector's
counters (every supported release) and the per-tier counter (vLLM 0.32.0 on): which release
exposes which is the release table's (:mod:`pytest_longctx.profiles.vllm_releases`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

TTFT = "vllm:time_to_first_token_seconds"
PREFILL = "vllm:request_prefill_time_seconds"
QUEUE = "vllm:request_queue_time_seconds"
DECODE = "vllm:request_decode_time_seconds"
INTER_TOKEN = "vllm:inter_token_latency_seconds"
E2E = "vllm:e2e_request_latency_seconds"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
#: Tokens the engine generated, counted at each step.
GENERATION_TOKENS = "vllm:generation_tokens_total"
#: Tokens each engine step computed (a histogram, observed once a step).
ITERATION_TOKENS = "vllm:iteration_tokens_total"
PROMPT_TOKENS_CACHED = "vllm:prompt_tokens_cached_total"
PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
#: Tokens the device's own prefix cache served (vLLM's KV connectors are counted apart).
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"
#: Tokens a KV connector served (vLLM's CPU offloading, LMCache, a P2P transfer), and the
#: tokens it was asked for: zero without a connector.
EXTERNAL_PREFIX_CACHE_HITS = "vllm:external_prefix_cache_hits_total"
EXTERNAL_PREFIX_CACHE_QUERIES = "vllm:external_prefix_cache_queries_total"
#: Cached prompt tokens per tier, label ``source``: ``device``, ``host``, ``p2p``, ``disk``,
#: ``external_unspecified`` (vLLM 0.32 on; device + the rest = prefix + external hits).
PROMPT_TOKENS_CACHED_BY_SOURCE = "vllm:prompt_tokens_cached_by_source_total"
#: ``server_view`` keys of the per-tier counts: ``cached_tokens_host`` and so on.
CACHED_BY_SOURCE_KEY = "cached_tokens_"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
#: Share of the KV cache's blocks in use (0..1): rises with every prefill chunk.
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
#: Requests the scheduler runs now, and those waiting for a slot (gauges).
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"
#: Requests the scheduler preempted (their KV freed, recomputed later), a counter.
PREEMPTIONS = "vllm:num_preemptions_total"


class ExpositionError(ValueError):
    """A line that is not a Prometheus sample."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def parse_exposition(text: str) -> list[Sample]:
    """Every sample in ``text``; raises :class:`ExpositionError` naming the bad line."""
    samples = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            samples.append(_parse_sample(line))
        except ExpositionError as exc:
            raise ExpositionError(f"/metrics line {number}: {exc}: {line[:200]!r}") from None
    return samples


def _parse_sample(line: str) -> Sample:
    brace = line.find("{")
    space = line.find(" ")
    labels: dict[str, str] = {}
    if brace != -1 and (space == -1 or brace < space):
        name = line[:brace]
        labels, rest = _parse_labels(line, brace + 1)
    else:
        if space == -1:
            raise ExpositionError("a sample needs a name and a value")
        name, rest = line[:space], line[space:]
    parts = rest.split()
    if not name or not parts or len(parts) > 2:
        raise ExpositionError("expected 'name{labels} value [timestamp]'")
    try:
        value = float(parts[0])  # float() reads +Inf, -Inf and NaN as Prometheus writes them
    except ValueError:
        raise ExpositionError(f"value {parts[0]!r} is not a number") from None
    return Sample(name=name, labels=labels, value=value)


def _parse_labels(line: str, position: int) -> tuple[dict[str, str], str]:
    """Labels from just after ``{``; values may hold commas, braces and escaped quotes."""
    labels: dict[str, str] = {}
    while True:
        while position < len(line) and line[position] in " ,":
            position += 1
        if position < len(line) and line[position] == "}":
            return labels, line[position + 1 :]
        equals = line.find("=", position)
        if equals == -1 or equals + 1 >= len(line) or line[equals + 1] != '"':
            raise ExpositionError('expected label="value"')
        key = line[position:equals].strip()
        position = equals + 2
        value = []
        while True:
            if position >= len(line):
                raise ExpositionError(f"label {key!r} has an unterminated value")
            char = line[position]
            if char == "\\" and position + 1 < len(line):
                escaped = line[position + 1]
                value.append({"n": "\n", "\\": "\\", '"': '"'}.get(escaped, "\\" + escaped))
                position += 2
            elif char == '"':
                position += 1
                break
            else:
                value.append(char)
                position += 1
        labels[key] = "".join(value)


@dataclass(frozen=True)
class MetricsSnapshot:
    """One ``/metrics`` read; ``taken_at`` is the caller's clock (perf_counter or unix)."""

    samples: tuple[Sample, ...] = field(repr=False)
    taken_at: float | None = None

    @classmethod
    def from_text(cls, text: str, taken_at: float | None = None) -> MetricsSnapshot:
        return cls(samples=tuple(parse_exposition(text)), taken_at=taken_at)

    def total(self, name: str, where: Mapping[str, str] | None = None) -> float | None:
        """Sum of ``name`` over its label sets (those matching ``where``); None if absent."""
        values = [
            sample.value
            for sample in self.samples
            if sample.name == name
            and (where is None or all(sample.labels.get(k) == v for k, v in where.items()))
        ]
        return math.fsum(values) if values else None

    def buckets(self, name: str) -> tuple[tuple[float, float], ...]:
        """A histogram's cumulative buckets ``(le, count)``, summed over its label sets and
        sorted by bound (``+Inf`` last); empty when the server has no such histogram."""
        counts: dict[float, float] = {}
        for sample in self.samples:
            if sample.name == f"{name}_bucket" and "le" in sample.labels:
                try:
                    bound = float(sample.labels["le"])
                except ValueError:
                    continue
                counts[bound] = counts.get(bound, 0.0) + sample.value
        return tuple(sorted(counts.items()))

    def labels_of(self, name: str) -> dict[str, str] | None:
        """Labels of the first ``name`` sample: how info-style metrics carry their data."""
        for sample in self.samples:
            if sample.name == name:
                return dict(sample.labels)
        return None


def cache_config_labels(snapshot: MetricsSnapshot | str) -> dict[str, str] | None:
    """``vllm:cache_config_info``'s labels (block_size, num_gpu_blocks, ...), or None."""
    if isinstance(snapshot, str):
        snapshot = MetricsSnapshot.from_text(snapshot)
    return snapshot.labels_of(CACHE_CONFIG_INFO)


def kv_capacity_tokens(labels: Mapping[str, str] | None) -> int | None:
    """Tokens the KV cache holds at full usage, from ``vllm:cache_config_info``'s labels.

    vLLM's usage gauge is ``1 - free / (num_gpu_blocks - 1)`` (one block is its null block),
    so its capacity in tokens is ``(num_gpu_blocks - 1) * block_size``; without those labels,
    ``kv_cache_size_tokens``. None when neither is there.
    """
    if not labels:
        return None
    try:
        blocks, block = int(labels["num_gpu_blocks"]), int(labels["block_size"])
    except (KeyError, ValueError):
        blocks = block = 0
    if blocks > 1 and block > 0:
        return (blocks - 1) * block
    try:
        size = int(labels["kv_cache_size_tokens"])
    except (KeyError, ValueError):
        return None
    return size if size > 0 else None


def _positive_label(labels: Mapping[str, str] | None, key: str, least: int) -> int | None:
    try:
        value = int((labels or {})[key])
    except (KeyError, ValueError):
        return None
    return value if value >= least else None


def kv_num_blocks(labels: Mapping[str, str] | None) -> int | None:
    """``num_gpu_blocks`` of ``vllm:cache_config_info`` (its null block included), or None."""
    return _positive_label(labels, "num_gpu_blocks", 2)


def kv_block_size(labels: Mapping[str, str] | None) -> int | None:
    return _positive_label(labels, "block_size", 1)


def bucket_delta(
    before: MetricsSnapshot, after: MetricsSnapshot, name: str
) -> tuple[tuple[float, float], ...]:
    """How many observations fell in each bucket between two reads: ``(le, count)`` per
    bucket, no longer cumulative (``(lower, le]``); empty when either read lacks it."""
    old, new = dict(before.buckets(name)), after.buckets(name)
    if not old or not new:
        return ()
    cumulative = [(bound, count - old.get(bound, 0.0)) for bound, count in new]
    return tuple(
        (bound, count - (cumulative[index - 1][1] if index else 0.0))
        for index, (bound, count) in enumerate(cumulative)
    )


def kv_gauge(text: str) -> tuple[float | None, dict[str, str] | None]:
    """The KV usage gauge (summed over engines) and the cache config labels, reading only
    their lines: a sampler calls this every second during a measurement, and parsing the
    whole exposition would hold the interpreter longer than it has to."""
    wanted = [
        line for line in text.splitlines() if line.startswith(("vllm:kv_cache", "vllm:cache"))
    ]
    snapshot = MetricsSnapshot.from_text("\n".join(wanted))
    return snapshot.total(KV_CACHE_USAGE), snapshot.labels_of(CACHE_CONFIG_INFO)


@dataclass(frozen=True)
class ServerSideView:
    """What the server counted between two snapshots; None where it exposes nothing.

    Times are sums over the requests in between (``requests``), so with one request at a time
    they are that request's figures. A negative delta (the server restarted) is also None.
    """

    requests: float | None  # TTFT histogram _count delta
    server_ttft_s: float | None
    server_prefill_s: float | None
    server_queue_s: float | None
    server_decode_s: float | None
    server_inter_token_s: float | None  # sum of vLLM's inter-token latencies
    server_e2e_s: float | None
    prompt_tokens: float | None
    cached_prompt_tokens: float | None
    prefix_cache_hits: float | None  # tokens found in the prefix cache
    prefix_cache_queries: float | None  # tokens looked up
    #: Tokens a KV connector served and was asked for (vLLM 0.25.1 on).
    external_prefix_cache_hits: float | None = None
    external_prefix_cache_queries: float | None = None
    #: Cached tokens per tier (``device``, ``host``, ...; vLLM 0.32 on), empty where absent.
    cached_by_source: Mapping[str, float] = field(default_factory=dict)

    def figures(self) -> dict[str, float]:
        """Times under the names of :data:`pytest_longctx.core.records.FIGURE_UNITS`."""
        values = {
            "server_ttft": self.server_ttft_s,
            "server_prefill": self.server_prefill_s,
            "server_queue": self.server_queue_s,
            "server_decode": self.server_decode_s,
        }
        return {name: value for name, value in values.items() if value is not None}

    def counters(self) -> dict[str, float]:
        """Counts for ``Record.server_metrics``."""
        values = {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "prefix_cache_hits": self.prefix_cache_hits,
            "prefix_cache_queries": self.prefix_cache_queries,
            "external_prefix_cache_hits": self.external_prefix_cache_hits,
            "external_prefix_cache_queries": self.external_prefix_cache_queries,
            **{CACHED_BY_SOURCE_KEY + tier: v for tier, v in self.cached_by_source.items()},
            "server_inter_token_sum": self.server_inter_token_s,
            "server_e2e": self.server_e2e_s,
        }
        return {name: value for name, value in values.items() if value is not None}


def delta(before: MetricsSnapshot, after: MetricsSnapshot) -> ServerSideView:
    """``after - before`` for every metric the view names."""

    def change(name: str, where: Mapping[str, str] | None = None) -> float | None:
        old, new = before.total(name, where), after.total(name, where)
        if new is None:
            return None
        difference = new - (old or 0.0)
        return difference if difference >= 0 else None

    cached = change(PROMPT_TOKENS_CACHED)
    if cached is None:
        cached = change(PROMPT_TOKENS_BY_SOURCE, {"source": "local_cache_hit"})
    tiers = dict.fromkeys(
        sample.labels["source"]
        for sample in after.samples
        if sample.name == PROMPT_TOKENS_CACHED_BY_SOURCE and "source" in sample.labels
    )
    by_source = {
        tier: tokens
        for tier in tiers
        if (tokens := change(PROMPT_TOKENS_CACHED_BY_SOURCE, {"source": tier})) is not None
    }
    return ServerSideView(
        requests=change(f"{TTFT}_count"),
        server_ttft_s=change(f"{TTFT}_sum"),
        server_prefill_s=change(f"{PREFILL}_sum"),
        server_queue_s=change(f"{QUEUE}_sum"),
        server_decode_s=change(f"{DECODE}_sum"),
        server_inter_token_s=change(f"{INTER_TOKEN}_sum"),
        server_e2e_s=change(f"{E2E}_sum"),
        prompt_tokens=change(PROMPT_TOKENS),
        cached_prompt_tokens=cached,
        prefix_cache_hits=change(PREFIX_CACHE_HITS),
        prefix_cache_queries=change(PREFIX_CACHE_QUERIES),
        external_prefix_cache_hits=change(EXTERNAL_PREFIX_CACHE_HITS),
        external_prefix_cache_queries=change(EXTERNAL_PREFIX_CACHE_QUERIES),
        cached_by_source=by_source,
    )
