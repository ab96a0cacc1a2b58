"""The server a point is measured on, as the measurement needs to know it.

It lives below ``serving/`` (which launches or attaches it) so that the measurement depends on
nothing above it: a launched and an attached server look the same from here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


class LaunchCommand(Protocol):
    """The command a launched server runs (``serving.vllm_command.ServerCommand``)."""

    @property
    def argv(self) -> tuple[str, ...]: ...

    @property
    def env(self) -> Mapping[str, str]: ...


class ServerError(RuntimeError):
    """The server could not start, or went away; ``failure_class`` says how, from evidence
    (``core.records.FAILURE_CLASSES``), and ``evidence`` holds the lines that show it."""

    def __init__(
        self, message: str, failure_class: str = "error", evidence: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.failure_class = failure_class
        self.evidence = evidence


@dataclass(frozen=True)
class ServerInfo:
    """What the measurement needs to know about the server, whichever way it came."""

    base_url: str
    model_name: str
    max_model_len: int | None
    mode: str  # "launched" or "attached"
    api_key: str | None = field(default=None, repr=False)
    command: LaunchCommand | None = None
    log_path: Path | None = None
    engine_version: str | None = None
    #: Where the server loaded the model from (``/v1/models`` ``root``).
    model_root: str | None = None
