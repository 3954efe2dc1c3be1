"""Multi-turn rollouts: the policy talks, environments (nemocascade/envs.py) answer, one KV cache throughout.

    trajectories = run_episodes(params, model_cfg, tokenizer, records, env_names, settings, rng, mesh)
    groups = trajectory_groups(trajectories, ...)      # the on-policy step's rows, observations masked out

Per round: every row still in its episode decodes its turn (`sampling.decode_turn`, jitted, cache kept); the host
decodes each turn, runs the rows' environment steps in parallel (threads: the sandbox's subprocesses do the
work), renders the observations as the next user turn (`render_observation`) and appends them in one jitted
pass (`sampling.append_observations`). A row's episode ends when its environment says done, after `max_turns`
turns, or when its next observation would not fit its `max_total_tokens` (prompt excluded, the model's and the
observations' tokens counted: the token budget a single-turn rollout of the same length has). Its reward is its
last step's.

Budgets: each turn at most `max_new_tokens`; an observation is cut to `max_obs_tokens` (its tail kept: the
user-turn wrapper stays whole). The shared slot timeline is `max_turns * (max_new_tokens + obs width)` slots.
"""
from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np

from nemocascade import chat, envs, sampling
from nemocascade.data import pipeline
from nemocascade.mesh import shard_batch, to_host

OBS_BUCKET = 16  # observation chunks are padded to a multiple of this (few compiled shapes)

@dataclasses.dataclass(frozen=True)
class Settings:
    max_turns: int
    max_new_tokens: int  # per turn
    max_total_tokens: int | None = None  # per episode after the prompt, the model's tokens and the observations'
    # (None: max_turns x max_new_tokens); read it through `budget`
    max_obs_tokens: int = 128
    max_prompt_len: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    greedy: bool = False
    thinking: bool = True
    stop_tokens: tuple = ()  # vocabulary pieces that also end a turn (e.g. "</tool_call>" where it is one token)
    workers: int = 0  # environment steps in parallel (0: 2 x CPU count; they wait on sandbox subprocesses)

    @property
    def budget(self) -> int:
        return self.max_total_tokens or self.max_turns * self.max_new_tokens

    @property
    def slots(self) -> int:
        return self.max_turns * (self.max_new_tokens + pipeline.pad_to_bucket(self.max_obs_tokens, OBS_BUCKET))


@dataclasses.dataclass
class Trajectories:
    prompts: np.ndarray     # [B, P] left-padded prompt ids
    prompt_lens: np.ndarray  # [B]
    tokens: np.ndarray      # [B, R] the slots after the prompt (empty slots included)
    kind: np.ndarray        # [B, R] sampling.EMPTY / MODEL / OBSERVATION
    logprobs: np.ndarray    # [B, R]
    rewards: np.ndarray     # [B] the last step's reward
    turns: np.ndarray       # [B] the model's turns
    tool_errors: np.ndarray  # [B] steps whose action could not be carried out
    done: np.ndarray        # [B] the environment ended the episode (else a turn or token budget did)
    env_s: float            # seconds in environment steps
    texts: list             # [B] list of each row's turn texts (as decoded)

    @property
    def model_tokens(self) -> np.ndarray:
        """[B] the tokens the model wrote (observations excluded)."""
        return (self.kind == sampling.MODEL).sum(1)


def render_observation(text: str, thinking: bool, closed: bool) -> str:
    """The environment's answer as the next user turn, up to where the assistant's next turn starts. `closed`:
    the model ended its turn itself (with `<|im_end|>`); a turn cut by its length limit is closed here."""
    head = "" if closed else chat.IM_END
    return head + "\n" + chat.render_prompt(text, thinking=thinking)


def observation_ids(tokenizer, text: str, thinking: bool, closed: bool, max_tokens: int) -> list[int]:
    """Token ids of `render_observation`, the observation text cut from the left so the whole is <= max_tokens."""
    ids = tokenizer.encode(render_observation(text, thinking, closed))
    if len(ids) <= max_tokens:
        return ids
    wrapper = len(tokenizer.encode(render_observation("", thinking, closed)))
    body = tokenizer.encode(text)[-max(max_tokens - wrapper - 1, 1):]
    return tokenizer.encode(render_observation(tokenizer.decode(body), thinking, closed))[-max_tokens:]


