"""Generative judges: a causal LM, frozen, reads a judging prompt and gives a verdict (C2's pairwise GenRM for RLHF,
its LLM judge for long-context QA; METHOD.md "Rewards per domain").

    pair_instruction(prompt, a, b)             "which of responses A and B answers the request better?"
    reference_instruction(question, ref, r)    "does the response give the reference answer?"
    parse_verdict(text, options)               a sampled verdict, strictly: the last line is "Verdict: X", X an option
    Judge.verdicts(instructions, options)      [N] Pr(first option), and which rows had a verdict
    pairwise_preferences(judge, prompt, rs)    [G, G] Pr(i beats j) from both orders of every pair
    reference_rewards(judge, ...)              [N] Pr(the response gives the reference answer)

A judge is any causal LM we load (our own checkpoints, Hugging Face, GGUF) placed on the run's one mesh beside the
policy. Two modes:

- ``logprob``: one forward pass over the judging prompt ending in the assistant's ``Verdict:``; the verdict is the
  judge's next-token probability of the first option renormalised over the two options (no sampling, never
  unparsable). Both options must tokenise as the same prefix plus one token each (checked per row).
- ``sample``: the judge writes (greedy, or sampled at ``temperature``) and its reply is parsed strictly; a reply
  whose last non-empty line is not exactly ``Verdict: <option>``, or that says ``Verdict:`` anywhere else, is
  unparsable: a tie (0.5), counted in ``stats["unparsable"]``.

Nothing the policy writes is trusted: chat control tokens are removed from responses before they enter a judging
prompt (a response cannot close the user turn and write the judge's verdict for it), and each response is cut to a
token budget so every prompt fits ``max_len`` (a verbose policy cannot push the question out of the judge's view).

Both orders. A judge prefers a position as well as a response (position bias). ``pairwise_preferences`` asks
every ordered pair: with p[i, j] = Pr(first wins | A = i, B = j),

    pref[i, j] = (p[i, j] + 1 - p[j, i]) / 2           so pref[i, j] + pref[j, i] = 1,

and reports ``position_bias`` = mean p - 1/2 (an unbiased judge: 0; one that always says A: +1/2) and
``inconsistent`` = the fraction of pairs whose verdict follows the position, not the response (both orders favour
the first). Identical responses are not judged: 1/2.
"""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from nemocascade import chat, sampling
from nemocascade import mesh as mesh_lib
from nemocascade.models import param_shardings, transformer
from nemocascade.rewards.verdict import (LEAD, PAIR_OPTIONS, REFERENCE_OPTIONS, clean, pair_instruction,  # noqa: F401
                                        parse_verdict, reference_instruction)

MODES = ("logprob", "sample")
SAMPLE_SUFFIX = "\nThink briefly, then end with one last line: 'Verdict: {first}' or 'Verdict: {second}'."


@functools.partial(jax.jit, static_argnames="cfg")
def _next_logprobs(params, tokens, valid, option_ids, *, cfg):
    """log-probabilities [B, 2] of each row's two option tokens at its last position (rows are left-padded)."""
    h = transformer.forward_hidden(params, cfg, tokens, transformer.left_pad_positions(valid), valid)
    logits = transformer.lm_head(params, cfg, h[:, -1:])[:, 0]
    return jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), option_ids, axis=-1)


