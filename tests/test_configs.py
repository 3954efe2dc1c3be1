"""Every experiment config loads and validates in its default and tiny variants (bad stage references, unknown
rewards or kinds fail here, not an hour into a run); the multi-stage cascades run end to end in `tiny` (slow)."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from nemocascade import cascade, configs, held_out
from nemocascade.errors import BadInput

NAMES = configs.known_configs()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("variant", ["", ":tiny"])
def test_config_validates(name, variant):
    cfg = configs.load(name + variant)
    cascade.validate(cfg)
    assert cfg.name == name
    assert list(configs.stage_order(cfg))
    for stage in cfg.stages.values():  # the rest sits in parts (issue 38: at most 15 top-level keys)
        assert len(stage.keys()) <= 15, (stage.kind, sorted(stage.keys()))


def test_data_seed_is_the_runs_seed_unless_fixed():
    # smollm2_cascade's sweep shares seed 0's SFT between seeds: the records must then be seed 0's draw for
    # every seed, or one seed's test items could sit in the training split SFT saw
    cfg = configs.load("smollm2_cascade")
    assert cfg.data.seed == -1 and cascade.data_seed(cfg) == cfg.seed == 0
    cfg.seed = 2
    assert cascade.data_seed(cfg) == 2
    cfg.data.seed = 0
    assert cascade.data_seed(cfg) == 0
    other = configs.load("swe_agent")  # every config has the key (`--config.data.seed=0` from the command line)
    other.seed = 5
    assert other.data.seed == -1 and cascade.data_seed(other) == 5
    del other.data["seed"]
    assert cascade.data_seed(other) == 5  # a config without the key: the run's seed


def test_the_cascades_use_the_papers_orders():
    cfg = configs.load("cascade_c2")
    c2 = [s for s in configs.stage_order(cfg) if not cfg.stages[s].handoff.side_branch]
    assert c2 == ["sft", "if_rl", "multi_rl", "mopd", "rlhf", "longctx_rl", "code_rl", "swe_agentless", "swe_exec"]
    # C2's judges are language models (the SFT checkpoint, trained on the judges' domains too); C1's RLHF a BT RM
    for name in ("rlhf", "rlhf_branch"):
        assert (cfg.stages[name].reward.judge, cfg.stages[name].reward.mode) == ("stage:sft", "pairwise")
    assert (cfg.stages.longctx_rl.reward.judge, cfg.stages.longctx_rl.reward.mode) == ("stage:sft", "reference")
    assert {"judge_pref", "judge_longctx"} <= set(cfg.stages.sft.domains)
    c1cfg = configs.load("cascade_c1")
    c1 = list(configs.stage_order(c1cfg))
    assert c1 == ["sft", "rm", "rlhf", "if_rl", "math_rl", "code_rl", "swe_agentless", "swe_exec"]
    r = c1cfg.stages.rlhf.reward
    assert (r.source, r.model, r.mode, r.judge) == ("reward_model", "rm", "scalar", "")


# METHOD.md "Paper defaults per stage" (Cascade 2 Tab. 8-10), written out here independently of the configs'
# own table: what a GRPO stage training exactly these domains must set in every config's default variant.
PAPER = {
    ("if",): dict(overlong="penalty", top_p=1.0),
    ("json", "mcq", "tool"): dict(overlong="filter", top_p=1.0, mix={"mcq": 0.55, "tool": 0.30, "json": 0.15}),
    ("pref",): dict(overlong="filter", top_p=1.0, kl=0.03),
    ("longctx",): dict(overlong="filter", top_p=1.0),
    ("code",): dict(overlong="filter", top_p=0.95),
}


@pytest.mark.parametrize("name", NAMES)
def test_default_variants_follow_the_paper(name):
    cfg = configs.load(name)
    for stage_name in configs.stage_order(cfg):
        stage = cfg.stages[stage_name]
        if stage.kind != "grpo":
            continue
        want = PAPER.get(tuple(sorted(stage.domains)), {})
        assert stage.objective.terms.get("kl", 0.0) == want.get("kl", 0.0), (stage_name, "KL only in RLHF (0.03)")
        assert stage.objective.terms.get("entropy", 0.0) == 0.0, stage_name
        if "overlong" in want:
            assert stage.filters.overlong == want["overlong"], stage_name
        if "top_p" in want:
            assert stage.rollout.top_p == want["top_p"], stage_name
        if "mix" in want:
            assert dict(stage.rollout.mix) == pytest.approx(want["mix"]), stage_name
        if stage.filters.dynamic:
            assert stage.filters.refill_rounds > 1, (stage_name, "a filtered batch is refilled")
    for d, dc in cfg.data.domains.items():  # n >= 500 test items per domain (every item a domain has, if fewer)
        assert cfg.eval.n >= 500 and dc.num_test >= 500, d
    assert cfg.eval.avg_k > 0 and cfg.eval.temperature == 1.0


@pytest.mark.parametrize("name", ["cascade_math", "cascade_demo", "genrm", "swe_agent"])
def test_procedural_test_splits_hold_eval_n_distinct_problems(name):
    # The generators repeat problems; evaluation scores the first eval.n distinct ones, so the test split must hold
    # that many (and validation val_n): from the generators themselves, with the run's seed and options.
    from nemocascade.data import domains

    cfg = configs.load(name)
    for d, dc in cfg.data.domains.items():
        for split, n in (("test", cfg.eval.n), ("val", cfg.eval.val_n)):
            records = domains.generate_split(d, split, dc.num_test, cfg.seed, **dc.opts.to_dict())
            assert len({domains.problem_key(r) for r in records}) >= n, (d, split)


def test_swe_agent_rl_repeats_are_the_same_arms_at_new_places_in_the_run():
    """swe_agent:rl_repeats: each repeat pair equals the default pair key by key (a side branch from the same SFT),
    and sits at its own index in the stage order, which seeds its data order and RNG (stages/common.stage_index)."""
    from nemocascade.configs import flatten

    base, rep = configs.load("swe_agent"), configs.load("swe_agent:rl_repeats")
    assert list(rep.stage_order) == list(base.stage_order) + [
        "rl_single_r2", "rl_multi_r2", "rl_single_r3", "rl_multi_r3"]
    for arm in ("rl_single", "rl_multi"):
        for r in (2, 3):
            assert flatten(rep.stages[f"{arm}_r{r}"].to_dict()) == flatten(base.stages[arm].to_dict()), (arm, r)
    assert rep.stages.rl_multi_r3.handoff.init_from == "stage:sft" and rep.stages.rl_multi_r3.handoff.side_branch
    tiny = configs.load("swe_agent:tiny,rl_repeats")  # the repeats copy the tiny arms
    assert tiny.stages.rl_single_r2.steps == tiny.stages.rl_single.steps == 2


def test_an_agent_evaluations_bad_key_is_named():
    from nemocascade.errors import BadInput
    cfg = configs.load("swe_agent")
    with cfg.unlocked():
        cfg.eval.agents.multi.avg_kk = 4
    with pytest.raises(BadInput, match=r"config\.eval\.agents\.multi: unknown key\(s\) \['avg_kk'\]"):
        cascade.validate(cfg)
    cfg = configs.load("swe_agent")
    with cfg.unlocked():
        cfg.eval.agents.single.avg_k = -1
    with pytest.raises(BadInput, match=r"config\.eval\.agents\.single\.avg_k must be >= 0"):
        cascade.validate(cfg)


@pytest.mark.parametrize("name", ["cascade_c2", "cascade_demo"])
def test_mopd_distils_from_three_teachers_chosen_on_validation(name):
    cfg = configs.load(name)
    for stage in cfg.stages.values():
        if stage.kind == "mopd":
            refs = set(stage.objective.teachers.values())
            assert len(refs) == 3, refs
            assert all(r.startswith(("stage:", "best:")) for r in refs)


@pytest.mark.parametrize("name", ["cascade_math", "cascade_demo", "cascade_c2", "cascade_c1"])
def test_the_kl_variant_is_the_named_departure(name):
    default, kl = configs.load(name), configs.load(name + ":kl")
    for stage_name, stage in kl.stages.items():
        if stage.kind == "grpo":
            base_kl = default.stages[stage_name].objective.terms.kl
            assert stage.objective.terms.kl == (base_kl if base_kl else 0.05), stage_name
    with pytest.raises(ValueError, match="unknown variant 'klx'"):
        configs.load(name + ":tiny,klx")


@pytest.mark.slow
@pytest.mark.timeout(2000)  # above the subprocess's own 1800 s limit, which fails with the run's output
@pytest.mark.parametrize("name", ["cascade_demo", "cascade_c1", "cascade_c2", "mopd_vs_grpo"])
def test_tiny_cascade_runs_end_to_end(name, tmp_path, run_cli):
    run_cli(f"{name}:tiny", tmp_path, timeout=1800)
    summary = json.load(open(tmp_path / "summary.json"))
    cfg = configs.load(f"{name}:tiny")
    assert [s["name"] for s in summary["stages"]] == list(configs.stage_order(cfg))
    for s in summary["stages"]:
        assert set(cfg.data.domains) <= set(s["eval"])
        stage = cfg.stages[s["name"]]
        if cfg.eval.avg_k and stage.kind in ("grpo", "mopd", "sft"):  # avg@k: an RL stage's own domains, SFT's all
            own = set(cfg.data.domains) if stage.kind == "sft" else set(stage.domains)
            assert {d for d in cfg.data.domains if "avg@k" in s["eval"][d]} == own, s["name"]


PARSE = """
import json, sys
sys.path.insert(0, "experiments")
import run
run.parse_flags(run.resolve_config_arg(["run.py", *sys.argv[1:]]))
c = run._CONFIG.value
print(json.dumps({"agents": c.eval.agents.to_dict(), "data_seed": c.data.seed, "order": list(c.stage_order),
                  "avg_k_domains": c.eval.avg_k_domains, "domains": list(c.stages.rl_multi.domains),
                  "curriculum": [list(x) for x in c.stages.rl_multi.rollout.length_curriculum]}))
