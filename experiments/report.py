"""Compare finished runs (e.g. seeds of one config): per-stage held-out pass@1, wall time, and one plot of
the quick-eval curve (pass@1 on held-out examples against global step) of every run.

    python experiments/report.py runs/cascade_math_s0 runs/cascade_math_s1 --out=docs/cascade_math
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from matplotlib.figure import Figure  # noqa: E402

from nemocascade import files  # noqa: E402
from nemocascade.run_log import load_metrics  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workdirs", nargs="+")
    ap.add_argument("--out", default=None, help="prefix for OUT.md and OUT.png")
    a = ap.parse_args()
    summaries = [files.read_json(os.path.join(w, "summary.json")) for w in a.workdirs]
    stages = [s["name"] for s in summaries[0]["stages"]]
    domain = next(iter(summaries[0]["stages"][0]["eval"]))
    n = summaries[0]["stages"][0]["eval"][domain]["n"]
    lines = ["| seed | " + " | ".join(f"{s} pass@1" for s in stages) + " | gain | wall (min) |",
             "|--:|" + "--:|" * (len(stages) + 2)]
    gains = []
    for s in summaries:
        scores = [st["eval"][domain]["pass@1"] * 100 for st in s["stages"]]
        gains.append(scores[-1] - scores[0])
        lines.append(f"| {s['seed']} | " + " | ".join(f"{x:.1f}" for x in scores) +
                     f" | {gains[-1]:+.1f} | {s['total_wall_s'] / 60:.1f} |")
    lines.append(f"\nheld-out {domain}, n={n}, greedy; gain = last stage minus first, in points "
                 f"(mean {sum(gains) / len(gains):+.1f})")
    table = "\n".join(lines)
    print(table)

    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    key = f"eval/{domain}/pass@1"
    for w, s in zip(a.workdirs, summaries):
        rows = [r for r in load_metrics(os.path.join(w, "metrics.jsonl")) if key in r]
        ax.plot([r["global_step"] for r in rows], [100 * r[key] for r in rows], marker="o", ms=3,
                label=f"seed {s['seed']}")
    boundary = max(r["global_step"] for r in load_metrics(os.path.join(a.workdirs[0], "metrics.jsonl"))
                   if r["stage"] == stages[0]) + 0.5
    ax.axvline(boundary, ls=":", c="gray")
    ax.text(boundary, 2, f" {stages[0]} | {' -> '.join(stages[1:])}", color="gray")
    ax.set_xlabel("global step")
    ax.set_ylabel(f"held-out {domain} pass@1 (%)")
    ax.set_title("quick eval during training (subset of the held-out split)")
    ax.grid(alpha=0.3)
    ax.legend()
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        fig.savefig(a.out + ".png", dpi=110, bbox_inches="tight")
        with open(a.out + ".md", "w") as f:
            f.write(table + "\n")
        print(f"wrote {a.out}.png and {a.out}.md")


if __name__ == "__main__":
    main()
