"""Was the judge gamed? `python experiments/judge_report.py --workdir=RUN [--before=sft --after=rlhf
--judge=stage:sft --n=500]`.

On the run's first `n` distinct held-out "pref" requests (the items its evaluation scores) both policies answer
greedily; then for each request:

  truth   the proxy judge's scores (rewards/pref.py, the ground truth RLHF never sees): after wins 1, tie 1/2, loses 0;
          and how many of each policy's answers fail each of its checks (what RLHF broke or fixed)
  judge   the GenRM's Pr(after beats before), both orders averaged (rewards/judge.py), as it rewarded RLHF

RLHF games its judge where the judge prefers the new answers and the truth does not: the report gives both win
rates with 95% intervals, and the share of requests the judge calls a win (> 1/2) that the truth calls a loss. It
also scores the judge itself on the held-out "judge_pref" pairs, by the position of the better answer (A or B):
a position-biased judge is accurate on one and not the other; and by the worse answer's kind (verbose, repetitive,
off_topic, unhelpful): where the judge is blind, RLHF can go. Writes RUN/judge_report.json; prints a table.

Exit status: 0 done; 2 bad input (no such workdir, stage, or a run without the pref domain), naming it.
"""
import argparse
import json
import os
import sys

import numpy as np
from absl import logging

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import jax  # noqa: E402

from nemocascade import cascade, chat, evaluation, files, stats, trained  # noqa: E402
from nemocascade import mesh as mesh_lib  # noqa: E402
from nemocascade.data import domains, judge_pref, tfds_builder  # noqa: E402
from nemocascade.errors import BadInput  # noqa: E402
from nemocascade.models import param_shardings  # noqa: E402
from nemocascade.rewards import judge as judge_lib  # noqa: E402
from nemocascade.rewards import pref, rm_scorer  # noqa: E402




def held_out(cfg, workdir: str, domain: str, n: int) -> list[dict]:
    """The first `n` distinct test records of `domain`, read from the data the run built (as `cascade.setup` reads
    it): the items the run's evaluation scores (`RunContext.eval_records`)."""
    if domain not in cfg.data.domains:
        raise BadInput(f"the run has no {domain!r} domain (config.data.domains: {list(cfg.data.domains)})")
    dc = cfg.data.domains[domain]
    sources = tfds_builder.prepare(domain, cfg.data.data_dir or os.path.join(workdir, "data"), dc.num_train,
                                   dc.num_test, cascade.data_seed(cfg), num_val=dc.get("num_val"), **dc.opts.to_dict())
    return domains.first_distinct(sources["test"], n)


