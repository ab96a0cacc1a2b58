"""The measured request and its JSON body, built before the clock starts."""

from __future__ import annotations

import json
import operator
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

try:  # transformers depends on numpy; the pure-Python path only guards odd installs
    import numpy as np
except ImportError:  # pragma: no cover - exercised via _encode_ids_python in tests
    np = None  # type: ignore[assignment]

from .errors import UPLOAD_CHUNK_BYTES


@dataclass(frozen=True)
class CompletionRequest:
    """One measured completion: decode exactly ``decode_tokens`` tokens after ``prompt``.

    ``prompt`` is a sequence of token ids (``array('I')``, a numpy array, a list, a range) or a
    str for engines that need text. ``extra_body`` fields are merged last and win, except
    ``prompt``. ``return_token_ids`` makes the count per chunk exact, but vLLM 0.32 then echoes
    all prompt ids in the first chunk, which at long prompts delays that chunk by the time it
    takes to serialize and ship the prompt again: leave it off for timing long prompts.
    ``continuous_usage`` asks for a running ``usage.completion_tokens`` in every chunk
    (``stream_options.continuous_usage_stats``): the count per chunk, exact for chunks of any
    size, at a few dozen bytes a chunk.
    """

    model: str
    prompt: Sequence[int] | str = field(repr=False, compare=False)
    decode_tokens: int
    ignore_eos: bool = True
    temperature: float = 0.0
    include_usage: bool = True
    continuous_usage: bool = True
    return_token_ids: bool = False
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.decode_tokens, bool) or not isinstance(self.decode_tokens, int):
            raise ValueError(f"decode_tokens={self.decode_tokens!r}: expected a positive int")
        if self.decode_tokens < 1:
            raise ValueError(f"decode_tokens={self.decode_tokens}: expected a positive int")
        if "prompt" in self.extra_body:
            raise ValueError("extra_body may not contain 'prompt'; pass it as prompt=")

    @property
    def prompt_length(self) -> int | None:
        """Tokens in the prompt, or None for a text prompt (the server tokenizes it)."""
        return None if isinstance(self.prompt, str) else len(self.prompt)

    def fields(self) -> dict[str, Any]:
        """Every body field except ``prompt``, as sent."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.decode_tokens,
            "min_tokens": self.decode_tokens,
            "ignore_eos": self.ignore_eos,
            "temperature": self.temperature,
            "stream": True,
        }
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
            if self.continuous_usage:
                body["stream_options"]["continuous_usage_stats"] = True
        if self.return_token_ids:
            body["return_token_ids"] = True
        body.update(self.extra_body)
        return body

    def __repr__(self) -> str:
        length = self.prompt_length
        prompt = f"text of {len(self.prompt)} chars" if length is None else f"{length} ids"
        return (
            f"CompletionRequest(model={self.model!r}, prompt=<{prompt}>, "
            f"decode_tokens={self.decode_tokens}, extra_body={dict(self.extra_body)!r})"
        )


@dataclass(frozen=True, eq=False)
class RequestBody:
    """Serialized JSON, built once before the clock starts."""

    data: bytes | bytearray = field(repr=False)
    build_s: float

    @property
    def size(self) -> int:
        return len(self.data)

    def chunks(self, chunk_bytes: int = UPLOAD_CHUNK_BYTES) -> Iterator[memoryview]:
        view = memoryview(self.data)
        for start in range(0, len(view), chunk_bytes):
            yield view[start : start + chunk_bytes]


def encode_request(request: CompletionRequest) -> RequestBody:
    """``request`` as compact UTF-8 JSON, as ``json.dumps`` writes it with ``(",", ":")``."""
    started = time.perf_counter()
    head = json.dumps(request.fields(), separators=(",", ":"), ensure_ascii=False)
    prefix = (head[:-1] + ("," if head != "{}" else "") + '"prompt":').encode()
    if isinstance(request.prompt, str):
        prompt = json.dumps(request.prompt, ensure_ascii=False).encode()
        data: bytes | bytearray = prefix + prompt + b"}"
    else:
        data = encode_token_ids(request.prompt, prefix=prefix, suffix=b"}")
    return RequestBody(data=data, build_s=time.perf_counter() - started)


def encode_token_ids(ids: Sequence[int], prefix: bytes = b"", suffix: bytes = b"") -> bytearray:
    """``prefix + b"[1,2,3]" + suffix`` without building a Python string per id.

    Uses numpy when present: about 20 ns per id against about 200 ns for ``json.dumps`` of a
    list, which matters at 64Mi ids (see benchmarks/bench_client.py).
    """
    if np is None:
        return _encode_ids_python(ids, prefix, suffix)
    return _encode_ids_numpy(_as_id_array(ids), prefix, suffix)


def _encode_ids_python(ids: Sequence[int], prefix: bytes, suffix: bytes) -> bytearray:
    values = []
    for value in ids:
        try:
            number = operator.index(value)
        except TypeError:
            number = -1
        if isinstance(value, bool) or number < 0:
            raise ValueError(f"token id {value!r} is not a non-negative int")
        values.append(number)
    out = bytearray(prefix)
    out += b"[" + ",".join(map(str, values)).encode() + b"]"
    out += suffix
    return out


def _as_id_array(ids: Sequence[int]) -> Any:
    if isinstance(ids, range):
        array = np.arange(ids.start, ids.stop, ids.step, dtype=np.int64)
    else:
        try:
            array = np.asarray(ids)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"token ids must be non-negative ints: {exc}") from None
    if array.ndim != 1:
        raise ValueError(f"token ids must be a flat sequence, got shape {array.shape}")
    if array.size == 0:
        return array.astype(np.uint32)
    if array.dtype.kind not in "iu" or array.dtype == np.bool_:
        raise ValueError(f"token ids must be non-negative ints, got dtype {array.dtype}")
    if array.dtype.kind == "i":
        smallest = int(array.min())
        if smallest < 0:
            raise ValueError(f"token id {smallest} is negative; ids must be >= 0")
        array = array.astype(np.uint64, copy=False)
    return array


_ENCODE_CHUNK_IDS = 1 << 20
_TABLE_LIMIT = 1 << 22  # ids below this (7 digits at most) render through a lookup table
_TABLE_ROW = 8  # bytes per table row: 7 digits and a comma, one uint64


@dataclass(frozen=True, eq=False)
class _IdTable:
    """Every id below ``size`` pre-rendered as one uint64: NUL padding, digits, a comma."""

    size: int
    rows: Any  # numpy uint64, one per id; gathering uint64 is the fastest numpy gather
    lengths: Any  # numpy int8: bytes each id adds, comma included


_ID_TABLES: dict[int, _IdTable] = {}


def _id_table(largest: int) -> _IdTable:
    size = 1 << max(10, largest.bit_length())  # one table serves a whole vocabulary
    table = _ID_TABLES.get(size)
    if table is None:
        rows = _render_rows(np.arange(size, dtype=np.uint64), _TABLE_ROW)
        table = _IdTable(
            size=size,
            rows=rows.view(np.uint64).ravel(),
            lengths=np.count_nonzero(rows, axis=1).astype(np.int8),
        )
        _ID_TABLES.clear()  # keep one: a sweep uses one vocabulary
        _ID_TABLES[size] = table
    return table


def _render_rows(values: Any, width: int) -> Any:
    """uint8 rows of ``width`` bytes: right-aligned decimal digits and a comma, NUL before.

    NUL never occurs in the JSON, so ``rows[rows != 0]`` is the compact text.
    """
    rows = np.empty((values.size, width), dtype=np.uint8)
    rows[:, width - 1] = ord(",")
    remaining = values.astype(np.uint64, copy=True)
    for column in range(width - 2, -1, -1):
        rows[:, column] = remaining % 10 + ord("0")
        remaining //= 10
    digits = np.ones(values.size, dtype=np.int64)
    power = 10
    for _ in range(width - 2):
        digits += values >= power
        power *= 10
    rows[np.arange(width)[None, :] < (width - 1 - digits)[:, None]] = 0
    return rows


def _encode_ids_numpy(ids: Any, prefix: bytes, suffix: bytes) -> bytearray:
    count = int(ids.size)
    if count == 0:
        return bytearray(prefix + b"[]" + suffix)
    largest = int(ids.max())
    if largest >= _TABLE_LIMIT:
        return _encode_ids_wide(ids, prefix, suffix)
    table = _id_table(largest)
    starts = range(0, count, _ENCODE_CHUNK_IDS)
    chunk_lengths = [
        int(table.lengths[ids[start : start + _ENCODE_CHUNK_IDS]].sum(dtype=np.int64))
        for start in starts
    ]
    # Sized once and filled in place: the body is the only large allocation.
    out = bytearray(len(prefix) + 1 + sum(chunk_lengths) + len(suffix))
    view = np.frombuffer(out, dtype=np.uint8)
    view[: len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    position = len(prefix)
    view[position] = ord("[")
    position += 1
    for start, length in zip(starts, chunk_lengths, strict=True):
        rows = table.rows[ids[start : start + _ENCODE_CHUNK_IDS]].view(np.uint8)
        view[position : position + length] = rows[rows != 0]
        position += length
    view[position - 1] = ord("]")  # the last id's comma closes the list
    if suffix:
        view[position:] = np.frombuffer(suffix, dtype=np.uint8)
    return out


def _encode_ids_wide(ids: Any, prefix: bytes, suffix: bytes) -> bytearray:
    """Ids too large for a lookup table: render each chunk digit by digit."""
    width = len(str(int(ids.max()))) + 1
    out = bytearray(prefix)
    out += b"["
    for start in range(0, int(ids.size), _ENCODE_CHUNK_IDS):
        rows = _render_rows(ids[start : start + _ENCODE_CHUNK_IDS], width)
        out += rows[rows != 0].tobytes()
    out[-1] = ord("]")
    out += suffix
    return out
