"""Every experiment config loads and validates in its default and tiny variants (bad stage references, unknown
rewards or kinds fail here, not an hour into a run); the multi-stage cascades run end to end in `tiny` (slow)."""
import json

import pytest

from nemocascade import cascade, configs

NAMES = configs.known_configs()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("variant", ["", ":tiny"])
def test_config_validates(name, variant):
    cfg = configs.load(name + variant)
    cascade.validate(cfg)
    assert cfg.name == name
    assert list(configs.stage_order(cfg))


def test_the_cascades_use_the_papers_orders():
    cfg = configs.load("cascade_c2")
    c2 = [s for s in configs.stage_order(cfg) if not cfg.stages[s].side_branch]
    assert c2 == ["sft", "rm", "if_rl", "multi_rl", "mopd", "rlhf", "longctx_rl", "code_rl", "swe_agentless",
                  "swe_exec"]
    c1 = list(configs.stage_order(configs.load("cascade_c1")))
    assert c1 == ["sft", "rm", "rlhf", "if_rl", "math_rl", "code_rl", "swe_agentless", "swe_exec"]


@pytest.mark.slow
@pytest.mark.timeout(2000)  # above the subprocess's own 1800 s limit, which fails with the run's output
@pytest.mark.parametrize("name", ["cascade_mini", "cascade_c1", "cascade_c2", "mopd_vs_grpo"])
def test_tiny_cascade_runs_end_to_end(name, tmp_path, run_cli):
    run_cli(f"{name}:tiny", tmp_path, timeout=1800)
    summary = json.load(open(tmp_path / "summary.json"))
    cfg = configs.load(f"{name}:tiny")
    assert [s["name"] for s in summary["stages"]] == list(configs.stage_order(cfg))
    for s in summary["stages"]:
        assert set(cfg.data.domains) <= set(s["eval"])
