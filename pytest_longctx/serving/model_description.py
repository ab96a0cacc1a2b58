"""What the records say about the measured model: described by the server, never assumed.

A launched server serves the profile's model, so the profile describes it. An attached server
may serve anything: its ``/v1/models`` entry names the model and where it was loaded from
(``root``). When that is the chosen profile's model, the profile describes it; when ``root`` is
a model folder readable here, its ``config.json`` and folder describe it; otherwise what is not
known is recorded as unknown. A profile's values are never recorded for another model, and a
session attached without a profile has none to record.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_longctx import capacity
from pytest_longctx.client import ModelEntry
from pytest_longctx.plan import capacity_check
from pytest_longctx.profiles import Profile

UNKNOWN = "unknown"
BY_PROFILE = "profile"
BY_FOLDER = "the server's model folder"
BY_NOTHING = "nothing readable here"

_SNAPSHOT = re.compile(r"/snapshots/([0-9a-f]{40})/?$")


@dataclass(frozen=True)
class ModelDescription:
    source: str  # hub id or folder as served
    revision: str
    described_by: str
    config: Mapping[str, Any] | None = field(default=None, repr=False)
    kv_cache_dtype: str | None = None
    #: The served weights' dtype when the profile sets it (None: the config's, as ``auto``).
    model_dtype: str | None = None
    tensor_parallel_size: int | None = None
    #: Fixed memory the KV plot compares against (the profile's references).
    memory_marks: Mapping[str, int] = field(default_factory=dict)
    #: What the KV cache may hold: (bytes, label), when known.
    kv_budget: tuple[int, str] | None = None
    #: Why there is no config, when there is none.
    why_unknown: str | None = None

    @property
    def architecture(self) -> str:
        if not self.config:
            return UNKNOWN
        architectures = self.config.get("architectures")
        if isinstance(architectures, list) and architectures:
            return str(architectures[0])
        return str(self.config.get("model_type", UNKNOWN))

    def kv_plot(self) -> dict[str, Any]:
        """What the KV-cache plot is drawn from, as records keep it."""
        if self.config is None:
            return {"unavailable": self.why_unknown or "the model's config.json is not known"}
        plot: dict[str, Any] = {
            "config": dict(self.config),
            "cache_dtype": self.kv_cache_dtype or "auto",
            "model_dtype": self.model_dtype,
            "tensor_parallel": self.tensor_parallel_size or 1,
            "tensor_parallel_known": self.tensor_parallel_size is not None,
            "marks": dict(self.memory_marks),
        }
        if self.kv_budget is not None:
            plot["budget_bytes"], plot["budget_label"] = self.kv_budget
        return plot

    def fingerprint(self) -> dict[str, Any]:
        return {
            "model": self.source,
            "revision": self.revision,
            "model_described_by": self.described_by,
            "architecture": self.architecture,
            "kv_cache_dtype": self.kv_cache_dtype,
            "tensor_parallel_size": self.tensor_parallel_size,
            "kv_plot": self.kv_plot(),
        }


def describe_launched(profile: Profile) -> ModelDescription:
    return _from_profile(profile, profile.model.source, profile.serving.kv_cache_dtype)


def describe_attached(
    profile: Profile, served: ModelEntry, cache_labels: Mapping[str, str] | None
) -> ModelDescription:
    """The model an attached server serves, from what it says and what is readable here."""
    cache_dtype = (cache_labels or {}).get("cache_dtype") or None
    budget = _reported_budget(cache_labels)
    if profile.chosen and _serves_profile_model(profile, served):
        described = _from_profile(profile, profile.model.source, cache_dtype)
        return replace(described, tensor_parallel_size=None, kv_budget=budget)
    source = served.root or served.id
    folder = Path(served.root) if served.root else None
    if folder is not None and (folder / "config.json").is_file():
        try:
            config = capacity.load_model_config(folder)
        except capacity.ModelConfigError as exc:
            why = f"the server's model folder {folder} has no usable config: {exc}"
            return _unknown(source, why)
        return ModelDescription(
            source=source,
            revision=folder_revision(folder),
            described_by=BY_FOLDER,
            config=config,
            kv_cache_dtype=cache_dtype,
            kv_budget=budget,
        )
    where = f"its root {served.root!r}" if served.root else "no root"
    which = (
        f"which is not profile {profile.name}'s model"
        if profile.chosen
        else "which no profile describes (attached without one)"
    )
    return _unknown(
        source,
        f"the server serves {served.id!r} ({where}), {which} and has no model folder readable "
        "here",
        cache_dtype,
    )


def another_model(profile: Profile, served: ModelEntry, described: ModelDescription) -> str:
    """What to say when an attached server serves another model than the profile's ('' when
    it serves the profile's): the records describe the served one, never the profile's."""
    if described.described_by == BY_PROFILE or not profile.model.source or not profile.chosen:
        return ""
    where = f" from {served.root}" if served.root and served.root != served.id else ""
    return (
        f"profile {profile.name} is for {profile.model.served_name or profile.model.source}; "
        f"the server serves {served.id}{where}: the records describe the served model "
        f"({described.described_by}), and its answers to the fidelity probe are its own"
    )


def folder_revision(folder: Path) -> str:
    """A hub snapshot's commit, an embedded model's spec-named folder, else the config's hash."""
    resolved = str(folder.resolve())
    snapshot = _SNAPSHOT.search(resolved)
    if snapshot:
        return snapshot.group(1)
    from pytest_longctx.profiles.embedded_models import COMPLETE_MARKER

    if (folder / COMPLETE_MARKER).is_file():
        return folder.resolve().name
    digest = hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()[:12]
    return f"config-sha256:{digest}"


