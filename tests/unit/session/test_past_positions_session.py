"""Lengths past the model's trained positions, named on their records: a session that
launches the stand-in with a profile whose model was made for 1,536 positions."""

from __future__ import annotations

import json

import pytest
from longctx_testing import SWEEP_TEST, launch_fake_conftest, records_of, run_session

from pytest_longctx.profiles.embedded_models import get_spec
from pytest_longctx.profiles.profile import PROFILE_DIR

#: Sessions that launch the stand-in server: run beside the other sessions (make test).
pytestmark = pytest.mark.stand_in

TRAINED = 1536


def test_each_record_past_the_trained_positions_names_them(pytester: pytest.Pytester) -> None:
    """1Ki and its 32 decode tokens stay within 1,536 positions; 2Ki runs past them, and its
    record says so, as the plan does before the session starts."""
    spec = get_spec("tiny-llama")
    config = {**spec.model_config(), "architectures": [spec.architecture]}
    config["max_position_embeddings"] = TRAINED
    (pytester.path / "config.json").write_text(json.dumps(config))
    text = (PROFILE_DIR / "cpu-tiny.toml").read_text()
    text = text.replace(
        'served_name = "tiny-llama"', 'served_name = "tiny-llama"\nconfig = "config.json"'
    )
    profile = pytester.path / "tiny.toml"
    profile.write_text(text)
    pytester.makepyfile(test_sweep=SWEEP_TEST)
    pytester.makeconftest(launch_fake_conftest())
    plan, _ = run_session(
        pytester, f"--longctx-profile={profile}", "--longctx-to=2Ki", "--longctx-plan"
    )
    assert "positions: 2Ki run past the model's 1,536 positions" in plan.stdout.str()
    result, output = run_session(pytester, f"--longctx-profile={profile}", "--longctx-to=2Ki")
    result.assert_outcomes(passed=2)
    assert [(r.length, r.past_positions) for r in records_of(output)] == [
        (1024, None),
        (2048, TRAINED),
    ]
