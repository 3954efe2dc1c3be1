"""Multi-turn rollouts: the KV cache kept across turns gives the tokens of re-encoding the whole trajectory; the
loss reads the model's tokens only; budgets hold; the environments (swe_repair, tool_exec, python) and their
sandboxing."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nemocascade import envs, sampling
from nemocascade.models import transformer as tf
from nemocascade.rl import episodes, update

CFG = tf.ModelConfig(vocab_size=23, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48)
STOPS = (4, 9)  # <|im_end|> and a second stop piece (a tool-call close)


def _params():
    p = tf.init_params(CFG, jax.random.key(0))
    leaves, treedef = jax.tree.flatten(p)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    return jax.tree.unflatten(treedef, [x + jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def _left_pad(prompts, width):
    toks = np.zeros((len(prompts), width), np.int32)
    for b, p in enumerate(prompts):
        toks[b, width - len(p):] = p
    return toks, np.asarray([len(p) for p in prompts], np.int32)


def _three_turns(params, prompts, obs_by_turn, G=2, max_new=6, budget=40, chunk=None):
    toks, lens = _left_pad(prompts, 5)
    ep = sampling.begin_episodes(params, CFG, jnp.asarray(toks), jnp.asarray(lens), slots=64, num_samples=G)
    talking = np.ones(len(prompts) * G, bool)
    for turn, obs in enumerate(obs_by_turn + [None]):
        ep = sampling.decode_turn(params, CFG, ep, jnp.asarray(talking), jax.random.key(turn), max_new_tokens=max_new,
                                  budget=budget, stop_ids=np.asarray(STOPS, np.int32), greedy=True, chunk=chunk)
        if obs is None:
            break
        width = max(len(o) for o in obs) + 3  # right padding inside the chunk too
        obs_tok = np.zeros((len(obs), width), np.int32)
        for b, o in enumerate(obs):
            obs_tok[b, :len(o)] = o
        talking = np.asarray([len(o) > 0 for o in obs])  # a row without an observation ended its episode
        ep = sampling.append_observations(params, CFG, ep, jnp.asarray(obs_tok),
                                          jnp.asarray([len(o) for o in obs], np.int32), chunk=chunk)
    return ep, toks, lens


@pytest.mark.parametrize("chunk", [0, 16])
def test_kv_cache_across_turns_equals_reencoding_the_whole_trajectory(chunk):
    """Three greedy turns with observations of different lengths (one row's episode ends after turn 1): every
    model token is the argmax of ONE full forward pass over the compacted trajectory before it (prompt, turns,
    observations, no empty slots), and its log-prob is that pass's log-softmax. Dense cache attention and chunked
    (16 slots a read, up to the filled ones) alike."""
    params = _params()
    prompts = [[3, 5, 6, 9, 2], [7, 8]]
    obs1 = [[10, 11, 12], [13], [14, 15, 16, 17, 18], []]
    obs2 = [[19], [20, 21], [22, 10, 11, 12, 13, 14], []]
    ep, toks, lens = _three_turns(params, prompts, [obs1, obs2], chunk=chunk)
    traj = episodes.Trajectories(np.repeat(toks, 2, 0), np.repeat(lens, 2, 0), *map(np.asarray, (
        ep.tokens, ep.kind, ep.logprobs)), rewards=np.zeros(4), turns=np.zeros(4), tool_errors=np.zeros(4),
        done=np.zeros(4, bool), env_s=0.0, texts=[])
    tokens, valid, positions, mask, sampler_logp = episodes.compact(traj)
    checked_model, checked_obs = 0, 0
    for b in range(4):
        cols = np.flatnonzero(valid[b])
        seq = tokens[b, cols].tolist()
        kinds = ([0] * int(lens[b // 2])) + [k for k in np.asarray(ep.kind[b]).tolist() if k]
        logits = tf.forward(params, CFG, jnp.asarray([seq], jnp.int32))[0]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
        for t in range(1, len(seq)):
            if kinds[t] == sampling.MODEL:
                assert seq[t] == int(jnp.argmax(logits[t - 1])), (b, t)
                np.testing.assert_allclose(sampler_logp[b, cols[t] - 1], float(logp[t - 1, seq[t]]), atol=2e-5)
                checked_model += 1
            elif kinds[t] == sampling.OBSERVATION:
                checked_obs += 1
        # the observations sit where they were appended, in order
        obs_seen = [x for x, k in zip(seq, kinds) if k == sampling.OBSERVATION]
        assert obs_seen == obs1[b] + (obs2[b] if obs1[b] else [])
        turns, cur = [], []  # each turn ends at a stop id or at its 6-token limit
        for x, k in zip(seq, kinds):
            if k == sampling.MODEL:
                cur.append(x)
            elif cur:
                turns, cur = turns + [cur], []
        for turn in turns + ([cur] if cur else []):
            assert turn[-1] in STOPS or len(turn) == 6, turn
            assert not set(turn[:-1]) & set(STOPS)
    assert checked_model > 20 and checked_obs == sum(map(len, obs1 + obs2))
    # a row that stopped on a stop id talked again after its observation; the row without one never did
    kinds3 = np.asarray(ep.kind[3])
    assert (kinds3 == sampling.OBSERVATION).sum() == 0 and (kinds3 == sampling.MODEL).sum() <= 6


def test_per_row_token_budget_and_turn_limit():
    params = _params()
    ep, _, _ = _three_turns(params, [[3, 5, 6], [7, 8]], [[[10], [11], [12], [14]]], max_new=5, budget=7)
    used, kind = np.asarray(ep.used), np.asarray(ep.kind)
    assert (used <= 7).all() and (used == (kind > 0).sum(1)).all()
    # every turn is at most 5 model tokens long: count runs of MODEL in the slot timeline per row
    for row in kind:
        runs, n = [], 0
        for k in row:
            if k == sampling.MODEL:
                n += 1
            elif n and k == sampling.OBSERVATION:
                runs.append(n)
                n = 0
        assert max(runs + [n]) <= 5


def test_loss_mask_covers_the_model_tokens_only():
    """A hand-built trajectory: prompt [1, 2], slots MODEL MODEL EMPTY OBS OBS MODEL EMPTY. The training row is the
    compacted 1 2 | 5 6 | 8 9 | 7 with the loss mask on the targets 5, 6 and 7 only; the GRPO loss through the
    trainer's own log-probs equals -A times the mean of exactly those three log-probs (numpy, from a full forward)."""
    M, O, E = sampling.MODEL, sampling.OBSERVATION, sampling.EMPTY
    traj = episodes.Trajectories(
        prompts=np.asarray([[0, 1, 2]]), prompt_lens=np.asarray([2]), tokens=np.asarray([[5, 6, 0, 8, 9, 7, 0]]),
        kind=np.asarray([[M, M, E, O, O, M, E]], np.int8), logprobs=np.asarray([[-1.0, -2.0, 0, 0, 0, -3.0, 0]]),
        rewards=np.asarray([1.0]), turns=np.asarray([2]), tool_errors=np.asarray([0]), done=np.asarray([True]),
        env_s=0.0, texts=[])
    tokens, valid, positions, mask, sampler_logp = episodes.compact(traj)
    assert tokens.tolist() == [[0, 1, 2, 5, 6, 8, 9, 7]]
    assert valid.tolist() == [[False] + [True] * 7]
    assert positions.tolist() == [[0, 0, 1, 2, 3, 4, 5, 6]]
    assert mask.tolist() == [[0, 0, 1, 1, 0, 0, 1]]  # targets 1 2 | 5 6 8 9 7 -> 5, 6, 7
    assert sampler_logp.tolist() == [[0, 0, -1, -2, 0, 0, -3]]
    groups = episodes.trajectory_groups(traj, [0], 1)
    assert groups["lengths"].tolist() == [[3]] and groups["truncated"].tolist() == [[False]]
    # at the stage's fixed widths (refill rounds concatenate): the same row, padded left and right
    wide = episodes.trajectory_groups(traj, [0], 1, prompt_width=5, width=10)
    assert wide["tokens"].shape == (1, 1, 15) and wide["mask"].shape == (1, 1, 14)
    assert wide["tokens"][0, 0][wide["valid"][0, 0]].tolist() == [1, 2, 5, 6, 8, 9, 7]
    assert wide["positions"][0, 0][wide["valid"][0, 0]].tolist() == list(range(7))
    assert wide["mask"][0, 0].tolist() == [0] * 4 + [1, 1, 0, 0, 1] + [0] * 5
    params = _params()
    batch = {k: jnp.asarray(v) for k, v in dict(tokens=tokens, valid=valid, positions=positions).items()}
    logp = update.token_outputs(params, CFG, batch)["logp"]
    # GRPO's pg term, token mean: -A sum(m logp) / sum(m)
    loss = -0.7 * jnp.sum(jnp.asarray(mask) * logp) / jnp.sum(jnp.asarray(mask))
    full = np.asarray(jax.nn.log_softmax(tf.forward(params, CFG, jnp.asarray([[1, 2, 5, 6, 8, 9, 7]]))[0], -1))
    want = -0.7 * np.mean([full[1, 5], full[2, 6], full[5, 7]])
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)


