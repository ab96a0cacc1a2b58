"""A ``config.json`` as vLLM reads it: through its ``model_type``'s transformers config class.

vLLM loads a checkpoint's config with the transformers config class of its ``model_type``
(``AutoConfig``) and sizes the cache from the language model's config
(``get_text_config()``), so every field the file leaves out takes the class's default: Gemma
3's five local layers to one global, Gemma 2's alternation, Qwen3-Next's full-attention
interval. A published ``config.json`` often spells none of these. The plan reads the file the
same way; a ``model_type`` transformers does not know (remote code) is read as written.

transformers imports torch, which takes seconds and, once a test runner's module snapshot has
dropped it, cannot be imported again in that process: the class runs in another Python
(:mod:`pytest_longctx.core.warm_python`) unless transformers is already imported here, and
each config is filled once: the answer is kept in the user's cache per transformers version.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from pytest_longctx.core import warm_python
from pytest_longctx.core.files import write_atomically
from pytest_longctx.profiles.embedded_models import cache_root


class ConfigClassError(ValueError):
    """The model's config class rejected the config, or could not be run."""


def filled_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with its config class's defaults, the language model's fields at the top.

    A multimodal wrapper's ``text_config`` is merged over the wrapper's fields, as vLLM's
    ``get_hf_text_config`` picks it; ``architectures`` and the dtype stay the file's.
    """
    if not isinstance(config.get("model_type"), str):
        return dict(config)
    return json.loads(_filled(json.dumps(config, sort_keys=True)))


@functools.lru_cache(maxsize=64)
def _filled(canonical: str) -> str:
    if "transformers" in sys.modules:
        return json.dumps(fill(json.loads(canonical)))
    kept = filled_file(canonical)
    with contextlib.suppress(OSError):
        return kept.read_text(encoding="utf-8")
    try:
        reply = warm_python.ask(__name__, "fill_or_rejection", json.loads(canonical), timeout_s=300)
    except warm_python.QuestionTimeout:
        raise ConfigClassError("the transformers config class did not answer in 300 s") from None
    except warm_python.QuestionFailed as exc:
        raise ConfigClassError(f"the transformers config class could not read it: {exc}") from None
    if "rejected" in reply:
        raise ConfigClassError(reply["rejected"])
    answer = json.dumps(reply["filled"])
    with contextlib.suppress(OSError):
        write_atomically(kept, answer)
    return answer


def filled_file(canonical: str) -> Path:
    """Where the filled form of ``canonical`` is kept across processes (the user's cache,
    beside the embedded models), per transformers version: a later session reads it there
    instead of starting a Python that imports torch."""
    try:
        version = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        version = "none"
    digest = hashlib.sha256(f"{version}\n{canonical}".encode()).hexdigest()[:32]
    return cache_root() / "model-configs" / f"{digest}.json"


def fill_or_rejection(config: dict[str, Any]) -> dict[str, Any]:
    """:func:`fill`'s answer for another Python: ``{"filled": ...}``, or the class's refusal as
    ``{"rejected": why}``, said as in this process."""
    try:
        return {"filled": fill(config)}
    except ConfigClassError as exc:
        return {"rejected": str(exc)}


def fill(config: dict[str, Any]) -> dict[str, Any]:
    """:func:`filled_config`'s work, in this process (imports transformers)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = config["model_type"]
    if model_type not in CONFIG_MAPPING:
        return config
    try:
        hf = CONFIG_MAPPING[model_type].from_dict(dict(config))
    except Exception as exc:  # the classes' validators raise their own error types
        reason = " ".join(str(exc).split())
        raise ConfigClassError(
            f"transformers' {CONFIG_MAPPING[model_type].__name__} rejects it: {reason}"
        ) from exc
    filled = hf.to_dict()
    text = hf.get_text_config()
    if text is not hf:
        filled.pop("text_config", None)
        filled.update({key: value for key, value in text.to_dict().items() if value is not None})
        for key in ("architectures", "torch_dtype", "dtype"):
            if config.get(key) is not None:
                filled[key] = config[key]
    return json.loads(json.dumps(filled, default=str))