def _serves_profile_model(profile: Profile, served: ModelEntry) -> bool:
    names = {profile.model.served_name, profile.model.source} - {None}
    return served.id in names or (served.root is not None and served.root in names)


def _from_profile(profile: Profile, source: str, cache_dtype: str | None) -> ModelDescription:
    config = capacity_check.model_config(profile)
    hardware = capacity_check.hardware_for(profile)
    if hardware.kv_cache_bytes is not None:
        budget = (hardware.kv_cache_bytes, "KV cache budget")
    else:
        budget = (hardware.usable_per_device_bytes, "device memory")
    marks = dict(profile.model.memory_marks)
    if not marks and profile.model.weights_bytes:
        weights = profile.model.weights_bytes
        marks = {"weights": weights, "half the weights": weights // 2}
    return ModelDescription(
        source=source,
        revision=profile.model.revision or _embedded_revision(profile) or UNKNOWN,
        described_by=BY_PROFILE,
        config=config,
        kv_cache_dtype=cache_dtype,
        model_dtype=None if profile.serving.dtype == "auto" else profile.serving.dtype,
        tensor_parallel_size=profile.serving.tensor_parallel_size,
        memory_marks=marks,
        kv_budget=budget,
        why_unknown=None if config else f"no config.json for {profile.model.source} at hand",
    )


def _embedded_revision(profile: Profile) -> str | None:
    """Embedded models are pinned by their spec hash, which names their folder."""
    name = profile.model.embedded_name
    if name is None:
        return None
    from pytest_longctx.profiles.embedded_models import get_spec

    return get_spec(name).folder_name


def _reported_budget(cache_labels: Mapping[str, str] | None) -> tuple[int, str] | None:
    value = (cache_labels or {}).get("kv_cache_memory_bytes")
    if value and value.isdigit() and int(value) > 0:
        return int(value), "KV cache budget"
    return None


def _unknown(source: str, why: str, cache_dtype: str | None = None) -> ModelDescription:
    return ModelDescription(
        source=source,
        revision=UNKNOWN,
        described_by=BY_NOTHING,
        kv_cache_dtype=cache_dtype,
        why_unknown=why,
    )
