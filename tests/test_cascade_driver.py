"""The cascade driver on a 4-stage run (tiny math, few steps): main line, a side branch (more SFT from the SFT
checkpoint) that does not advance it, an optimiser kept across a handoff, MOPD distilling from the side branch,
the teacher registry and the manifest; a resume that skips finished stages and refuses a changed teacher
mapping; a rescore that evaluates the finished stages again without training; and a redo that discards the last
two stages and runs them again under a changed teacher mapping, keeping the first two."""
import json
import os
import time

import numpy as np
import pytest

import orbax.checkpoint as ocp

from conftest import distinct_items
from nemocascade import cascade, configs
from nemocascade.stages import common, mopd, sft


def _cfg():
    c = configs.load("cascade_math:tiny")
    # what it checks is the driver, not the model
    c.model.update(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)
    c.eval.n = 16
    c.eval.sets = {"humaneval": dict(n=4, max_prompt_len=1024, max_new_tokens=8)}  # a real benchmark by name
    c.stages.sft.update(steps=40, eval_every=0, checkpoint_every=40)
    c.stages.grpo.update(steps=2, eval_every=0, rollout=dict(length_curriculum=((0, 48),), prompts_per_step=4,
                                                            group_size=4))
    c.stages.branch = common.stage_config(  # more SFT from the SFT checkpoint, off the main line
        "sft", sft.DEFAULTS, domains=["math"], steps=5, handoff=dict(init_from="stage:sft", side_branch=True),
        seq_len=80, checkpoint_every=5, optim=dict(lr=3e-3))
    c.stages.distil = common.stage_config(
        "mopd", mopd.DEFAULTS, domains=["math"], steps=2, objective=dict(teachers={"math": "stage:branch"}),
        rollout=dict(prompts_per_step=4, group_size=2, max_new_tokens=48),
        optim=dict(state="keep", lr=1e-3, schedule="linear_warmup", warmup_steps=2, warmup_init=0.1))
    c.stage_order = ("sft", "grpo", "branch", "distil")
    return c


def _embed(path):
    with ocp.StandardCheckpointer() as ck:
        return np.asarray(ck.restore(path)["embed"])


def test_side_branch_keep_optimizer_mopd_and_resume(tmp_path):
    wd = str(tmp_path / "run")
    summary = cascade.run(_cfg(), wd, "driver_test")
    stages = {s["name"]: s for s in summary["stages"]}
    assert list(stages) == ["sft", "grpo", "branch", "distil"]
    assert stages["branch"]["started_from"] == "sft" and stages["branch"]["side_branch"] is True
    # the side branch did not advance the main line: MOPD starts from grpo
    assert stages["distil"]["started_from"] == "grpo"
    assert stages["distil"]["kind"] == "mopd" and stages["distil"]["teachers"] == {"math": "stage:branch"}
    # teachers are chosen and scored on validation, never on the test split the table reports
    assert stages["distil"]["teacher_scores"]["math"] == stages["branch"]["val"]["math"]["pass@1"]
    # all 64 validation items (num_val defaults to num_test; eval.val_n 200 is more); benchmarks are test-only
    # (distinct problems only: a repeat is not a new item)
    val_n = distinct_items(_cfg(), "math", "val", 64)
    assert 40 < val_n <= 64 and all(s["val"]["math"]["n"] == val_n and "humaneval" not in s["val"]
                                    for s in stages.values())
    for s in stages.values():  # HumanEval through the sandbox after every stage; too-long prompts are counted
        he = s["eval"]["humaneval"]
        assert he["n"] == 4 and he["pass@1"] == 0.0 and 0 <= he["skipped_too_long"] <= 160
    # every evaluation carries its 95% interval (RUN_OUTPUT.md); a stage's paired gain over its start is recomputed
    # here from the per-item scores it saved
    for s in stages.values():
        for result in s["eval"].values():
            lo, hi = result["ci95"]
            assert 0 <= lo <= result["pass@1"] <= hi <= 1
    items = {n: json.load(open(f"{wd}/eval_scores/{n}.json")) for n in stages}
    assert len(items["grpo"]["math"]) == stages["grpo"]["eval"]["math"]["n"]
    paired = stages["branch"]["paired_vs_start"]["math"]  # branch started from sft
    assert paired["mean_gain"] == pytest.approx(np.mean(items["branch"]["math"]) - np.mean(items["sft"]["math"]))
    assert paired["ci95"][0] <= paired["mean_gain"] <= paired["ci95"][1]
    rows = [json.loads(line) for line in open(f"{wd}/metrics.jsonl")]
    distil = [r for r in rows if r["stage"] == "distil"]
    assert len(distil) == 2 and all("reverse_kl/math" in r and "is_clip_frac" in r for r in distil)
    assert distil[0]["lr"] == pytest.approx(1e-4) and distil[1]["lr"] == pytest.approx(1e-3 * 0.55)

    reg = json.load(open(f"{wd}/checkpoints/registry.json"))
    assert set(reg["stages"]) == {"sft", "grpo", "branch", "distil"}
    best = max(stages, key=lambda n: (stages[n]["val"]["math"]["pass@1"], -list(stages).index(n)))
    assert reg["best"]["math"]["stage"] == best
    # the branch trained from sft, not from grpo: its params differ from grpo's final params
    assert reg["stages"]["grpo"]["path"] == os.path.join("final", "grpo")  # relative: the workdir can move
    assert not np.allclose(_embed(f"{wd}/checkpoints/final/grpo"), _embed(f"{wd}/checkpoints/final/branch"))

    # resume: everything done -> no training; a changed teacher mapping is refused, naming the key (by the
    # workdir's recorded config; with that key allowed to change, the teacher manifest still refuses it)
    again = cascade.run(_cfg(), wd, "driver_test")
    assert [s["name"] for s in again["stages"]] == ["sft", "grpo", "branch", "distil"]
    assert again["total_wall_s"] > summary["total_wall_s"]  # the resume's time adds to the run's
    c2 = _cfg()
    c2.stages.distil.objective.teachers.math = "best:math"
    with pytest.raises(ValueError, match=r"stages\.distil\.objective\.teachers\.math: 'stage:branch' -> 'best:math'"):
        cascade.run(c2, wd, "driver_test")
    with pytest.raises(ValueError, match=r"teachers\['distil'\]"):
        cascade.run(c2, wd, "driver_test", allow_changes=["stages.distil.objective.teachers.*"])
    assert json.load(open(f"{wd}/config.json"))["stages"]["distil"]["objective"]["teachers"] == {"math": "stage:branch"}

    _check_rescore(tmp_path, wd, summary)
    _check_redo(wd)


