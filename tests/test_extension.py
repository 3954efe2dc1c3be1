"""A stage kind and an objective term added from an experiment file, with no library edit:
`experiments/configs/soup_math.py` registers `soup` (a weighted average of earlier checkpoints) and the driver
runs it like a built-in kind: validated before training, trained in order, evaluated on every domain, its params
pinned to the numpy average. It also registers the term `length`, which its GRPO stage trains with."""
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from nemocascade import cascade, configs, errors, objectives, rewards
from nemocascade.data import domains
from nemocascade.stages import kinds

from conftest import final_params, tiny_math_config, distinct_items


def _tiny_soup(tmp_path):
    c = tiny_math_config("soup_math:tiny", tmp_path)
    c.stages.sft.update(steps=4, batch_size=4, eval_every=0, checkpoint_every=4)
    # no dynamic filter: a 4-step SFT's policy scores 0 everywhere, and a step of filtered-out groups trains nothing
    c.stages.grpo.update(steps=1, rollout=dict(prompts_per_step=4, group_size=4, length_curriculum=((0, 16),)),
                         eval_every=0, filters=dict(dynamic=False))
    c.stages.branch.update(steps=3, batch_size=4, checkpoint_every=3)
    c.stages.soup.weights = (0.25, 0.75)
    return c


def test_a_stage_kind_from_an_experiment_file_runs_in_the_cascade(tmp_path):
    cfg = _tiny_soup(tmp_path)
    assert "soup" in kinds.KINDS and kinds.KINDS["soup"].run.__module__.startswith("nemocascade_config_soup_math")
    wd = str(tmp_path / "run")
    summary = cascade.run(cfg, wd, "soup_math", "tiny")
    stages = {s["name"]: s for s in summary["stages"]}
    assert list(stages) == ["sft", "grpo", "branch", "soup"] and stages["soup"]["kind"] == "soup"
    assert stages["soup"]["eval"]["math"]["n"] == distinct_items(cfg, "math", "test", 8)  # evaluated like any stage
    grpo, branch, soup = (final_params(wd, s) for s in ("grpo", "branch", "soup"))
    for key in ("embed", "final_norm"):
        np.testing.assert_allclose(np.asarray(soup[key]),
                                   0.25 * np.asarray(grpo[key]) + 0.75 * np.asarray(branch[key]), rtol=1e-6)
    assert not np.allclose(np.asarray(grpo["embed"]), np.asarray(branch["embed"]))  # two different checkpoints
    with open(os.path.join(wd, "metrics.jsonl")) as f:
        rows = [r for r in map(json.loads, f) if r.get("stage") == "grpo"]
    assert rows and all(r["weight/length"] == pytest.approx(0.05) and "term/length" in r and "over_budget" in r
                        for r in rows)


def test_the_experiment_term_matches_its_formula():
    configs.load("soup_math:tiny")  # registers the term
    term = objectives.TERMS["length"]
    budget = term.fn.__globals__["LENGTH_BUDGET"]
    rng = np.random.default_rng(0)
    T = budget + 6
    mask = np.zeros((2, T), np.float32)
    mask[0, 2:] = 1  # T - 2 = budget + 4 response tokens: the last 4 are over
    mask[1, 3:10] = 1  # short
    logp = rng.normal(-1.0, 0.3, (2, T)).astype(np.float32)
    per_token, diag = term.fn({"mask": jnp.asarray(mask), "logp": jnp.asarray(logp)})
    want = np.zeros((2, T), np.float32)
    want[0, -4:] = logp[0, -4:]
    np.testing.assert_allclose(np.asarray(per_token), want)
    assert np.asarray(diag["over_budget"]).sum() == 4


def test_the_experiment_kind_is_validated_before_training():
    cfg = configs.load("soup_math:tiny")
    cfg.stages.soup.sources = ("stage:grpo", "stage:nosuch")
    cfg.stages.soup.weights = (0.5, 0.6)
    with pytest.raises(errors.BadInput, match=r"config\.stages\.soup\.sources: 'stage:nosuch' is not .* \(and 1 more: "
                                              r"weights=\[0\.5, 0\.6\]"):
        cascade.validate(cfg)


