"""Protocol resolution: named defaults per ability, explicit flags override and are recorded."""

from __future__ import annotations

import pytest

from or1.errors import UserError
from or1.eval.protocols import resolve_sampling


def test_skywork_is_the_paper_setting() -> None:
    math = resolve_sampling("skywork", "math", seed=3)
    assert (math.n, math.temperature, math.top_p, math.max_tokens, math.seed) == (32, 1.0, 1.0, 32768, 3)
    assert resolve_sampling("skywork", "code", seed=0).n == 4
    assert math.overridden == ()


def test_other_protocols() -> None:
    script = resolve_sampling("skywork-7b-script", "math", seed=0)
    assert (script.temperature, script.top_p, script.n) == (0.6, 1.0, 32)
    r1 = resolve_sampling("deepseek-r1", "math", seed=0)
    assert (r1.temperature, r1.top_p, r1.n, r1.max_tokens) == (0.6, 0.95, 64, 32768)


def test_flags_override_and_are_listed() -> None:
    s = resolve_sampling("deepseek-r1", "code", seed=0, n=2, temperature=0.0, max_tokens=64)
    assert (s.n, s.temperature, s.top_p, s.max_tokens) == (2, 0.0, 0.95, 64)
    assert s.overridden == ("n", "temperature", "max_tokens")
    assert s.to_dict()["protocol"] == "deepseek-r1"


def test_bad_protocol_and_settings_are_user_errors() -> None:
    with pytest.raises(UserError, match="Unknown protocol"):
        resolve_sampling("nope", "math", seed=0)
    with pytest.raises(UserError, match="top-p"):
        resolve_sampling("skywork", "math", seed=0, top_p=0.0)
    with pytest.raises(UserError):
        resolve_sampling("skywork", "math", seed=0, n=0)