def _check_rescore(tmp_path, wd, before):
    """`cascade.rescore` of the finished run `wd`: every stage evaluated again from its final params with eval.n 8,
    nothing trained, the choices the run made (teachers, starts, wall times) kept."""
    old_items = {s["name"]: json.load(open(f"{wd}/eval_scores/{s['name']}.json")) for s in before["stages"]}
    metrics = open(f"{wd}/metrics.jsonl").read()
    fewer = _cfg()
    fewer.eval.n = 8
    with pytest.raises(ValueError, match=r"eval\.n: 16 -> 8"):  # a changed key still needs allowing
        cascade.rescore(fewer, wd, "driver_test")
    after = cascade.rescore(fewer, wd, "driver_test", allow_changes=["eval.n"])
    assert open(f"{wd}/metrics.jsonl").read() == metrics  # nothing trained
    old = {s["name"]: s for s in before["stages"]}
    for s in after["stages"]:
        name = s["name"]
        assert (s["wall_s"], s["teachers"], s["started_from"]) == (old[name]["wall_s"], old[name]["teachers"],
                                                                   old[name]["started_from"])
        items = json.load(open(f"{wd}/eval_scores/{name}.json"))
        # greedy decoding is deterministic and the first 8 distinct items are the first 8 of the 16: the same scores
        assert items["math"] == old_items[name]["math"][:8] and s["eval"]["math"]["n"] == 8
        assert s["eval"]["math"]["pass@1"] == pytest.approx(np.mean(items["math"]))
        assert s["eval"]["humaneval"]["n"] == 4
    grpo = next(s for s in after["stages"] if s["name"] == "grpo")
    gain = np.mean(old_items["grpo"]["math"][:8]) - np.mean(old_items["sft"]["math"][:8])
    assert grpo["paired_vs_start"]["math"]["mean_gain"] == pytest.approx(gain)
    distil = next(s for s in after["stages"] if s["name"] == "distil")
    assert distil["teacher_scores"]["math"] == old["branch"]["val"]["math"]["pass@1"]  # validation is unchanged
    assert after["rescored"][-1]["eval"]["n"] == 8 and after["config_changes"][-1]["changes"][0]["key"] == "eval.n"
    assert json.load(open(f"{wd}/config.json"))["eval"]["n"] == 8
    with pytest.raises(ValueError, match="no finished stage to rescore"):
        cascade.rescore(_cfg(), str(tmp_path / "empty"), "driver_test")