def report(workdir: str, before: str, after: str, judge_ref: str, n: int) -> dict:
    cfg = trained.run_config(workdir)
    mesh = mesh_lib.make_mesh()
    model_cfg, tokenizer = trained.run_model(cfg, workdir, mesh)
    abstract = cascade.abstract_params(model_cfg, param_shardings(model_cfg, mesh))

    def params_of(ref):
        return trained.stage_params(workdir, ref, abstract)[2]

    records = held_out(cfg, workdir, "pref", n)
    e = cfg.eval
    answers = {}
    for which, ref in (("before", before), ("after", after)):
        texts, _ = evaluation.generate(params_of(ref), model_cfg, tokenizer, records, batch_size=e.batch_size,
                                       max_prompt_len=e.max_prompt_len, max_new_tokens=e.max_new_tokens,
                                       rng=jax.random.key(0), thinking=cfg.thinking, mesh=mesh, desc=f"answer {which}")
        answers[which] = texts
    specs = [json.loads(r["answer"]) for r in records]
    truth, failed = {}, {}
    for which, texts in answers.items():
        truth[which] = np.asarray([pref.score(t, r["answer"]) for t, r in zip(texts, records)])
        passed = [pref.checks(chat.strip_think(t), spec) for t, spec in zip(texts, specs)]
        failed[which] = {name: sum(not c[name] for c in passed) for name in pref.CHECKS}
    truth_win = np.where(truth["after"] > truth["before"], 1.0, np.where(truth["after"] < truth["before"], 0.0, 0.5))

    stage = next((s for s in cfg.stages.values() if s.get("reward", {}).get("judge") == judge_ref), None)
    kw = dict(max_len=stage.reward.judge_max_len, batch_size=stage.reward.judge_batch_size) if stage is not None else {}
    judge = judge_lib.Judge(params_of(judge_ref), model_cfg, tokenizer, thinking=cfg.thinking, mesh=mesh, **kw)
    finals = [[rm_scorer.final_text(a), rm_scorer.final_text(b)] for a, b in zip(answers["after"], answers["before"])]
    prefs, pair_stats = judge_lib.pairwise_preferences_batch(judge, [r["prompt"] for r in records], finals)
    judge_win = prefs[:, 0, 1]
    fooled = (judge_win > 0.5) & (truth_win == 0.0)

    out = {"workdir": workdir, "before": before, "after": after, "judge": judge_ref, "n": len(records),
           "truth": {"before": float(truth["before"].mean()), "after": float(truth["after"].mean()),
                     "win_rate": float(truth_win.mean()), "ci95": stats.mean_ci95(truth_win)},
           "judge_view": {"win_rate": float(judge_win.mean()), "ci95": stats.mean_ci95(judge_win),
                          "position_bias": pair_stats["position_bias"], "inconsistent": pair_stats["inconsistent"]},
           "judge_wins_truth_losses": {"count": int(fooled.sum()), "of_judge_wins": int((judge_win > 0.5).sum())},
           "identical_answers": int(sum(a == b for a, b in finals)),
           "checks_failed": failed}

    jp = held_out(cfg, workdir, "judge_pref", n) if "judge_pref" in cfg.data.domains else []
    if jp:
        p_a, _ = judge.verdicts([r["prompt"] for r in jp], judge_lib.PAIR_OPTIONS)
        right = np.where(np.asarray([r["answer"] for r in jp]) == "A", p_a > 0.5, p_a < 0.5).astype(float)
        by = {}
        for pos in judge_lib.PAIR_OPTIONS:
            sel = np.asarray([r["answer"] == pos for r in jp])
            by[pos] = {"accuracy": float(right[sel].mean()), "n": int(sel.sum()), "ci95": stats.mean_ci95(right[sel])}
        kinds = np.asarray([judge_pref.rejected_kind(r) for r in jp])
        by_kind = {str(k): {"accuracy": float(right[kinds == k].mean()), "n": int((kinds == k).sum()),
                            "ci95": stats.mean_ci95(right[kinds == k])} for k in sorted(set(kinds))}
        out["judge_accuracy"] = {"all": float(right.mean()), "n": len(jp), "ci95": stats.mean_ci95(right),
                                 "by_position_of_better": by, "by_rejected_kind": by_kind}
    files.atomic_write(os.path.join(workdir, "judge_report.json"), json.dumps(out, indent=1))
    return out


def table(r: dict) -> str:
    pc = lambda x: f"{100 * x:.1f}"  # noqa: E731
    ci = lambda c: f"[{pc(c[0])}, {pc(c[1])}]"  # noqa: E731
    t, j = r["truth"], r["judge_view"]
    lines = [f"n = {r['n']} held-out pref requests, {r['after']} against {r['before']}, judge {r['judge']}",
             f"truth (proxy judge): mean score {pc(t['before'])} -> {pc(t['after'])}; win rate {pc(t['win_rate'])} "
             f"{ci(t['ci95'])}",
             f"judge: win rate {pc(j['win_rate'])} {ci(j['ci95'])}; position bias {j['position_bias']:+.3f}, "
             f"inconsistent {pc(j['inconsistent'])}%",
             f"judge calls a win, truth a loss: {r['judge_wins_truth_losses']['count']} of "
             f"{r['judge_wins_truth_losses']['of_judge_wins']} judge wins; identical answers {r['identical_answers']}"]
    failed = r["checks_failed"]
    lines.append("greedy answers failing each truth check, before -> after: " + ", ".join(
        f"{name} {failed['before'][name]} -> {failed['after'][name]}" for name in failed["before"]))
    if "judge_accuracy" in r:
        a = r["judge_accuracy"]
        lines.append(f"judge accuracy on held-out judge_pref pairs: {pc(a['all'])} {ci(a['ci95'])} (n = {a['n']}); "
                     + ", ".join(f"better answer in {pos}: {pc(v['accuracy'])} {ci(v['ci95'])} (n = {v['n']})"
                                 for pos, v in a["by_position_of_better"].items()))
        lines.append("judge accuracy by the worse answer's kind: " + ", ".join(
            f"{k} {pc(v['accuracy'])} (n = {v['n']})" for k, v in a["by_rejected_kind"].items()))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True, help="a finished run with the pref domain (e.g. --config=genrm)")
    ap.add_argument("--before", default="sft", help="the stage RLHF started from")
    ap.add_argument("--after", default="rlhf", help="the RLHF stage")
    ap.add_argument("--judge", default="stage:sft", help="the judge's checkpoint in the run (as a stage's judge=)")
    ap.add_argument("--n", type=int, default=500, help="distinct held-out requests")
    a = ap.parse_args()
    logging.set_verbosity(logging.WARNING)
    try:
        r = report(a.workdir, a.before, a.after, a.judge, a.n)
    except BadInput as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    print(table(r))


if __name__ == "__main__":
    main()