def test_a_kind_cannot_shadow_another_modules_kind():
    sft = kinds.get("sft")
    imposter = kinds.common.StageKind("sft", {}, lambda *a: None, lambda *a: [])
    with pytest.raises(ValueError, match="stage kind 'sft' is already registered by nemocascade.stages.sft"):
        kinds.register(imposter)
    assert kinds.get("sft") is sft


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme_example(name):
    """The code block after `<!-- example: NAME -->` in the README."""
    text = open(os.path.join(ROOT, "README.md")).read()
    after = text.split(f"<!-- example: {name} -->", 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readmes_domain_example_is_the_configs_code():
    block = _readme_example("sort_words")
    source = open(os.path.join(ROOT, "experiments", "configs", "sort_words.py")).read()
    assert "def generate" in block and "def score" in block and "domains.register(" in block
    assert block.strip() in source  # word for word: the README cannot drift from the file the test runs


def test_a_domain_from_an_experiment_file_trains_and_is_verified_in_workers(tmp_path):
    cfg = configs.load("sort_words:tiny")
    score = domains.verifier("sort_words")
    assert [score(t, "ant cat dog") for t in ("<think>a c d</think>\\boxed{ant cat dog}", "\\boxed{ant dog cat}",
                                              "\\boxed{ant  cat dog", "x" * 10**6, None)] == [1.0, 0.0, 0.0, 0.0, 0.0]
    recs = domains.generate_split("sort_words", "test", 50, seed=0)
    assert all(domains.split_of(domains.problem_key(r)) == "test" for r in recs)
    assert all(score(r["response"], r["answer"]) in (0.0, 1.0) for r in recs)
    assert 0 < np.mean([score(r["response"], r["answer"]) for r in recs]) < 1  # the teacher slips sometimes
    cfg.data.data_dir, cfg.tokenizer.path = str(tmp_path / "data"), str(tmp_path / "tok" / "t.model")
    cfg.model.update(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)
    cfg.data.domains.sort_words.update(num_train=256, num_test=64)
    cfg.eval.update(n=8, val_n=8, batch_size=8, max_new_tokens=24, avg_k=0)
    cfg.reward.num_workers = 1  # a worker process: the verifier travels as (file, name)
    cfg.stages.sft.update(steps=4, batch_size=4, seq_len=64, checkpoint_every=4)
    cfg.stages.grpo.update(steps=1, rollout=dict(prompts_per_step=2, group_size=2, length_curriculum=((0, 16),)),
                           eval_every=0, checkpoint_every=1)
    summary = cascade.run(cfg, str(tmp_path / "run"), "sort_words", "tiny")
    evals = [s["eval"]["sort_words"] for s in summary["stages"]]
    assert [s["name"] for s in summary["stages"]] == ["sft", "grpo"]
    assert all(e["n"] == 8 and e["verifier_errors"] == 0 and e["verifier_timeouts"] == 0 for e in evals)


def strict_math(completion, answer):
    """A stricter math reward for the README's example: the boxed text must equal the answer as written."""
    from nemocascade.rewards.math import last_boxed
    return float(last_boxed(completion or "") == answer)


def test_the_readmes_reward_example_trains_one_stage_on_it(monkeypatch):
    monkeypatch.setitem(rewards.REWARDS, "math_strict", None)  # the example registers it; restored afterwards
    cfg = configs.load("cascade_math")
    exec(_readme_example("a reward"), {"rewards": rewards, "score": strict_math, "c": cfg})
    cascade.validate(cfg)
    from nemocascade.stages import reward_sources
    assert reward_sources.verifiers(cfg.stages.grpo) == {"math": strict_math}  # the stage trains on it
    assert reward_sources.verifiers(cfg.stages.sft) == {"math": domains.verifier("math")}  # the others keep math's
    assert domains.verifier("math") is not strict_math  # and so does evaluation (the domain's own)
    assert [strict_math(t, "0.5") for t in ("\\boxed{0.5}", "\\boxed{1/2}")] == [1.0, 0.0]


def test_the_readmes_reward_source_example_scores_a_stage(monkeypatch):
    from nemocascade.stages import reward_sources

    monkeypatch.setattr(reward_sources, "SOURCES", dict(reward_sources.SOURCES))  # the example's entry goes after
    cfg = configs.load("cascade_math")
    exec(_readme_example("a reward source"), {"c": cfg, "__name__": "readme_example"})
    cascade.validate(cfg)
    scorer = reward_sources.build(None, cfg.stages.grpo)
    lengths = np.array([[3, 1, 1, 4], [2, 2, 2, 2]])
    rewards = scorer([{}, {}], ["t"] * 8, lengths)
    np.testing.assert_array_equal(rewards, [[0, 1, 1, 0], [1, 1, 1, 1]])  # by hand: the shortest per group
    assert scorer.take_metrics() == {"shortest_calls": 1}
    cfg.stages.grpo.reward.source = "shortst"
    with pytest.raises(Exception, match=r"config\.stages\.grpo\.reward\.source='shortst': no such source"):
        cascade.validate(cfg)