class Judge:
    """A frozen causal LM that gives verdicts (module docstring). `thinking`: the chat mode it was trained in (a
    judge trained in this run: the run's; an imported instruct model: False). Every call pads to
    ``[batch_size, max_len]`` (left padding; dummy rows fill the last batch), so one compiled program serves every
    call. With ``mesh`` the params and batches are placed on it (the policy's mesh: one more frozen role there).

    stats: what the judge did since the last ``take_stats()``: rows judged, unparsable verdicts, seconds."""

    def __init__(self, params, model_cfg, tokenizer, *, mode: str = "logprob", batch_size: int = 64,
                 max_len: int = 384, max_new_tokens: int = 64, temperature: float = 0.0, seed: int = 0,
                 thinking: bool = False, mesh=None):
        if mode not in MODES:
            raise ValueError(f"judge mode {mode!r}; choose one of {MODES}")
        if batch_size < 1 or max_len < 8 or max_new_tokens < 1:
            raise ValueError(f"judge batch_size >= 1, max_len >= 8, max_new_tokens >= 1; got {batch_size}, {max_len}, "
                             f"{max_new_tokens}")
        self.model_cfg, self.tokenizer, self.mode, self.mesh, self.thinking = model_cfg, tokenizer, mode, mesh, thinking
        self.batch_size, self.max_len, self.max_new_tokens, self.temperature = batch_size, max_len, max_new_tokens, \
            temperature
        self._rng = jax.random.key(seed)
        self._calls = 0
        if mesh is not None:
            params = jax.device_put(params, param_shardings(model_cfg, mesh))
        self.params = params
        self.stats = {"rows": 0, "unparsable": 0, "seconds": 0.0}

    def take_stats(self) -> dict:
        out, self.stats = self.stats, {"rows": 0, "unparsable": 0, "seconds": 0.0}
        return out

    # ------------------------------------------------------------------ text -> tokens

    def render(self, instruction: str, options: tuple[str, str]) -> str:
        """The judging prompt as the judge reads it (sample mode: up to where it starts writing)."""
        if self.mode == "sample":
            return chat.render_prompt(instruction + SAMPLE_SUFFIX.format(first=options[0], second=options[1]),
                                      thinking=self.thinking)
        # thinking: an empty think block closed, as an SFT target with no reasoning renders (chat.render_completion)
        close = f"\n{chat.THINK_CLOSE}\n" if self.thinking else ""
        return chat.render_prompt(instruction, thinking=self.thinking) + close + LEAD

    def overhead(self, instruction: str, options: tuple[str, str]) -> int:
        """Tokens of a judging prompt plus its verdict (logprob) or reply budget (sample)."""
        n = len(self.tokenizer.encode(self.render(instruction, options)))
        return n + (1 if self.mode == "logprob" else self.max_new_tokens)

    def budget(self, instruction_without_texts: str, options: tuple[str, str], n_texts: int) -> int:
        """Tokens each of `n_texts` quoted texts may take so the judging prompt fits ``max_len``."""
        room = self.max_len - self.overhead(instruction_without_texts, options)
        if room < n_texts:
            raise ValueError(f"judge max_len={self.max_len} leaves {room} tokens for {n_texts} quoted texts; raise it")
        return room // n_texts

    def clip(self, text: str, n_tokens: int) -> str:
        """`text` cut to its first `n_tokens` tokens (decoded back; a cut text may re-tokenise one or two longer:
        callers leave that slack)."""
        ids = self.tokenizer.encode(text)
        return text if len(ids) <= n_tokens else self.tokenizer.decode(ids[:n_tokens])

    def _row(self, instruction: str, options: tuple[str, str]):
        """(prompt token ids, option ids) of one logprob row: the prompt must end where the two options differ by
        exactly one token each."""
        text = self.render(instruction, options)
        a, b = (self.tokenizer.encode(text + " " + o) for o in options)
        n = len(a) - 1
        if len(b) != len(a) or a[:n] != b[:n] or a[n] == b[n]:
            raise ValueError(f"judge options {options}: after {LEAD!r} they must tokenise as one shared prefix plus "
                             "one token each; choose options that do, or mode='sample'")
        return a[:n], (a[n], b[n])

    # ------------------------------------------------------------------ verdicts

    def verdicts(self, instructions: list[str], options: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
        """(Pr(first option) [N] float64, parsed [N] bool) for judging prompts `instructions`."""
        t0 = time.perf_counter()
        p, ok = (self._logprob if self.mode == "logprob" else self._sample)(instructions, options)
        self.stats["rows"] += len(instructions)
        self.stats["unparsable"] += int((~ok).sum())
        self.stats["seconds"] += time.perf_counter() - t0
        return p, ok

    def _batches(self, rows: list[list[int]]):
        """Left-padded [batch_size, L] token and valid arrays (L = max_len, or the prompt width in sample mode)."""
        B = self.batch_size
        L = self.max_len - (self.max_new_tokens if self.mode == "sample" else 0)
        for start in range(0, len(rows), B):
            chunk = rows[start:start + B]
            long = max(len(r) for r in chunk)
            if long > L:
                raise ValueError(f"a judging prompt of {long} tokens exceeds the judge's {L} (max_len={self.max_len}"
                                 f"{'' if self.mode == 'logprob' else f' - max_new_tokens={self.max_new_tokens}'})")
            tokens = np.full((B, L), self.tokenizer.pad_id, np.int32)
            valid = np.zeros((B, L), bool)
            for i, ids in enumerate(chunk + [chunk[-1]] * (B - len(chunk))):
                tokens[i, L - len(ids):], valid[i, L - len(ids):] = ids, True
            yield start, len(chunk), tokens, valid

    def _put(self, *arrays):
        return mesh_lib.shard_batch(self.mesh, arrays) if self.mesh is not None else arrays

    def _logprob(self, instructions, options):
        rows, opts = zip(*(self._row(s, options) for s in instructions)) if instructions else ((), ())
        out = np.zeros((len(rows),), np.float64)
        for start, n, tokens, valid in self._batches(list(rows)):
            ids = np.asarray(list(opts[start:start + n]) + [opts[start]] * (self.batch_size - n), np.int32)
            lp = np.asarray(mesh_lib.to_host(_next_logprobs(self.params, *self._put(tokens, valid, ids),
                                                            cfg=self.model_cfg)), np.float64)[:n]
            out[start:start + n] = 1.0 / (1.0 + np.exp(lp[:, 1] - lp[:, 0]))  # softmax over the two options
        return out, np.ones((len(rows),), bool)

    def _sample(self, instructions, options):
        rows = [self.tokenizer.encode(self.render(s, options)) for s in instructions]
        out, ok = np.full((len(rows),), 0.5), np.zeros((len(rows),), bool)
        for start, n, tokens, valid in self._batches(rows):
            self._calls += 1
            toks, lens = self._put(tokens, valid.sum(1).astype(np.int32))
            s = sampling.sample(self.params, self.model_cfg, toks, lens, jax.random.fold_in(self._rng, self._calls),
                                max_new_tokens=self.max_new_tokens, eos_id=self.tokenizer.eos_id,
                                pad_id=self.tokenizer.pad_id, temperature=max(self.temperature, 1e-6),
                                greedy=self.temperature == 0.0)
            tok, mask = (np.asarray(mesh_lib.to_host(x)) for x in (s.tokens, s.mask))
            for i in range(n):
                verdict = parse_verdict(self.tokenizer.decode([int(t) for t, m in zip(tok[i], mask[i]) if m]), options)
                if verdict is not None:
                    out[start + i], ok[start + i] = 1.0 - verdict, True
        return out, ok


# ---------------------------------------------------------------------------- rewards from verdicts


def pairwise_preferences(judge: Judge, prompt: str, responses: list[str]) -> tuple[np.ndarray, dict]:
    """([G, G] Pr(i beats j), stats) for one prompt's G responses: every ordered pair judged (module docstring)."""
    prefs, stats = pairwise_preferences_batch(judge, [prompt], [responses])
    return prefs[0], stats


def pairwise_preferences_batch(judge: Judge, prompts: list[str], groups: list[list[str]]):
    """`pairwise_preferences` of several prompts with one batch of judge calls -> ([P, G, G], stats): position_bias,
    inconsistent (module docstring), over the pairs judged; pairs: how many unordered pairs had distinct texts."""
    P, G = len(prompts), len(groups[0]) if groups else 0
    p = np.full((P, G, G), 0.5)
    judged = np.zeros((P, G, G), bool)  # ordered pairs with distinct texts
    instructions = []
    for k, (prompt, rs) in enumerate(zip(prompts, groups)):
        if len(rs) != G:
            raise ValueError(f"prompt {k} has {len(rs)} responses, the first has {G}")
        budget = judge.budget(pair_instruction(prompt, "", ""), PAIR_OPTIONS, 2) - 2  # re-tokenising slack
        cleaned = [clean(r) for r in rs]
        clipped = [judge.clip(r, budget) for r in cleaned]
        judged[k] = np.asarray([[a != b for b in cleaned] for a in cleaned])
        instructions += [pair_instruction(prompt, clipped[i], clipped[j]) for i, j in zip(*np.nonzero(judged[k]))]
    if instructions:
        p[judged] = judge.verdicts(instructions, PAIR_OPTIONS)[0]  # np.nonzero and boolean indexing: one order
    pref = (p + 1.0 - np.swapaxes(p, 1, 2)) / 2.0
    upper = judged & np.triu(np.ones((G, G), bool), 1)[None]
    stats = {"pairs": int(upper.sum()),
             "position_bias": float(p[judged].mean() - 0.5) if judged.any() else 0.0,
             "inconsistent": float((((p - 0.5) * (np.swapaxes(p, 1, 2) - 0.5)) > 0)[upper].mean()) if upper.any()
             else 0.0}
    return pref, stats


def reference_rewards(judge: Judge, questions: list[str], references: list[str], responses: list[str]) -> np.ndarray:
    """[N] Pr(response n gives reference n's answer): the question is cut from the left (its end, where the
    question is asked, stays), the response from the right, to fit the judge."""
    instructions = []
    for q, ref, r in zip(questions, references, responses):
        budget = judge.budget(reference_instruction("", ref, ""), REFERENCE_OPTIONS, 2) - 2
        ids = judge.tokenizer.encode(clean(q))
        q = q if len(ids) <= budget else judge.tokenizer.decode(ids[-budget:])
        instructions.append(reference_instruction(q, ref, judge.clip(clean(r), budget)))
    return judge.verdicts(instructions, REFERENCE_OPTIONS)[0] if instructions else np.zeros((0,), np.float64)
