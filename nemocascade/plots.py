"""Pictures and tables of a run: training curves across the cascade, eval scores after each stage.

Inputs are the files described in docs/run_output.md (``metrics.jsonl``, ``summary.json``).
The eval-by-stage view is the one METHOD.md asks the cascade to show ("after every stage, evaluate
every domain", C1's per-stage tables): whether later stages regress earlier domains.
"""

from __future__ import annotations

import io
import math

# Figure objects, not pyplot: savefig renders through Agg, nothing opens a window, and importing
# this module does not switch the backend of a notebook that also plots inline.
from matplotlib.figure import Figure
import numpy as np

from nemocascade import files, stats
from nemocascade.run_log import load_metrics


def _trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    """out[i] = mean(values[max(0, i-window+1) : i+1]); the window shrinks at the start."""
    csum = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(idx - window, 0)
    return (csum[idx] - csum[lo]) / (idx - lo)


def _save(fig, out_png: str) -> None:
    """Render to memory, then one atomic write (local or remote: `files`)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    files.atomic_write(out_png, buf.getvalue())


def plot_metric_curves(
    metrics_jsonl: str, out_png: str, keys: list[str], smooth: int = 1, title: str | None = None
) -> None:
    """`metric_curves_figure` written to `out_png`."""
    _save(metric_curves_figure(metrics_jsonl, keys, smooth, title), out_png)


def metric_curves_figure(metrics_jsonl: str, keys: list[str], smooth: int = 1, title: str | None = None) -> Figure:
    """One subplot per metric key against the cascade-wide global step; dotted lines = stage starts.

    ``smooth`` > 1 draws a trailing mean over that many logged steps, computed within each stage (a
    stage's reward scale says nothing about the next one's), over the raw values drawn as faint points (a
    held-out score logged every few steps is a handful of points: each stays visible under the mean).
    A key logged by no stage is a ValueError listing the keys that exist.
    """
    if smooth < 1:
        raise ValueError(f"smooth must be >= 1, got {smooth}")
    rows = load_metrics(metrics_jsonl)
    if not rows:
        raise ValueError(f"{metrics_jsonl} holds no metrics")
    available = sorted({k for r in rows for k in r} - {"stage", "step", "global_step", "time"})
    for key in keys:
        if key not in available:
            raise ValueError(f"metric {key!r} is not in {metrics_jsonl}; available: {available}")
    stage_starts: dict[str, int] = {}
    for r in rows:
        stage_starts.setdefault(r["stage"], r["global_step"])

    fig = Figure(figsize=(8, 2.6 * len(keys)), layout="constrained")
    axes = fig.subplots(len(keys), 1, sharex=True, squeeze=False)
    for ax, key in zip(axes[:, 0], keys):
        for stage in stage_starts:
            pts = [(r["global_step"], r[key]) for r in rows if r["stage"] == stage and key in r]
            if not pts:
                continue
            x, y = np.array(pts, dtype=float).T
            if smooth > 1:
                ax.plot(x, y, color="C0", alpha=0.35, linestyle="none", marker="o", markersize=2.5, label="_raw")
                y = _trailing_mean(y, smooth)
            ax.plot(x, y, color="C0", linewidth=1.5)
        for stage, start in stage_starts.items():
            ax.axvline(start, color="gray", linestyle=":", linewidth=1)
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    top = axes[0, 0]
    for stage, start in stage_starts.items():
        # x in data units, y in axes units: labels sit just above the top subplot whatever its y range.
        top.text(
            start, 1.02, stage, transform=top.get_xaxis_transform(), fontsize=8, ha="left", va="bottom", rotation=30
        )
    axes[-1, 0].set_xlabel("global step")
    if title:
        fig.suptitle(title)
    return fig


def _rows(summary: dict) -> list[dict]:
    """The stages, preceded by the starting model's evaluation when the run made one (`summary["init"]`)."""
    init = summary.get("init")
    return ([{"name": "init", "eval": init["eval"]}] if init else []) + summary["stages"]


