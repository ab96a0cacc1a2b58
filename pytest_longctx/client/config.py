"""Where a server is and how long the client waits for it; its ``/v1/models`` entry."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import UPLOAD_CHUNK_BYTES


@dataclass(frozen=True)
class ModelEntry:
    """The server's ``/v1/models`` entry for the model it serves: what it says, not assumed."""

    id: str
    max_model_len: int | None
    #: Where the server loaded it from (vLLM's ``root``: a hub id or a folder on its machine).
    root: str | None = None


@dataclass(frozen=True)
class ClientConfig:
    """Where the server is and how long to wait; the first-token budget comes per request."""

    base_url: str
    api_key: str | None = field(default=None, repr=False)
    connect_timeout_s: float = 10.0
    #: Longest silence between two token chunks; decode steps at 64Mi context are slow.
    inter_token_timeout_s: float = 600.0
    #: /health, /v1/models, /metrics, /tokenize (which may tokenize megabytes: see tokenize()).
    control_timeout_s: float = 60.0
    upload_chunk_bytes: int = UPLOAD_CHUNK_BYTES
    #: TCP keepalive probe interval on every connection, the measured one included; 0: off.
    tcp_keepalive_s: float = 15.0

    def __post_init__(self) -> None:
        for name in ("connect_timeout_s", "inter_token_timeout_s", "control_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name}={value!r}: expected a positive number of seconds")
        if self.upload_chunk_bytes < 1:
            raise ValueError(f"upload_chunk_bytes={self.upload_chunk_bytes}: expected >= 1")
