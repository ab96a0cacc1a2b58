"""One point's measurement: prompt in, checked figures out.

Checks that make a figure trustworthy are not warnings: the server must have read exactly the
prompt's tokens, produced exactly the requested completion, and served none of the prompt from
its prefix cache (a cached 8Ki prefill takes 0.1 s instead of 2.6 s on the CPU default).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from . import serving
from .client import ClientConfig, CompletionClient, CompletionRequest, MeasurementError
from .plan import Point
from .prompts import LocalTokenSource, Prompt, PromptBuilder, ServerTokenSource
from .records import Record
from .run import Run
from .server import ServerError, ServerInfo
from .server_metrics import MetricsSnapshot, ServerSideView, delta
from .timeouts import FirstTokenBudget

WARMUP_PROMPT_TOKENS = 1024
WARMUP_DECODE_TOKENS = 8


class PointFailure(AssertionError):
    """A measurement that ran but cannot be trusted; the item fails with this message."""


@dataclass(frozen=True)
class PointMeasurement:
    length: int
    requested_tokens: int
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    stream_figures: dict[str, float] = field(default_factory=dict)
    server_view: dict[str, float] = field(default_factory=dict)
    prompt_build_s: float | None = None

    def figures(self) -> dict[str, float]:
        figures = dict(self.stream_figures)
        if self.prompt_build_s is not None:
            figures["prompt_build"] = self.prompt_build_s
        for name in ("server_ttft", "server_prefill", "server_queue", "server_decode"):
            if self.server_view.get(name) is not None:
                figures[name] = self.server_view[name]
        decode_s = self.server_view.get("server_decode")
        if decode_s and self.completion_tokens > 1:
            figures["server_decode_throughput"] = (self.completion_tokens - 1) / decode_s
        return figures

    def server_metrics(self) -> dict[str, float]:
        return dict(self.server_view)

    @property
    def decode_throughput(self) -> float | None:
        return self.stream_figures.get("decode_throughput")

    @classmethod
    def from_record(cls, record: Record) -> PointMeasurement:
        """A resumed point, reported from what an earlier session measured."""
        return cls(
            length=record.length,
            requested_tokens=record.completion_tokens or 0,
            prompt_tokens=record.prompt_tokens or 0,
            completion_tokens=record.completion_tokens or 0,
            ttft_s=record.figures.get("ttft", 0.0),
            stream_figures=dict(record.figures),
            server_view=dict(record.server_metrics),
        )


def client_for(server: ServerInfo) -> CompletionClient:
    return CompletionClient(ClientConfig(base_url=server.base_url, api_key=server.api_key))


def prompt_builder(run: Run, server: ServerInfo) -> PromptBuilder:
    """The served model's tokenizer: the local copy when there is one, else the server's."""
    if run.prompt_builder is not None:
        return run.prompt_builder
    from .embedded import cache_root

    profile = run.plan.profile
    local = server.mode == "launched" or server.model_name == (
        profile.model.served_name or profile.model.source
    )
    if local:
        source: Any = LocalTokenSource(
            serving.tokenizer_location(profile, build=True),
            revision=None if profile.model.embedded_name else profile.model.revision,
            trust_remote_code=profile.model.trust_remote_code,
        )
    else:
        client = client_for(server)  # lives as long as the builder, for /tokenize
        source = ServerTokenSource(
            server.model_name,
            lambda text, special: client.tokenize(text, add_special_tokens=special),
        )
    run.prompt_builder = PromptBuilder(source, cache_root() / "prompts", seed=run.settings.seed)
    return run.prompt_builder


def build_prompt(run: Run, builder: PromptBuilder, point: Point) -> Prompt:
    tag = f"Run {run.run_id}, prompt of {point.length} tokens, pass {point.repeat}."
    return builder.build(point.length, tag, text=run.settings.prompt_format == "text")


def warm_up(run: Run, server: ServerInfo) -> None:
    """Three short prompts before the first measured point, as the reference study did.

    They are cold prompts of the smallest selected length (at most 1Ki), so the first measured
    point does not pay for the server's first allocations at that size.
    """
    length = min([p.length for p in run.selected_points] or [WARMUP_PROMPT_TOKENS])
    length = min(length, WARMUP_PROMPT_TOKENS)
    with client_for(server) as client:
        builder = prompt_builder(run, server)
        for index in range(run.plan.profile.sweep.warmup_prompts):
            prompt = builder.build(length, f"Warm-up {index + 1} of run {run.run_id}.")
            request = CompletionRequest(
                model=server.model_name, prompt=prompt.ids, decode_tokens=WARMUP_DECODE_TOKENS
            )
            try:
                client.measure(
                    request, first_token_budget_s=600.0, budget_source="warm-up", check_count=False
                )
            except MeasurementError as exc:
                raise ServerError(f"warm-up request {index + 1} failed: {exc}") from exc


def _snapshot(client: CompletionClient) -> MetricsSnapshot | None:
    with contextlib.suppress(Exception):
        return MetricsSnapshot.from_text(client.metrics_text())
    return None


def measure_point(
    run: Run, server: ServerInfo, client: CompletionClient, point: Point, prompt: Prompt
) -> PointMeasurement:
    try:
        serving.check_alive(run)
    except ServerError as exc:
        raise PointFailure(str(exc)) from None
    decode_tokens = run.plan.decode_tokens
    budget = FirstTokenBudget(
        default_s=run.plan.profile.sweep.first_token_timeout_s,
        override_s=run.settings.ttft_timeout_s,
    )
    budget_s, source = budget.for_length(point.length, run.measured_ttft)
    if run.settings.ttft_timeout_s is not None:
        source += " (--longctx-ttft-timeout)"
    request = CompletionRequest(
        model=server.model_name,
        prompt=prompt.text if prompt.text is not None else prompt.ids,
        decode_tokens=decode_tokens,
    )
    before = _snapshot(client)
    try:
        stream = client.measure(request, first_token_budget_s=budget_s, budget_source=source)
    except MeasurementError as exc:
        try:
            serving.check_alive(run, grace_s=5.0)
        except ServerError as gone:
            raise PointFailure(f"{type(exc).__name__}: {exc}\n{gone}") from None
        raise PointFailure(f"{type(exc).__name__}: {exc}") from None
    after = _snapshot(client)
    view: ServerSideView | None = delta(before, after) if before and after else None
    server_view = {**view.figures(), **view.counters()} if view is not None else {}
    result = PointMeasurement(
        length=point.length,
        requested_tokens=decode_tokens,
        prompt_tokens=stream.prompt_tokens if stream.prompt_tokens is not None else -1,
        completion_tokens=stream.completion_tokens,
        ttft_s=stream.ttft_s,
        stream_figures=stream.figures(),
        server_view=server_view,
        prompt_build_s=prompt.build_s,
    )
    return result


def verify(point: Point, result: PointMeasurement) -> None:
    """What makes the figures trustworthy; the item fails (its figures still recorded)."""
    if result.prompt_tokens != point.length:
        raise PointFailure(
            f"the server counted {result.prompt_tokens} prompt tokens; the point sent "
            f"{point.length}"
        )
    view = result.server_view
    cached = max(view.get("cached_prompt_tokens") or 0, view.get("prefix_cache_hits") or 0)
    if cached:
        raise PointFailure(
            f"the server's prefix cache served {cached:.0f} of {point.length} prompt tokens: "
            "this is not a cold prefill"
        )