def run_episodes(params, model_cfg, tokenizer, records: list[dict], env_names: list[str], settings: Settings, rng,
                 mesh=None, num_samples: int = 1) -> Trajectories:
    """`num_samples` episodes per record (rows of a record adjacent), each with its own environment
    `env_names[i]` (one name per record)."""
    s, G = settings, num_samples
    rows = [(r, name) for r, name in zip(records, env_names) for _ in range(G)]
    episodes = [envs.make_env(name, r) for r, name in rows]
    firsts = [e.reset() for e in episodes[::G]]
    toks, lens = pipeline.encode_prompts(tokenizer, firsts, s.max_prompt_len, thinking=s.thinking,
                                         bucket=sampling.PROMPT_BUCKET)
    dev = lambda x: shard_batch(mesh, x) if mesh is not None else x  # noqa: E731
    ep = sampling.begin_episodes(params, model_cfg, *dev((toks, lens)), slots=s.slots, num_samples=G)
    B = len(rows)
    P = toks.shape[1]
    alive = np.ones(B, bool)
    closed = np.zeros(B, bool)
    rewards, turns, errors = np.zeros(B, np.float32), np.zeros(B, np.int32), np.zeros(B, np.int32)
    done = np.zeros(B, bool)
    texts: list[list[str]] = [[] for _ in range(B)]
    env_s = 0.0
    stop_ids = np.asarray([tokenizer.eos_id] + [tokenizer.token_id(p) for p in s.stop_tokens], np.int32)
    workers = s.workers or 2 * (os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=min(workers, B)) as pool:
        for turn in range(s.max_turns):
            t0 = int(to_host(ep.t))
            ep = sampling.decode_turn(params, model_cfg, ep, dev(alive), jax.random.fold_in(rng, turn),
                                      max_new_tokens=s.max_new_tokens, budget=s.budget,
                                      stop_ids=stop_ids, pad_id=tokenizer.pad_id,
                                      temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, greedy=s.greedy)
            t1, tokens, kind, used = to_host((ep.t, ep.tokens, ep.kind, ep.used))
            span = slice(t0 - P, int(t1) - P)
            acting = np.flatnonzero(alive)
            turn_texts = {}
            for b in acting:
                ids = tokens[b, span][kind[b, span] == sampling.MODEL]
                closed[b] = ids.size > 0 and ids[-1] == tokenizer.eos_id  # else the observation closes the turn
                prefix = chat.THINK_OPEN + "\n" if s.thinking else ""
                turn_texts[b] = prefix + tokenizer.decode(ids.tolist())
                texts[b].append(turn_texts[b])
            turns[acting] += 1
            start = time.perf_counter()
            steps = dict(zip(acting, pool.map(lambda b: _safe_step(episodes[b], turn_texts[b]), acting)))
            env_s += time.perf_counter() - start
            for b, st in steps.items():
                rewards[b], errors[b] = st.reward, errors[b] + st.tool_error
                done[b] = st.done
                alive[b] = not st.done and turn + 1 < s.max_turns
            obs = {b: observation_ids(tokenizer, steps[b].observation, s.thinking, closed[b], s.max_obs_tokens)
                   for b in np.flatnonzero(alive)}
            for b, ids in obs.items():
                if used[b] + len(ids) + 1 > s.budget:  # no room for the observation and one token
                    alive[b] = False
            if not alive.any():
                break
            W = pipeline.pad_to_bucket(max(len(obs[b]) for b in np.flatnonzero(alive)), OBS_BUCKET)
            if int(t1) + W >= P + s.slots:
                break
            obs_tok = np.full((B, W), tokenizer.pad_id, np.int32)
            obs_len = np.zeros(B, np.int32)
            for b in np.flatnonzero(alive):
                obs_tok[b, :len(obs[b])], obs_len[b] = obs[b], len(obs[b])
            ep = sampling.append_observations(params, model_cfg, ep, *dev((obs_tok, obs_len)))
    tokens, kind, logprobs = to_host((ep.tokens, ep.kind, ep.logprobs))
    return Trajectories(np.repeat(toks, G, 0), np.repeat(lens, G, 0), tokens, kind, logprobs, rewards, turns, errors,
                        done, env_s, texts)


