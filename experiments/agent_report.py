"""Multi-turn against single-turn agents of finished runs (issue 20's question), from what the runs saved: each
stage's held-out scores of "<domain>@<agent>" (config.eval.agents) in summary.json and eval_scores/.

    python experiments/agent_report.py runs/swe_agent_s0 [runs/swe_agent_s1 ...] --out=docs/swe_agent

Prints, per run, every stage scored by every agent (pass@1 with its 95% interval, n, avg@k where the agent's
`avg_k` asked for it, mean turns, tool errors per episode, the model's tokens) and the comparison the config is
built for: `--multi` stage as the multi-turn agent against `--single` stage as the single-turn agent, on the same
items (paired bootstrap interval of the difference; of avg@k too where both have it), and over every comparison
(Student t over seeds and RL repeats, with two or more). `--single` and `--multi` take comma lists of equal length,
compared pair by pair; by default every arm pair the run has: rl_single<sfx>@single against rl_multi<sfx>@multi for
each suffix (swe_agent:rl_repeats's `_r2`, `_r3`: RL repeats from the same SFT). Writes OUT.md, OUT.json and
OUT.png (the turn distribution of each stage's multi-turn agent, and each comparison).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from matplotlib.figure import Figure  # noqa: E402

from nemocascade import files, stats  # noqa: E402
from nemocascade.errors import BadInput  # noqa: E402


def _load(workdir: str):
    path = os.path.join(workdir, "summary.json")
    if not files.exists(path):
        raise BadInput(f"{path}: no summary (is the run finished?)")
    summary = files.read_json(path)
    scores = {}
    for st in summary["stages"]:
        p = os.path.join(workdir, "eval_scores", f"{st['name']}.json")
        scores[st["name"]] = files.read_json(p) if files.exists(p) else {}
    return summary, scores


def arm_pairs(stages: list[str], single: str, multi: str) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """((single stage, agent), (multi stage, agent)) pairs: the comma lists `single` / `multi` zipped, each entry
    STAGE@AGENT; an entry without a stage (`@single`) stands for every rl_single<sfx> / rl_multi<sfx> pair in
    `stages` (run order)."""
    ones, manys = single.split(","), multi.split(",")
    if len(ones) != len(manys):
        raise BadInput(f"--single has {len(ones)} entries and --multi {len(manys)}: they are compared pair by pair")
    out = []
    for a, b in zip(ones, manys):
        (sa, aa), (sb, ab) = (x.split("@", 1) if "@" in x else (x, "") for x in (a, b))
        if not (aa and ab):
            raise BadInput(f"{a!r} / {b!r}: each side is STAGE@AGENT (the stage may be empty: @AGENT)")
        if bool(sa) != bool(sb):
            raise BadInput(f"{a!r} / {b!r}: name both stages or neither (neither: every rl_single<sfx> / "
                           "rl_multi<sfx>)")
        if sa:
            out.append(((sa, aa), (sb, ab)))
            continue
        sfxs = [n[len("rl_single"):] for n in stages if n.startswith("rl_single")]
        out += [(("rl_single" + x, aa), ("rl_multi" + x, ab)) for x in sfxs if "rl_multi" + x in stages]
    return out


def run_report(workdir: str, domain: str, single: str, multi: str) -> dict:
    """One run: every stage x agent score, and each multi stage/agent against its single on the same test items."""
    summary, scores = _load(workdir)
    rows = []
    for st in summary["stages"]:
        for key, ev in st["eval"].items():
            if key.startswith(f"{domain}@"):
                rows.append({"stage": st["name"], "agent": key.split("@", 1)[1], "pass@1": ev["pass@1"],
                             "ci95": ev["ci95"], "n": ev["n"], "turns": ev["turns"], "turns_frac": ev["turns_frac"],
                             "tool_errors": ev["tool_errors"], "mean_len": ev["mean_len"],
                             "val": st.get("val", {}).get(key, {}).get("pass@1"),
                             "avg@k": ev.get("avg@k"), "avg@k_ci95": ev.get("avg@k_ci95"), "k": ev.get("k")})
    stages = [st["name"] for st in summary["stages"]]
    comparisons = []
    pairs = arm_pairs(stages, single, multi)
    if not pairs:
        raise BadInput(f"{workdir}: no rl_single<sfx> / rl_multi<sfx> pair of stages (stages: {stages})")
    for one, many in pairs:
        for stage, agent in (one, many):
            if stage not in stages or f"{domain}@{agent}" not in scores.get(stage, {}):
                raise BadInput(f"{workdir}: no per-item scores of {domain}@{agent} after stage {stage!r} "
                               f"(stages: {stages})")
        a = scores[one[0]][f"{domain}@{one[1]}"]
        b = scores[many[0]][f"{domain}@{many[1]}"]
        diff, ci = stats.paired_diff_ci95(a, b)
        comparisons.append({"single": list(one), "multi": list(many), "n": len(a), "single_pass@1": sum(a) / len(a),
                            "multi_pass@1": sum(b) / len(b), "diff": diff, "diff_ci95": ci})
        a_k, b_k = (scores[st].get(f"avg@k/{domain}@{ag}") for st, ag in (one, many))
        if a_k and b_k:  # both sides also scored sampled (an agent's avg_k): the same comparison on avg@k
            comparisons[-1]["avg@k_diff"], comparisons[-1]["avg@k_diff_ci95"] = stats.paired_diff_ci95(a_k, b_k)
    return {"workdir": workdir, "seed": summary.get("seed"), "rows": rows, "comparisons": comparisons}


def table(rep: dict) -> str:
    lines = [f"### {rep['workdir']} (seed {rep['seed']})", "",
             "| stage | agent | pass@1 (test) | n | val | avg@k (test) | turns | turn shares 1/2/3 | tool errors | "
             "model tokens |",
             "|:--|:--|:--|--:|--:|:--|--:|:--|--:|--:|"]
    for r in rep["rows"]:
        shares = " / ".join(f"{100 * v:.0f}" for v in r["turns_frac"].values())
        val = f"{100 * r['val']:.1f}" if r["val"] is not None else "-"
        avg = (f"{stats.percent(r['avg@k'], r['avg@k_ci95'])} (k={r['k']})" if r.get("avg@k") is not None else "-")
        lines.append(f"| {r['stage']} | {r['agent']} | {stats.percent(r['pass@1'], r['ci95'])} | {r['n']} | {val} | "
                     f"{avg} | {r['turns']:.2f} | {shares} | {r['tool_errors']:.2f} | {r['mean_len']:.0f} |")
    lines.append("")
    for c in rep["comparisons"]:
        lines.append(f"{c['multi'][0]}@{c['multi'][1]} minus {c['single'][0]}@{c['single'][1]} on the same {c['n']} "
                     f"test items: {stats.percent(c['diff'], c['diff_ci95'], signed=True)} (paired bootstrap)"
                     + (f"; avg@k {stats.percent(c['avg@k_diff'], c['avg@k_diff_ci95'], signed=True)}"
                        if "avg@k_diff" in c else "") + "  ")
    return "\n".join(lines)


def plot(reports: list[dict], out_png: str) -> None:
    fig = Figure(figsize=(11, 4))
    ax1, ax2 = fig.subplots(1, 2)
    multi = [r for r in reports[0]["rows"] if r["agent"] == reports[0]["comparisons"][0]["multi"][1]]
    width = 0.8 / max(len(multi), 1)
    for i, r in enumerate(multi):
        ks = list(r["turns_frac"])
        ax1.bar([int(k) + (i - (len(multi) - 1) / 2) * width for k in ks],
                [100 * v for v in r["turns_frac"].values()], width=width, label=f"after {r['stage']}")
    ax1.set_xticks(sorted({int(k) for r in multi for k in r["turns_frac"]}))
    ax1.set_xlabel("turns per episode (multi-turn agent, held-out test)")
    ax1.set_ylabel("% of episodes")
    ax1.set_title(f"seed {reports[0]['seed']}")
    ax1.legend()
    labels = []
    for rep in reports:
        for c in rep["comparisons"]:
            j = len(labels)
            for k, name in enumerate(("single", "multi")):
                row = next(r for r in rep["rows"] if (r["stage"], r["agent"]) == tuple(c[name]))
                lo, hi = (100 * x for x in row["ci95"])
                ax2.bar(j + (k - 0.5) * 0.4, 100 * row["pass@1"], width=0.4, color=("tab:gray", "tab:blue")[k],
                        yerr=[[100 * row["pass@1"] - lo], [hi - 100 * row["pass@1"]]], capsize=4,
                        label=f"{c[name][1]}-turn agent after its RL" if j == 0 else None)
            labels.append(f"seed {rep['seed']}\n{c['single'][0]}\n{c['multi'][0]}")
    first = reports[0]["rows"][0]["stage"] if reports[0]["rows"] else None  # the arms' start (sft), as reference
    c0 = reports[0]["comparisons"][0]
    for k, name in enumerate(("single", "multi")):
        row = next((r for r in reports[0]["rows"] if (r["stage"], r["agent"]) == (first, c0[name][1])), None)
        if row and first not in (c0["single"][0], c0["multi"][0]):
            ax2.axhline(100 * row["pass@1"], color=("tab:gray", "tab:blue")[k], linestyle="--", linewidth=1,
                        label=f"{c0[name][1]}-turn agent after {first}")
    ax2.set_xticks(range(len(labels)), labels, fontsize=7)
    ax2.set_ylabel("held-out pass@1 (%)")
    ax2.set_title("same token budget (95% intervals)")
    ax2.set_ylim(0, 100)
    ax2.legend(loc="lower center")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workdirs", nargs="+")
    ap.add_argument("--domain", default="swe")
    ap.add_argument("--single", default="@single", help="STAGE@AGENT[,...] of the single-turn side (no stage: every "
                    "rl_single<sfx>)")
    ap.add_argument("--multi", default="@multi", help="STAGE@AGENT[,...] of the multi-turn side (no stage: every "
                    "rl_multi<sfx>)")
    ap.add_argument("--out", default=None, help="prefix for OUT.md, OUT.json and OUT.png")
    a = ap.parse_args()
    try:
        reports = [run_report(w, a.domain, a.single, a.multi) for w in a.workdirs]
    except (BadInput, ValueError) as e:
        sys.exit(f"agent_report: {e}")
    text = "\n\n".join(table(r) for r in reports)
    diffs = [c["diff"] for r in reports for c in r["comparisons"]]
    over = stats.seeds_ci95(diffs)
    text += (f"\n\nover {len(diffs)} comparisons (seeds x RL repeats): mean difference "
             f"{100 * sum(diffs) / len(diffs):+.1f} points"
             + (f", Student t {stats.percent_interval(over, signed=True)}" if over else " (one: no interval)"))
    print(text)
    if a.out:
        files.atomic_write(a.out + ".md", text + "\n")
        files.atomic_write(a.out + ".json", json.dumps({"runs": reports, "seeds_mean_diff": sum(diffs) / len(diffs),
                                                        "seeds_ci95": over}, indent=1))
        plot(reports, a.out + ".png")


if __name__ == "__main__":
    main()
