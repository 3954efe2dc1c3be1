"""LoRA against full fine-tuning on one GRPO step: speed and memory, on SmolLM2-135M-Instruct.

    python benchmarks/lora.py --out=runs/lora_bench [--ranks=0,16] [--shape=4x16x24] [--steps=3] [--rounds=2]

Each round runs one process per rank (`speed.py --side=ours --what=grpo --lora_rank=R`; rank 0 trains every
param), alternating (A B A B), so each process's resident peak is its own. Per rank, medians over rounds of: the
step's seconds (generate, train; LoRA's generate includes merging the adapters into the params, as the Trainer
does), what the optimiser updates and keeps (`state_mb`: params or adapters, plus Adam's two moments), the compiled
step's scratch (`step_temp_mb`, XLA's memory analysis) and the process's resident peak (`peak_rss_mb`, which also
holds the frozen float32 params both sides load). Ratios are against rank 0. Time it on an idle machine only.
Held-out results of a LoRA stage against a full one come from runs, not from here (README "LoRA").
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

KEYS = (("step_s", "step s"), ("generate", "generate s"), ("train", "train s"), ("state_mb", "state MiB"),
        ("step_temp_mb", "step scratch MiB"), ("peak_rss_mb", "peak RSS MiB"))


def measure(rank: int, args, out: str) -> dict:
    cmd = [sys.executable, os.path.join(HERE, "speed.py"), "--side=ours", "--what=grpo", f"--grpo_shapes={args.shape}",
           "--mopd_shapes=", f"--steps={args.steps}", f"--lora_rank={rank}", f"--ckpt={args.ckpt}", f"--out={out}"]
    rc = subprocess.run(cmd).returncode
    if rc or not os.path.exists(out):
        raise SystemExit(f"[lora] rank {rank}: speed.py exited {rc} ({' '.join(cmd)})")
    with open(out) as f:
        got = json.load(f)
    step = got["grpo"][args.shape]
    return {"step_s": step["step_s"], **step["phases_s"], "state_mb": step["state_mb"],
            "step_temp_mb": step["step_temp_mb"], "peak_rss_mb": got["peak_rss_mb"]}


def table(rows: dict[int, dict]) -> str:
    base = rows[0] if 0 in rows else None
    head = "| rank | " + " | ".join(label for _, label in KEYS) + " |"
    lines = [head, "|" + "--:|" * (len(KEYS) + 1)]
    for rank, r in rows.items():
        cells = []
        for key, _ in KEYS:
            v = r.get(key)
            cell = "" if v is None else f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
            if base is not None and rank != 0 and v is not None and base.get(key):
                cell += f" ({v / base[key]:.2f}x)"
            cells.append(cell)
        lines.append(f"| {rank or 'full'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/lora_bench")
    ap.add_argument("--ckpt", default="", help="a Hugging Face directory (default: OUT/smollm2_hf, written once)")
    ap.add_argument("--ranks", default="0,16", help="comma-separated; 0 is full fine-tuning (the ratios' base)")
    ap.add_argument("--shape", default="4x16x24", help="prompts x rollouts x new tokens (smollm2_cascade's GRPO)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    ranks = [int(r) for r in args.ranks.split(",") if r.strip()]
    if not ranks or min(ranks) < 0 or len(set(ranks)) != len(ranks):
        ap.error(f"--ranks={args.ranks!r}: distinct integers >= 0")
    os.makedirs(args.out, exist_ok=True)
    import speed  # noqa: E402  (benchmarks/ is on the path: this script's folder)
    args.ckpt = speed.ensure_checkpoint(args.ckpt or os.path.join(args.out, "smollm2_hf"))
    runs = {r: [] for r in ranks}
    for k in range(args.rounds):
        for rank in ranks:
            print(f"[lora] round {k + 1}/{args.rounds}: rank {rank}", flush=True)
            runs[rank].append(measure(rank, args, os.path.join(args.out, f"rank{rank}_round{k}.json")))
    rows = {r: {key: statistics.median(x[key] for x in runs[r]) for key in runs[r][0] if runs[r][0][key] is not None}
            for r in ranks}
    text = table(rows)
    with open(os.path.join(args.out, "lora.json"), "w") as f:
        json.dump({"args": vars(args), "runs": runs, "medians": rows}, f, indent=1)
    with open(os.path.join(args.out, "lora_table.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