def _safe_step(env, text: str) -> envs.Step:
    """An environment step; an exception in our environment code ends the episode with reward 0 (counted as a
    tool error), never the RL step."""
    try:
        return env.step(text)
    except Exception as e:  # noqa: BLE001  (an environment bug must cost one episode)
        return envs.Step(f"environment error: {type(e).__name__}", 0.0, True, tool_error=True)


def compact(traj: Trajectories, prompt_width: int = 0, width: int = 0):
    """Each row's trajectory without empty slots: (tokens, valid, positions [B, P + L], loss mask and sampler
    log-probs [B, P + L - 1] aligned with next-token targets: 1 / log pi only on the model's tokens). P: the
    prompts' width, left-padded to `prompt_width` if wider; L: the longest trajectory, or `width` (>= it) so that
    batches of several rounds concatenate."""
    prompts, prompt_lens = traj.prompts, traj.prompt_lens
    if prompt_width > prompts.shape[1]:
        prompts = np.pad(prompts, ((0, 0), (prompt_width - prompts.shape[1], 0)))
    B, R = traj.tokens.shape
    P = prompts.shape[1]
    real = traj.kind != sampling.EMPTY
    L = max(int(real.sum(1).max(initial=0)), 1, width)
    resp = np.zeros((B, L), np.int32)
    kind = np.zeros((B, L), np.int8)
    logp = np.zeros((B, L), np.float32)
    for b in range(B):
        keep = np.flatnonzero(real[b])
        resp[b, :keep.size], kind[b, :keep.size], logp[b, :keep.size] = (traj.tokens[b, keep], traj.kind[b, keep],
                                                                         traj.logprobs[b, keep])
    tokens = np.concatenate([prompts, resp], 1)
    prompt_valid = np.arange(P)[None, :] >= (P - prompt_lens)[:, None]
    valid = np.concatenate([prompt_valid, kind != sampling.EMPTY], 1)
    positions = np.maximum(np.cumsum(valid, 1) - 1, 0).astype(np.int32)
    zeros = np.zeros((B, P - 1), np.float32)
    mask = np.concatenate([zeros, (kind == sampling.MODEL).astype(np.float32)], 1)
    sampler_logp = np.concatenate([zeros, logp], 1)
    return tokens, valid, positions, mask, sampler_logp


def trajectory_groups(traj: Trajectories, domain_idx, num_samples: int, prompt_width: int = 0,
                      width: int = 0) -> dict:
    """The groups dict of rl/rollouts.py (leading dims [P, G]) for trajectories of P records x G episodes, at a
    fixed `prompt_width` + `width` (the stage's prompt and episode budgets: refill rounds concatenate)."""
    tokens, valid, positions, mask, sampler_logp = compact(traj, prompt_width, width)
    G = num_samples
    P = tokens.shape[0] // G
    shape = lambda x: np.asarray(x).reshape(P, G, *np.shape(x)[1:])  # noqa: E731
    return {"tokens": shape(tokens), "valid": shape(valid), "positions": shape(positions), "mask": shape(mask),
            "sampler_logp": shape(sampler_logp), "rewards": shape(traj.rewards),
            "truncated": shape(~traj.done), "lengths": shape(traj.model_tokens), "domain_idx": np.asarray(domain_idx)}


def episode_metrics(traj: Trajectories) -> dict:
    """Per-step agent metrics: turns per episode (mean and its distribution), tool errors, environment time."""
    m = {"turns": float(traj.turns.mean()), "tool_errors": float(traj.tool_errors.mean()),
         "env_s": traj.env_s, "episode_done_rate": float(traj.done.mean()),
         "obs_tokens": float((traj.kind == sampling.OBSERVATION).sum(1).mean())}
    for k in range(1, int(traj.turns.max(initial=0)) + 1):
        m[f"turns_frac/{k}"] = float((traj.turns == k).mean())
    return m
