"""A counter the client updates while it streams, for anyone watching from another thread.

The stream loop only assigns numbers to it (no callback, no lock, no I/O), so a watcher costs
the measurement nothing: it reads the counter on its own clock. Times are
:func:`time.perf_counter` values, the client's own clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StreamProgress:
    """Where one streamed request is; every field is written by the client's thread only."""

    #: ``perf_counter()`` at t0 (the request handed to the HTTP client); None before.
    t0: float | None = None
    #: Arrival of the first chunk that carried tokens; None before it.
    first_token_at: float | None = None
    #: Arrival of the latest chunk that carried tokens.
    last_token_at: float | None = None
    #: Tokens received so far, as the stream counts them.
    tokens: int = 0
    #: The longest wait between two chunks that carried tokens (an engine step at least).
    slowest_gap_s: float = 0.0
    #: The stream ended (``[DONE]``, an error or a timeout).
    finished: bool = False
