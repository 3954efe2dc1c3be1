"""avg@k in held-out evaluation: k samples per record at the sampling temperature, each record's mean, then the
mean over records with an interval over records (hand-worked numbers)."""
import numpy as np
import pytest

from nemocascade import evaluation, stats
from nemocascade.rewards.pool import VerifierPool


def test_avg_at_k_is_the_mean_of_per_record_sample_means(monkeypatch):
    calls = []

    def fake_generate(params, model_cfg, tokenizer, records, **kw):
        calls.append(kw)
        # one call: per record its greedy answer first, then its 4 samples (one prefill per prompt)
        assert kw["num_samples"] == 5 and kw["greedy_first"] and not kw["greedy"]
        assert kw["temperature"] == 0.7 and kw["top_p"] == 0.9
        # greedy: right, wrong, right; samples: record 0 right 3 of 4, record 1 right 1 of 4, record 2 0 of 4
        boxed = ["1", "1", "1", "1", "9",   "0", "2", "9", "9", "9",   "3", "9", "9", "9", "9"]
        return [rf"\boxed{{{b}}}" for b in boxed], [2, 5, 5, 5, 5] * 3

    monkeypatch.setattr(evaluation, "generate", fake_generate)
    records = [{"domain": "math", "answer": a} for a in ("1", "2", "3")]
    with VerifierPool(num_workers=0) as pool:
        out = evaluation.evaluate(None, None, None, records, pool, batch_size=16, max_prompt_len=1, max_new_tokens=1,
                                  rng=np.zeros(2, np.uint32), avg_k=4, temperature=0.7, top_p=0.9)
    assert out["pass@1"] == pytest.approx(2 / 3) and out["scores"] == [1.0, 0.0, 1.0]
    assert out["mean_len"] == 2.0  # the greedy answers' lengths
    assert out["k"] == 4 and out["avg@k"] == pytest.approx((0.75 + 0.25 + 0.0) / 3)
    assert out["avg@k_ci95"] == pytest.approx(stats.mean_ci95([0.75, 0.25, 0.0]))
    assert out["avg@k_scores"] == [0.75, 0.25, 0.0]  # per record, in order: for paired comparisons
    assert len(calls) == 1 and calls[0]["batch_size"] == 3  # 16 rows shared by 1 + 4 answers per record
    assert out["verifier_errors"] == 0


def test_no_avg_at_k_by_default(monkeypatch):
    monkeypatch.setattr(evaluation, "generate", lambda *a, **k: ([r"\boxed{1}"], [1]))
    with VerifierPool(num_workers=0) as pool:
        out = evaluation.evaluate(None, None, None, [{"domain": "math", "answer": "1"}], pool, batch_size=1,
                                  max_prompt_len=1, max_new_tokens=1, rng=None)
    assert "avg@k" not in out and out["pass@1"] == 1.0


def test_eval_records_are_the_first_n_distinct_items_of_the_split():
    from nemocascade.stages.common import RunContext

    # problem keys (the id after domain/split/index/), and the prompts that word them: "b" twice in two wordings
    keys = ["a", "b", "a", "c", "b", "d", "e"]
    src = [{"prompt": f"{k} wording {i}", "id": f"math/test/{i}/{k}"} for i, k in enumerate(keys)]
    ctx = RunContext(*([None] * 5), sources={"math": {"test": src}}, log=None, param_shardings=None, pool=None)

    def ids(records):
        return [int(r["id"].split("/")[2]) for r in records]

    # a repeat (same key, any wording) is skipped, and the scan goes past the first n records to find n distinct
    assert ids(ctx.eval_records("math", "test", 4)) == [0, 1, 3, 5]
    assert ids(ctx.eval_records("math", "test", 50)) == [0, 1, 3, 5, 6]  # fewer: all
    assert ids(ctx.eval_records("math", "test")) == [0, 1, 3, 5, 6]
    # an id without a key (a real dataset's name/task_id): the prompt is the problem
    real = [{"prompt": p, "id": f"humaneval/{i}"} for i, p in enumerate(["x", "y", "x"])]
    ctx.sources["code"] = {"test": real}
    assert [r["id"] for r in ctx.eval_records("code", "test")] == ["humaneval/0", "humaneval/1"]