def test_hybrid_models_are_refused():
    cfg = tf.ModelConfig(vocab_size=23, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48)
    sampling.check_episode_model(cfg)
    with pytest.raises(ValueError, match="Mamba"):
        sampling.check_episode_model(type("C", (), {"layer_pattern": "M*"})())


# ---------------------------------------------------------------------------------------------- environments


def _swe_record():
    from nemocascade.data import swe

    rng = np.random.default_rng(0)
    for r in swe.generate(rng, 40, split=None):
        if "/bound/" in r["id"]:
            return r


def _fence(code):
    return f"<think>\nfix it\n</think>\n```python\n{code}\n```"


def test_swe_repair_environment():
    rec = _swe_record()
    spec = json.loads(rec["answer"])
    env = envs.make_env("swe_repair", rec)
    assert env.reset() == rec["prompt"]
    st = env.step(_fence(spec["fix"]))
    assert (st.reward, st.done, st.tool_error) == (1.0, True, False)
    st = envs.make_env("swe_repair", rec).step(_fence(spec["buggy"]))
    # the answer is the domain's own prompt format, with the model's code as the code to fix
    assert (st.reward, st.done) == (0.0, False) and st.observation == rec["prompt"]
    st = envs.make_env("swe_repair", rec).step("no code here")
    assert st.tool_error and not st.done and "```python" in st.observation


