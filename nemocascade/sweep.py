"""One config over several seeds: aggregate each seed's summary.json into sweep.json (docs/run_output.md).

    sweep = aggregate(config, variant, {seed: summary})
    sweep["stages"][i]["eval"][domain] = {"mean", "ci95", "n_seeds", "per_seed"}   (ci95: Student t across seeds)
    sweep["stages"][i]["avg@k"][domain] = the same for avg@k               (when the runs measured it)
    sweep["paired"] = [{"from", "to", "domain", "mean_gain", "ci95", "n_seeds", "per_seed"}]  (stage minus its start)
    sweep["paired_avg@k"] = the same for avg@k, where a stage and its start both measured it

The runs themselves are `experiments/run.py` processes (`experiments/sweep.py` starts them); this module only
reads what they wrote, so a sweep can be re-aggregated at any time, with some seeds still running.
"""
from __future__ import annotations

import numpy as np

from nemocascade import stats


def aggregate(config: str, variant: str | None, summaries: dict[int, dict]) -> dict:
    """sweep.json's content from the seeds' summaries (a stage missing in some seeds counts the seeds it has)."""
    seeds = sorted(summaries)
    order: list[str] = []
    for seed in seeds:
        order += [s["name"] for s in summaries[seed]["stages"] if s["name"] not in order]
    by_seed = {seed: {s["name"]: s for s in summaries[seed]["stages"]} for seed in seeds}
    for seed in seeds:
        if summaries[seed].get("init"):
            by_seed[seed]["init"] = {"name": "init", "eval": summaries[seed]["init"]["eval"], "started_from": None}
    stages, paired = [], {"pass@1": [], "avg@k": []}
    for name in (["init"] if any("init" in by_seed[s] for s in seeds) else []) + order:
        present = [s for s in seeds if name in by_seed[s]]
        domains = list(dict.fromkeys(d for s in present for d in by_seed[s][name]["eval"]))
        stages.append({"name": name, "eval": {d: _over_seeds([by_seed[s][name]["eval"][d]["pass@1"] for s in present
                                                              if d in by_seed[s][name]["eval"]]) for d in domains}})
        avg = {d: [by_seed[s][name]["eval"][d]["avg@k"] for s in present
                   if "avg@k" in by_seed[s][name]["eval"].get(d, {})] for d in domains}
        if any(avg.values()):  # avg@k at the sampling temperature, where the runs measured it
            stages[-1]["avg@k"] = {d: _over_seeds(v) for d, v in avg.items() if v}
        starts = {by_seed[s][name].get("started_from") or ("init" if "init" in by_seed[s] and name != "init" else None)
                  for s in present}
        start = starts.pop() if len(starts) == 1 else None
        if start is None:
            continue
        for metric, d in ((m, d) for m in paired for d in domains):
            gains = [by_seed[s][name]["eval"][d][metric] - by_seed[s][start]["eval"][d][metric] for s in present
                     if start in by_seed[s] and metric in by_seed[s][name]["eval"].get(d, {})
                     and metric in by_seed[s][start]["eval"].get(d, {})]
            if gains:
                row = _over_seeds(gains)
                paired[metric].append({"from": start, "to": name, "domain": d, "mean_gain": row["mean"],
                                       "ci95": row["ci95"], "n_seeds": row["n_seeds"], "per_seed": row["per_seed"]})
    return {"config": config, "variant": variant, "seeds": seeds, "stages": stages, "paired": paired["pass@1"],
            "paired_avg@k": paired["avg@k"]}


def _over_seeds(values) -> dict:
    return {"mean": float(np.mean(values)), "ci95": stats.seeds_ci95(values), "n_seeds": len(values),
            "per_seed": [float(v) for v in values]}


def table_markdown(sweep: dict) -> str:
    """Stages x domains, cells "mean [low, high]" in percent (a single seed: the mean alone), the same for avg@k
    where measured, then the paired gains of each stage over its start. No trailing newline."""
    domains = list(dict.fromkeys(d for s in sweep["stages"] for d in s["eval"]))
    n = len(sweep["seeds"])
    lines = [f"seeds {sweep['seeds']}: mean over seeds [95% interval, Student t]", ""]
    lines += _stage_table(sweep["stages"], domains, "eval")
    if any("avg@k" in s for s in sweep["stages"]):
        lines += ["", "avg@k at the sampling temperature (k samples per item), mean over seeds [95% interval]:", ""]
        lines += _stage_table([s for s in sweep["stages"] if "avg@k" in s], domains, "avg@k")
    for key, what in (("paired", "paired gain over the stage's start"), ("paired_avg@k", "paired avg@k gain")):
        if not sweep.get(key):
            continue
        lines += ["", f"{what}, per seed then averaged (n={n} seeds):", "",
                  "| from -> to | domain | gain | 95% interval |", "|:--|:--|--:|--:|"]
        for p in sweep[key]:
            ci = stats.percent_interval(p["ci95"], signed=True) if p["ci95"] else "-"
            lines.append(f"| {p['from']} -> {p['to']} | {p['domain']} | {stats.percent(p['mean_gain'], signed=True)}"
                         f" | {ci} |")
    return "\n".join(lines)