def _check_redo(wd):
    """`redo_from="branch"` discards branch and distil (recorded after it) and runs them again, distil now taught by
    `best:math`; sft and grpo stay exactly as they were."""
    before = json.load(open(f"{wd}/summary.json"))
    rows_before = [json.loads(line) for line in open(f"{wd}/metrics.jsonl")]
    c = _cfg()
    c.eval.n = 8  # as the rescore left the workdir's config
    c.stages.distil.objective.teachers.math = "best:math"
    allow = ["stages.distil.objective.teachers.*"]
    with pytest.raises(ValueError, match=r"and the config none either; finished: \['sft', 'grpo'"):
        cascade.run(c, wd, "driver_test", allow_changes=allow, redo_from="nope")
    kept_changed = _cfg()
    kept_changed.eval.n, kept_changed.stages.grpo.steps = 8, 3
    with pytest.raises(ValueError, match=r"keeps stage\(s\) \['grpo'\]"):
        cascade.run(kept_changed, wd, "driver_test", allow_changes=["stages.*"], redo_from="branch")
    assert json.load(open(f"{wd}/summary.json")) == before  # refused: nothing touched
    # a stage cut short after distil (step checkpoint and metrics rows, no summary entry) goes too
    os.makedirs(f"{wd}/checkpoints/cut_short/1")
    with open(f"{wd}/metrics.jsonl", "a") as f:
        f.write(json.dumps({"stage": "cut_short", "step": 1, "loss": 1.0}) + "\n")
    t_redo = time.time()
    after = cascade.run(c, wd, "driver_test", allow_changes=allow, redo_from="branch")
    assert [s["name"] for s in after["stages"]] == ["sft", "grpo", "branch", "distil"]
    assert after["stages"][:2] == before["stages"][:2]
    assert after["redone"][-1]["dropped"] == ["branch", "distil", "cut_short"]
    assert not os.path.exists(f"{wd}/checkpoints/cut_short")
    val = {s["name"]: s["val"]["math"]["pass@1"] for s in after["stages"][:3]}
    best = max(val, key=lambda n: (val[n], -list(val).index(n)))  # ties keep the earlier
    assert after["stages"][3]["teachers"] == {"math": f"stage:{best}"}
    reg = json.load(open(f"{wd}/checkpoints/registry.json"))
    assert list(reg["stages"]) == ["sft", "grpo", "branch", "distil"]
    assert json.load(open(f"{wd}/checkpoints/manifest.json"))["teachers"]["distil"] == {"math": "best:math"}
    rows = [json.loads(line) for line in open(f"{wd}/metrics.jsonl")]
    kept = [r for r in rows_before if r["stage"] in ("sft", "grpo")]
    assert rows[:len(kept)] == kept
    redone = rows[len(kept):]  # trained again from the start (old step checkpoints gone), on the same global axis
    assert [(r["stage"], r["step"], r["global_step"]) for r in redone] == [
        (r["stage"], r["step"], r["global_step"]) for r in rows_before[len(kept):]]
    assert redone and all(r["time"] >= t_redo for r in redone)
    assert after["total_wall_s"] > before["total_wall_s"]


def test_validate_names_bad_handoff_keys():
    c = _cfg()
    c.stages.branch.handoff.init_from = "stage:distil"  # a later stage
    with pytest.raises(ValueError, match=r"stages\.branch\.handoff\.init_from='stage:distil'"):
        cascade.validate(c)
    c = _cfg()
    c.stages.distil.optim.state = "warm"
    with pytest.raises(ValueError, match=r"stages\.distil\.optim\.state='warm'; choose one of \('reset', 'keep'\)"):
        cascade.validate(c)
    c = _cfg()
    c.stages.distil.objective.teachers.math = "best:code"
    with pytest.raises(ValueError, match=r"stages\.distil\.objective\.teachers\.math='best:code'"):
        cascade.validate(c)
    c.stages.distil.objective.teachers.math = "best:math+code"  # one teacher for several domains: every one must exist
    with pytest.raises(ValueError, match=r"teachers.math='best:math\+code'"):
        cascade.validate(c)
    c.stages.distil.objective.teachers.math = "best:math+math"
    cascade.validate(c)
    c = _cfg()
    c.stages.sft.mix = {"code": 2.0}  # not one of the SFT stage's domains
    with pytest.raises(ValueError, match=r"stages.sft.mix: \{'code': 2.0\}"):
        cascade.validate(c)