def _label(stage: dict) -> str:
    """A stage's name; a side branch (it does not advance the main line) in brackets: `[rlhf_branch]`."""
    return f"[{stage['name']}]" if stage.get("side_branch") else stage["name"]


def _domains(summary: dict) -> list[str]:
    """Eval domains in order of first appearance across the stages."""
    seen: dict[str, None] = {}
    for stage in _rows(summary):
        for domain in stage["eval"]:
            seen.setdefault(domain, None)
    return list(seen)


def plot_eval_by_stage(summary: dict, out_png: str) -> None:
    """pass@1 (percent) after each stage, one line with markers per domain; x = stages in run order.

    A domain not evaluated after some stage leaves a gap there.
    """
    stages = _rows(summary)
    if not stages:
        raise ValueError("summary has no stages to plot")
    names = [_label(s) for s in stages]
    fig = Figure(figsize=(max(5.0, 1.2 * len(names) + 2), 4), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(names))
    for i, domain in enumerate(_domains(summary)):
        y = [100 * s["eval"][domain]["pass@1"] if domain in s["eval"] else math.nan for s in stages]
        # ten colours, then the same colours dashed, so an 11th domain never repeats a line
        ax.plot(x, y, marker="o", color=f"C{i % 10}", linestyle=("-", "--", ":")[i // 10 % 3], label=domain)
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("pass@1 (%)")
    ax.set_title(f"eval after each stage: {summary.get('config', '')}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _save(fig, out_png)


def eval_table_markdown(summary: dict) -> str:
    """Markdown table: a row per stage, a column per domain, cells = pass@1 in percent to 0.1.

    The header gives each domain's ``n`` when it is the same after every stage (``math (n=500)``);
    otherwise each cell carries its own (``42.0 (n=500)``). A missing eval is ``-``.
    A side-branch stage's name is in brackets. No trailing newline.
    Example: ``| stage | math (n=500) |`` / ``|:--|--:|`` / ``| sft | 42.0 |``.
    """
    domains = _domains(summary)
    stages = _rows(summary)
    ns = {d: {s["eval"][d]["n"] for s in stages if d in s["eval"]} for d in domains}
    header = ["stage"] + [f"{d} (n={next(iter(ns[d]))})" if len(ns[d]) == 1 else d for d in domains]
    lines = ["| " + " | ".join(header) + " |", "|:--|" + "--:|" * len(domains)]
    for s in stages:
        cells = [_label(s)]
        for d in domains:
            if d not in s["eval"]:
                cells.append("-")
                continue
            cell = f"{100 * s['eval'][d]['pass@1']:.1f}"
            cells.append(cell if len(ns[d]) == 1 else f"{cell} (n={s['eval'][d]['n']})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_table_markdown(summary: dict, key: str = "paired_vs_start") -> str:
    """Markdown table of each stage's paired gain over the stage it started from (`paired_vs_start`: the same test
    items, paired bootstrap 95% interval), in points: a row per stage, a column per domain, its own domains'
    cells in bold (claim (a): an RL stage raises its own domain; the others are claim (b): what it costs them).
    `key="paired_vs_start_avg@k"`: the same for avg@k (each item's k-sample mean).
    Empty string when no stage has paired gains. No trailing newline.
    Example row: ``| if_rl (from sft) | **+22.8 [+19.0, +26.6]** | -4.0 [-7.0, -1.0] |``."""
    stages = [s for s in summary["stages"] if s.get(key)]
    if not stages:
        return ""
    domains = _domains(summary)
    lines = ["| stage (from) | " + " | ".join(domains) + " |", "|:--|" + "--:|" * len(domains)]
    for s in stages:
        cells = []
        for d in domains:
            p = s[key].get(d)
            cell = "-" if p is None else stats.percent(p["mean_gain"], p["ci95"], signed=True)
            cells.append(f"**{cell}**" if p is not None and d in s.get("domains", ()) else cell)
        lines.append(f"| {_label(s)} (from {s.get('started_from')}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_stage_comparison(metrics_jsonl: str, out_png: str, stages: list[str], key: str, start: float | None = None,
                          title: str | None = None) -> None:
    """`key` against each stage's own step, one line per stage, on one axis: arms of an experiment that start
    from the same checkpoint (mopd_vs_grpo, as Cascade 2's Figure 3). `start`: the shared checkpoint's value,
    drawn at step 0 of every arm."""
    rows = load_metrics(metrics_jsonl)
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    for i, stage in enumerate(stages):
        pts = [(r["step"] + 1, r[key]) for r in rows if r["stage"] == stage and key in r]
        if not pts:
            raise ValueError(f"stage {stage!r} logged no {key!r} in {metrics_jsonl}")
        if start is not None:
            pts = [(0, start)] + pts
        x, y = np.array(pts, dtype=float).T
        ax.plot(x, 100 * y, marker="o", color=f"C{i}", label=stage)
    ax.set_xlabel("training step of the arm")
    ax.set_ylabel(f"{key} (%)")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title or key)
    _save(fig, out_png)


def plot_sweep(sweep: dict, out_png: str) -> None:
    """Mean pass@1 (percent) over seeds after each stage, one line per domain, with its 95% band across seeds
    (sweep.json from nemocascade/sweep.py); the seeds' own values as faint dots."""
    stages = sweep["stages"]
    if not stages:
        raise ValueError("sweep has no stages to plot")
    domains = list(dict.fromkeys(d for s in stages for d in s["eval"]))
    fig = Figure(figsize=(max(5.0, 1.2 * len(stages) + 2), 4), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(stages))
    for i, domain in enumerate(domains):
        rows = [s["eval"].get(domain) for s in stages]
        mean = np.array([100 * r["mean"] if r else math.nan for r in rows])
        lo = np.array([100 * r["ci95"][0] if r and r["ci95"] else math.nan for r in rows])
        hi = np.array([100 * r["ci95"][1] if r and r["ci95"] else math.nan for r in rows])
        color = f"C{i % 10}"
        ax.plot(x, mean, marker="o", color=color, label=domain)
        ax.fill_between(x, lo, hi, color=color, alpha=0.15)
        for j, r in enumerate(rows):
            if r:
                ax.plot([j] * len(r["per_seed"]), [100 * v for v in r["per_seed"]], ".", color=color, alpha=0.35)
    ax.set_xticks(x, [s["name"] for s in stages], rotation=30, ha="right")
    ax.set_ylabel("pass@1 (%), mean over seeds")
    seeds = sweep["seeds"]  # a short title: a long one is clipped at the figure's left edge
    ax.set_title(f"{sweep.get('config', '')}, {len(seeds)} seeds\n(bands: 95% across seeds)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _save(fig, out_png)


def plot_arms(result: dict, out_png: str) -> None:
    """One panel per regressed domain: each arm's validation curve (mean over seeds, 95% band across seeds) from
    the shared start, and the teacher's validation score as a dashed line (`sweep.arms`)."""
    domains = list(result["domains"])
    if not domains:
        raise ValueError("no regressed domain to plot: the start was within reach of every teacher")
    fig = Figure(figsize=(3.6 * len(domains), 3.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(domains)))
    for ax, d in zip(axes, domains):
        entry = result["domains"][d]
        for i, arm in enumerate(result["arms"]):
            c = entry[arm]["curve"]
            x, mean = np.array(c["steps"], float), 100 * np.array(c["mean"])
            lo = 100 * np.array([ci[0] if ci else m for ci, m in zip(c["ci95"], c["mean"])], float)
            hi = 100 * np.array([ci[1] if ci else m for ci, m in zip(c["ci95"], c["mean"])], float)
            ax.plot(x, mean, marker="o", color=f"C{i}", label=arm)
            ax.fill_between(x, lo, hi, color=f"C{i}", alpha=0.15)
        ax.axhline(100 * entry["teacher_val"], color="k", ls="--", lw=1, label="teacher")
        ax.set_title(f"{d} (n={len(entry['seeds'])} seeds)")
        ax.set_xlabel(f"step from {result['start']}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation pass@1 (%)")
    axes[0].legend(fontsize=8)
    _save(fig, out_png)