"""


def test_documented_overrides_parse_on_the_command_line():
    # run.py's own flag parsing: keys read with a default (an agent's avg_k, data.seed, eval.avg_k_domains) exist in
    # the configs, so the README's overrides are accepted; a comma-separated stage order is a list of stages
    args = ["--config=swe_agent", "--config.eval.agents.multi.avg_k=4", "--config.data.seed=0",
            "--config.eval.avg_k_domains=all", "--config.stage_order=sft,rl_multi",
            "--config.stages.rl_multi.domains=swe,swe_retry",
            "--config.stages.rl_multi.rollout.length_curriculum=((0,64),)"]
    out = subprocess.run([sys.executable, "-c", PARSE, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["agents"]["multi"] == {"max_turns": 3, "max_new_tokens": 112, "max_total_tokens": 448,
                                      "max_obs_tokens": 160, "avg_k": 4}
    assert got["agents"]["single"]["avg_k"] == 0 and got["data_seed"] == 0 and got["avg_k_domains"] == "all"
    assert got["order"] == ["sft", "rl_multi"]  # a comma-separated list is a list (configs.expand_list_overrides)
    assert got["domains"] == ["swe", "swe_retry"] and got["curriculum"] == [[0, 64]]


def test_bare_comma_lists_become_tuples_of_the_keys_that_are_tuples():
    cfg = configs.load("cascade_math")
    argv = ["run.py", "--config.stages.grpo.domains=math,if", "--config.stages.grpo.optim.freeze=embed",
            "--config.stage_order=sft, grpo", "--config.stages.grpo.steps=3,4", "--config.stages.grpo.domains=('a',)",
            "--config.stages.grpo.rollout.length_curriculum=0,64"]
    assert configs.expand_list_overrides(argv, cfg) == [
        "run.py", "--config.stages.grpo.domains=('math', 'if')", "--config.stages.grpo.optim.freeze=embed",
        "--config.stage_order=('sft', 'grpo')", "--config.stages.grpo.steps=3,4",  # not a tuple key: absl's error
        "--config.stages.grpo.domains=('a',)", "--config.stages.grpo.rollout.length_curriculum=(0, 64)"]


def test_an_agent_entry_has_every_key_and_refuses_unknown_ones():
    assert held_out.agent(2, 64, avg_k=3) == {"max_turns": 2, "max_new_tokens": 64, "max_total_tokens": 0,
                                              "max_obs_tokens": 128, "avg_k": 3}
    with pytest.raises(BadInput, match="max_tokens"):
        held_out.agent(2, 64, max_tokens=3)


def test_every_config_key_has_a_meaning_and_the_reference_is_current(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    spec = importlib.util.spec_from_file_location("config_reference", os.path.join(ROOT, "experiments",
                                                                                   "config_reference.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    missing = {}
    for name in NAMES:
        for variant in ("", ":tiny"):
            for key in module.config_help.missing(configs.flatten(configs.load(name + variant).to_dict())):
                missing.setdefault(key, name + variant)
    assert not missing, f"keys with no meaning in experiments/config_help.py: {missing}"
    with open(module.OUT) as f:
        assert f.read() == module.reference(), "stale: python experiments/config_reference.py rewrites it"
