"""The versions a profile expects of what serves it (AITER, ROCm; vLLM is the release
table's), against what is installed where a launch runs, before anything starts."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from pytest_longctx.core.sizes import format_size
from pytest_longctx.profiles import Profile

#: Packages whose version the plan checks here (vLLM's is the planned release's).
CHECKED = ("aiter", "rocm", "torch")


def same_version(have: str, expected: str) -> bool:
    """Whether an installed version is the expected one: a leading ``v`` (a git tag, as
    AITER's ``v0.1.19.post2``), a local build part (``+gitabc``) and a ROCm build number
    (``7.2.3-74``) do not count."""

    def core(text: str) -> str:
        return re.split(r"[+-]", text.strip().lower().removeprefix("v"), maxsplit=1)[0]

    return core(have) == core(expected)


def version_findings(
    profile: Profile, lengths: Sequence[int], found: Mapping[str, str]
) -> list[str]:
    """What the plan says of each expected version: a mismatch where the profile needs that
    version from some length on names the lengths it endangers; one that is not installed
    here is said as not checked."""
    serving = profile.serving
    out = []
    for package, expected in serving.expected_versions.items():
        if package not in CHECKED:
            continue
        have = found.get(package)
        start = serving.versions_needed_from.get(package)
        needing = [n for n in lengths if start is not None and n >= start]
        names = ", ".join(format_size(n) for n in needing)
        if have is None:
            if needing:
                out.append(
                    f"{package} not found here: the profile needs {package} {expected} from "
                    f"{format_size(start or 0)} ({names} selected); not checked, check the node"
                )
            continue
        if same_version(have, expected):
            continue
        if needing:
            out.append(
                f"WARNING: {package} {have} is installed here; profile {profile.name} needs "
                f"{package} {expected} from {format_size(start or 0)}: {names} may fail or "
                f"answer wrong with it; install {package} {expected}, or leave them out "
                f'(-m "len<{format_size(start or 0)}")'
            )
        else:
            out.append(
                f"{package} {have} is installed here; profile {profile.name} was measured with "
                f"{expected}: compare with care"
            )
    return out
