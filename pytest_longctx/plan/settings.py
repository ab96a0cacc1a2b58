"""The frozen Settings the plan is built from; session/option_parsing.py parses the options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    from_length: int | None
    to_length: int | None
    repeats: int
    order: str
    #: The profile the user chose (option or ini key); None: the embedded default for a
    #: launched server, the server's own settings for an attached one.
    profile: str | None
    #: Endpoints to attach to, one per server; empty: launch from the profile.
    urls: tuple[str, ...]
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
    #: How progress is shown: auto (a live line on a terminal, else plain lines), line,
    #: plain or off.
    progress: str = "auto"
    #: Seconds between progress samples inside a point; 0: no sampling at all.
    progress_interval_s: float = 1.0
    #: Seconds between two plain progress lines (without a terminal).
    progress_throttle_s: float = 60.0
    #: Devices each launched server gets (its own CUDA/HIP_VISIBLE_DEVICES), under ``-n``.
    devices_per_server: int | None = None
    #: Keep points from servers whose fingerprints differ in one run.
    allow_mixed_servers: bool = False
    #: How far a point's stream may disagree with the server's decode (a fraction).
    stream_tolerance: float = 0.5
    #: Fail points whose stream disagrees with the server's decode (``--longctx-strict-stream``)
    #: instead of keeping them with the server's decode figure.
    strict_stream: bool = False
    #: Keep and gate the background figures of interference points whose gaps the server's
    #: own figures refute (``--longctx-allow-unconfirmed``), which are set aside by default.
    allow_unconfirmed: bool = False
    #: What each length measures: some of "cold", "warm", "interference", "concurrency"
    #: (--longctx-workload).
    workload: tuple[str, ...] = ("cold",)
    #: What a wrong answer to the fidelity probe does: auto, check, record or off.
    fidelity: str = "auto"
    #: Warm follow-ups per cold point, and the new tokens each appends.
    warm_questions: int = 3
    warm_suffix: int = 256
    #: Background streams beside each interference point's long prompt.
    background_streams: int = 4
    #: vLLM's ``--max-num-batched-tokens`` (the prefill chunk) for the launched server of the
    #: interference points; None: the profile's.
    max_num_batched_tokens: int | None = None
    #: The highest level of the concurrency workload (--longctx-max-concurrency).
    max_concurrency: int = 8
    #: Times a session may start its launched server again after it died or hung.
    max_relaunches: int = 3
    #: Crashes one length may cause before its remaining repeats are skipped.
    max_crashes_per_length: int = 2
    #: Seconds to wait for an attached server that stopped answering to answer again.
    reattach_timeout_s: float = 60.0
    #: TCP keepalive probe interval on the measured connection; 0: none.
    tcp_keepalive_s: float = 15.0
    #: vLLM's ``--sse-keep-alive-interval`` for launched servers (whole seconds); 0: off.
    sse_keep_alive_s: int = 30
    #: Unmeasured requests before the first point; None: the profile's.
    warmup_prompts: int | None = None
    #: Whether the session's reports draw their PNG plots (--longctx-plots).
    plots: bool = True

    @property
    def url(self) -> str | None:
        """The first endpoint: set when the session attaches rather than launches."""
        return self.urls[0] if self.urls else None
