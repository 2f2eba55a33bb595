"""benchmarks/depth_rule.py: video_depth_noisy's DEPTH RULE picks the shallowest depth where primal-dual beats erm on validation."""

from __future__ import annotations

import importlib.util

from helpers import REPO, assert_script_remakes

spec = importlib.util.spec_from_file_location("depth_rule", REPO / "benchmarks" / "depth_rule.py")
depth_rule = importlib.util.module_from_spec(spec)
spec.loader.exec_module(depth_rule)


def _table(gaps: dict[int, list[float]]) -> dict:
    """erm at 1.0 for every seed; primal-dual 1.0 + the gap of each seed, at each depth given."""
    table = {}
    for depth, gap in gaps.items():
        table[(depth, "erm")] = {seed: 1.0 for seed in range(len(gap))}
        table[(depth, "primal-dual")] = {seed: 1.0 + g for seed, g in enumerate(gap)}
    return table


BELOW, ABOVE = [-0.11, -0.10, -0.12], [0.01, -0.02, 0.015]  # an interval below 0; one across 0


def test_the_shallowest_qualifying_candidate_depth_is_chosen():
    assert depth_rule.decide(_table({4: BELOW, 8: ABOVE, 12: BELOW, 16: BELOW}), 3)[0] == 12


def test_depth_4_never_qualifies_since_it_is_no_candidate():
    assert depth_rule.decide(_table({4: BELOW, 8: ABOVE, 12: ABOVE, 16: ABOVE}), 3)[0] == depth_rule.DEFAULT


def test_the_rule_waits_for_a_shallower_candidate_before_a_deeper_one_decides():
    assert depth_rule.decide(_table({8: ABOVE, 16: BELOW}), 3)[0] is None
    assert depth_rule.decide(_table({8: BELOW[:2]}), 3)[0] is None  # a depth missing a seed has not finished


def test_the_script_reproduces_the_committed_depth_rule(tmp_path):
    root = REPO / "benchmarks/results/video_depth_noisy"
    assert_script_remakes(tmp_path, root / "depth_rule.md", "depth_rule.py", str(root))