def _stage_table(stages, domains, key: str) -> list[str]:
    """A row per stage, a column per domain, cells from `stage[key][domain]` (the over-seeds rows)."""
    return ["| stage | " + " | ".join(domains) + " |", "|:--|" + "--:|" * len(domains)] + [
        f"| {s['name']} | " + " | ".join(_cell(s[key].get(d)) for d in domains) + " |" for s in stages]


def _cell(row, signed: bool = False) -> str:
    return "-" if row is None else stats.percent(row["mean"], row["ci95"], signed)


def arms(summaries: dict[int, dict], metrics: dict[int, list[dict]], stages: tuple[str, ...], start: str,
         within: float = 0.01) -> dict:
    """Recovery arms from one checkpoint across seeds (claim (c): MOPD against GRPO from the same regressed student).

    `summaries` / `metrics`: seed -> summary.json / metrics.jsonl rows; `stages`: the arms (side branches or the
    main line, all started from `start`); the teacher of each domain is the teacher a distilling arm names (its
    `teacher_scores`, on validation). Per seed and domain, a domain counts as *regressed* when `start` scores more
    than `within` under its teacher on validation. For each arm and regressed domain: the validation curve
    (`start`'s score at step 0, then the arm's quick evals), the first step within `within` of the teacher (None:
    never), and the arm's final test score against the teacher's test score. Returns
    {"arms", "start", "within", "domains": {domain: {"seeds": [...], "teacher_val": mean, per arm: {
     "curve": {"steps", "mean", "ci95": [[lo, hi] | None per step]}, "steps_to_teacher": [per seed],
     "final_test": {"mean", "ci95", ...}, "final_gap_test": {"mean", "ci95", ...}}}}}.
    """
    teacher_arm = next((a for a in stages if any(s["name"] == a and s.get("teacher_scores")
                                                 for summary in summaries.values() for s in summary["stages"])), None)
    if teacher_arm is None:
        raise ValueError(f"none of the arms {stages} distils from teachers (no teacher_scores in any summary)")
    out = {"arms": list(stages), "start": start, "within": within, "domains": {}}
    per_domain: dict = {}
    for seed in sorted(summaries):
        by_name = {s["name"]: s for s in summaries[seed]["stages"]}
        if start not in by_name or not all(a in by_name for a in stages):
            continue  # this seed has not finished every arm
        distil = by_name[teacher_arm]
        teacher_test = {d: by_name[t.partition(":")[2]]["eval"][d]["pass@1"] for d, t in distil["teachers"].items()}
        for d, t_val in distil["teacher_scores"].items():
            s_val = by_name[start]["val"][d]["pass@1"]
            if t_val - s_val <= within:
                continue
            row = per_domain.setdefault(d, {"seeds": [], "teacher_val": [], **{a: [] for a in stages}})
            row["seeds"].append(seed)
            row["teacher_val"].append(t_val)
            for a in stages:
                pts = [(0, s_val)] + [(r["step"] + 1, r[f"eval/{d}/pass@1"]) for r in metrics[seed]
                                      if r["stage"] == a and f"eval/{d}/pass@1" in r]
                reached = next((step for step, v in pts if v >= t_val - within), None)
                final = by_name[a]["eval"][d]["pass@1"]
                row[a].append({"curve": pts, "steps_to_teacher": reached, "final_test": final,
                               "final_gap_test": teacher_test[d] - final})
    for d, row in per_domain.items():
        entry = {"seeds": row["seeds"], "teacher_val": float(np.mean(row["teacher_val"]))}
        for a in stages:
            runs = row[a]
            curves = [dict(r["curve"]) for r in runs]
            steps = sorted(set().union(*curves))
            values = [[c[s] for c in curves if s in c] for s in steps]
            entry[a] = {
                "curve": {"steps": steps, "mean": [float(np.mean(vs)) for vs in values],
                          "ci95": [stats.seeds_ci95(vs) for vs in values]},
                "steps_to_teacher": [r["steps_to_teacher"] for r in runs],
                "final_test": _over_seeds([r["final_test"] for r in runs]),
                "final_gap_test": _over_seeds([r["final_gap_test"] for r in runs])}
        out["domains"][d] = entry
    return out


def arms_markdown(result: dict) -> str:
    """Per regressed domain and arm: seeds in which it regressed, steps to come within `within` of the teacher
    (validation; per seed, '-' = never), final test score and gap to the teacher with intervals. No trailing
    newline."""
    w = 100 * result["within"]
    lines = [f"arms from {result['start']}: steps to within {w:g} point(s) of the teacher (validation quick evals), "
             "final test score and the teacher's test score minus it, mean over seeds [95% interval]", "",
             "| domain | arm | seeds | steps to teacher (per seed) | final test | gap to teacher |",
             "|:--|:--|--:|:--|--:|--:|"]
    for d, entry in result["domains"].items():
        for a in result["arms"]:
            e = entry[a]
            steps = ", ".join("-" if s is None else str(s) for s in e["steps_to_teacher"])
            lines.append(f"| {d} | {a} | {len(entry['seeds'])} | {steps} | {_cell(e['final_test'])} | "
                         f"{_cell(e['final_gap_test'], signed=True)} |")
    return "\n".join(lines)