def test_swe_repair_hidden_test_ends_the_episode_unrewarded():
    """A patch that passes the shown test but not a hidden one: the agent is told the shown test passes (it cannot
    see the hidden ones), the episode ends, reward 0."""
    from nemocascade.data import swe

    rng = np.random.default_rng(0)
    recs = [r for r in swe.generate(rng, 60, split=None, teacher_error_rate=1.0)
            if r["id"].split("/")[3] in ("compare", "bound")]
    for rec in recs:
        slip = rec["response"].split("```python\n")[1].split("\n```")[0]
        st = envs.make_env("swe_repair", rec).step(_fence(slip))
        if st.done:
            assert (st.reward, st.observation) == (0.0, "The shown test passes.")
            return
    pytest.fail("no slip passed its shown test")


def test_swe_result_cannot_be_faked_by_printing():
    rec = _swe_record()
    spec = json.loads(rec["answer"])
    _, expected = envs._call_of(spec["tests"][0])
    fake = spec["buggy"] + f"\nprint({expected!r})\nimport sys\nsys.stdout.flush()"
    st = envs.make_env("swe_repair", rec).step(_fence(fake))
    assert not st.done and st.reward == 0.0


def test_environment_actions_never_touch_the_run_files(tmp_path):
    """Model code that writes into the run's directory (by absolute path) or deletes a file there changes nothing."""
    run_file = tmp_path / "metrics.jsonl"
    run_file.write_text("keep\n")
    os.chmod(tmp_path, 0o777)
    rec = _swe_record()
    attack = (f"open({str(run_file)!r}, 'w').write('gone')\nimport os\nos.remove({str(run_file)!r})\n"
              f"open({str(tmp_path / 'new.txt')!r}, 'w').write('x')\n" + json.loads(rec["answer"])["fix"])
    envs.make_env("swe_repair", rec).step(_fence(attack))
    envs.make_env("python", {"domain": "math", "prompt": "p", "answer": "1"}).step(_fence(attack))
    assert run_file.read_text() == "keep\n" and not (tmp_path / "new.txt").exists()


def _tool_record(teacher_error_rate=1.0):
    from nemocascade.data import tool

    rng = np.random.default_rng(1)
    for r in tool.generate(rng, 80, split=None, teacher_error_rate=teacher_error_rate):
        if r["response"].count('"1') and any(isinstance(v, int) and not isinstance(v, bool) and v >= 10
                                             for v in json.loads(r["answer"])["arguments"].values()):
            return r


def test_tool_environment_executes_the_call_and_reports_type_errors():
    rec = _tool_record()
    answer = json.loads(rec["answer"])
    env = envs.make_env("tool_exec", rec)
    st = env.step("<think>\nx\n</think>\n" + rec["response"])  # the teacher's slip: an integer quoted
    assert st.tool_error and not st.done and "must be a JSON integer" in st.observation
    call = json.dumps({"name": answer["name"], "arguments": answer["arguments"]})
    st = env.step(f"<think>\nx\n</think>\n<tool_call>{call}</tool_call>")
    assert (st.reward, st.done) == (1.0, True)
    result = json.loads(st.observation.removeprefix("<tool_response>").removesuffix("</tool_response>"))
    assert result == getattr(envs.ToolWorld(), answer["name"])(**answer["arguments"])
    assert envs.make_env("tool_exec", rec).step("<tool_call>{not json</tool_call>").tool_error
    assert "unknown tool" in envs.make_env("tool_exec", rec).step(
        '<tool_call>{"name": "os.system", "arguments": {}}</tool_call>').observation
    wrong = dict(answer["arguments"], **{k: v + 1 for k, v in answer["arguments"].items()
                                         if isinstance(v, int) and not isinstance(v, bool)})
    st = envs.make_env("tool_exec", rec).step(
        f"<tool_call>{json.dumps({'name': answer['name'], 'arguments': wrong})}</tool_call>")
    assert (st.reward, st.done, st.tool_error) == (0.0, True, False)  # executed, but not what was asked


def test_python_environment_runs_code_then_scores_the_answer():
    env = envs.make_env("python", {"domain": "math", "prompt": "What is 17 * 23?", "answer": "391"})
    st = env.step("```python\nprint(17 * 23)\n```")
    assert (st.done, st.reward) == (False, 0.0) and "391" in st.observation
    assert env.step("The answer is \\boxed{391}.").reward == 1.0
    assert env.step("The answer is \\boxed{390}.").reward == 0.0
    st = env.step("```python\nwhile True: pass\n```")
    assert st.tool_error and "timed out" in st.observation


def test_unknown_environment_is_named():
    with pytest.raises(KeyError, match="swe_repair"):
        envs.make_env("nope", {})


@pytest.mark.slow  # ~140 s; episodes, their KV cache, rows and agent evaluation are pinned by the tests above
def test_swe_agent_tiny_trains_multi_turn_and_evaluates_both_ways(tmp_path, run_cli):
    """swe_agent:tiny end to end: the multi-turn arm's steps log the agent metrics (episodes of up to 3 turns, the
    turn shares adding to 1), and every stage is scored single-turn and multi-turn on the same held-out items,
    greedy and (on test) avg@2."""
    run_cli("swe_agent:tiny", tmp_path / "wd")
    rows = [json.loads(line) for line in open(tmp_path / "wd" / "metrics.jsonl")]
    multi = [r for r in rows if r["stage"] == "rl_multi"]
    assert len(multi) == 2
    for r in multi:
        shares = [v for k, v in r.items() if k.startswith("turns_frac/")]
        assert 1.0 <= r["turns"] <= 3.0 and sum(shares) == pytest.approx(1.0) and r["env_s"] > 0
        assert r["obs_tokens"] > 0 if r["turns"] > 1 else True
    assert max(r["turns"] for r in multi) > 1  # a tiny model writes no code block: asked again, up to the budget
    assert not any("turns" in r for r in rows if r["stage"] == "rl_single")
    pre = json.load(open(tmp_path / "wd" / "prefilter" / "rl_multi.json"))  # the tiny arm runs C2's filter
    assert pre["examined"] == 4 and sum(pre["solved_counts"].values()) == 4 and len(pre["kept_ids"]) == pre["kept"]
    summary = json.load(open(tmp_path / "wd" / "summary.json"))
    for stage in summary["stages"]:
        for split in ("eval", "val"):
            ev = stage[split]
            assert set(ev) == {"swe", "swe_retry", "swe@single", "swe@multi"}  # swe_retry: no environment
            assert ev["swe@single"]["n"] == ev["swe@multi"]["n"] == ev["swe"]["n"]
            assert sum(ev["swe@multi"]["turns_frac"].values()) == pytest.approx(1.0) and "ci95" in ev["swe@multi"]
            # the tiny variant asks for avg@2 of both agents: on test only, each with its interval
            assert all(("avg@k" in ev[a]) == (split == "eval") for a in ("swe@single", "swe@multi"))
    items = json.load(open(tmp_path / "wd" / "eval_scores" / "rl_multi.json"))
    assert len(items["avg@k/swe@multi"]) == len(items["swe@multi"]) == summary["stages"][-1]["eval"]["swe@multi"]["n"]
    # the report's comparison is the paired difference of the saved per-item scores
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "experiments/agent_report.py", str(tmp_path / "wd"),
                           f"--out={tmp_path / 'rep'}"], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reps = json.load(open(tmp_path / "rep.json"))["runs"][0]["comparisons"]
    assert len(reps) == 1  # the run's one arm pair
    rep = reps[0]
    single = json.load(open(tmp_path / "wd" / "eval_scores" / "rl_single.json"))["swe@single"]
    multi = json.load(open(tmp_path / "wd" / "eval_scores" / "rl_multi.json"))["swe@multi"]
    assert rep["n"] == len(single) == len(multi) and rep["diff"] == pytest.approx(np.mean(multi) - np.mean(single))
    assert (tmp_path / "rep.png").exists()
    bad = subprocess.run([sys.executable, "experiments/agent_report.py", str(tmp_path / "wd"), "--multi=nope@multi",
                          "--single=rl_single@single"], cwd=root, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "nope" in bad.stderr


def test_agent_report_pairs_every_rl_arm_with_its_repeat():
    """swe_agent:rl_repeats's arms: the default pairs are each rl_single<sfx> with rl_multi<sfx> in run order; named
    pairs are zipped; a pair naming one stage only, or lists of unequal length, are refused."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
    from agent_report import arm_pairs

    from nemocascade.errors import BadInput
    stages = ["sft", "rl_single", "rl_multi", "rl_single_r2", "rl_multi_r2", "rl_single_r3"]  # r3's multi unfinished
    assert arm_pairs(stages, "@single", "@multi") == [(("rl_single", "single"), ("rl_multi", "multi")),
                                                     (("rl_single_r2", "single"), ("rl_multi_r2", "multi"))]
    assert arm_pairs(stages, "sft@single,rl_single@single", "sft@multi,rl_multi@multi") == [
        (("sft", "single"), ("sft", "multi")), (("rl_single", "single"), ("rl_multi", "multi"))]
    for single, multi in (("@single", "rl_multi@multi"), ("a@single,b@single", "c@multi"), ("rl_single", "@multi")):
        with pytest.raises(BadInput):
            arm_pairs(stages, single, multi)


def test_c2_prefilter_drops_always_solved_and_most_never_solved():
    from nemocascade.stages import agent

    solved = np.asarray([8, 0, 3, 0, 0, 8, 1, 7])
    assert agent.prefilter_keep(solved, 8, 1.0, 0).tolist() == [0, 0, 1, 0, 0, 0, 1, 1]
    assert agent.prefilter_keep(solved, 8, 0.0, 0).tolist() == [0, 1, 1, 1, 1, 0, 1, 1]
    many = np.zeros(20_000, int)
    assert abs(agent.prefilter_keep(many, 16, 0.9, 3).mean() - 0.1) < 0.01  # 90% of the 0/16 dropped
    assert (agent.prefilter_keep(many, 16, 0.9, 3) == agent.prefilter_keep(many, 16, 0.9, 3)).all()


class _Bytes:
    """A byte-level stand-in tokenizer over CFG's 23 ids (enough for run_episodes: encode, decode, ids)."""
    pad_id, eos_id = 0, 4

    def encode(self, text):
        return [5 + ord(c) % 18 for c in text]

    def decode(self, ids):
        return "".join(chr(97 + i) for i in ids)

    def token_id(self, piece):
        return 9


def test_agent_avg_at_k_keeps_each_records_samples_together(monkeypatch):
    """evaluate_episodes with avg@k: an environment whose reward is its record's own number shows every record's k
    sampled episodes averaged on their own record (5 records, 2 per sampled batch: the last batch padded), and the
    sampled episodes really sample (their actions differ from the greedy one)."""
    from nemocascade import evaluation
    actions = {}

    class Numbered(envs.Env):
        def step(self, action):
            actions.setdefault(self.record["id"], []).append(action)
            return envs.Step("", self.record["value"], True)

    monkeypatch.setitem(envs.ENVS, "numbered", Numbered)
    records = [{"id": i, "prompt": "ab" * (i + 1), "value": v} for i, v in enumerate([0.1, 0.7, 0.3, 1.0, 0.5])]
    settings = episodes.Settings(max_turns=1, max_new_tokens=8, max_prompt_len=256, greedy=True)
    out = evaluation.evaluate_episodes(_params(), CFG, _Bytes(), records, ["numbered"] * 5, settings, batch_size=6,
                                       rng=jax.random.key(0), avg_k=3, temperature=1.0)
    assert out["scores"] == pytest.approx([0.1, 0.7, 0.3, 1.0, 0.5])
    assert out["avg@k_scores"] == pytest.approx([0.1, 0.7, 0.3, 1.0, 0.5]) and out["k"] == 3
    assert out["avg@k"] == pytest.approx(0.52) and out["pass@1"] == pytest.approx(0.52)
    # the greedy pass ran first; the last record's lists hold its padding repeats too (greedy 1 + 1, sampled 3 + 3)
    assert [len(actions[i]) for i in range(5)] == [4, 4, 4, 4, 8]
    assert sum(a != actions[i][0] for i in range(5) for a in actions[i][-3:]) >= 8  # greedy again: 0 of 15
