"""grain input pipelines: tokenized SFT batches, raw prompt batches for RL, left-padded prompts.

All pipelines are ``MapDataset.source(source).shuffle(seed).repeat().map(...).batch(...)`` turned
into an ``IterDataset``: seeded, infinite (reshuffled every epoch), and resumable. An iterator's
``get_state()`` is a small JSON-serialisable dict (``{"next_index": k}``); a fresh iterator of
the same dataset given ``set_state(state)`` yields exactly the batches the original would have
yielded next. Store it next to the model checkpoint.

``source`` is anything with ``__len__`` and ``__getitem__`` returning records (domains.py
record contract): a list of dicts or ``tfds_builder.prepare(...)[split]``.

Single process by default (grain's prefetch threads only). To move tokenization into worker
processes, call ``.mp_prefetch(grain.MultiprocessingOptions(num_workers=N))`` on the returned
IterDataset; the source and tokenizer must then be picklable (both of ours are), and grain reads
absl flags, so run under ``absl.app.run`` (or call ``absl.flags.FLAGS.mark_as_parsed()``). The
batches are the same as single-process ones; the iterator state gets a different (still JSON)
layout.
"""

from __future__ import annotations

import functools
from typing import Sequence

import grain
import numpy as np

from nemocascade import chat

# Prefetch a few batches on two threads: enough to hide tokenization, without crowding the
# (two) CPU cores the training step runs on.
READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)


def encode_example(record: dict, tokenizer, seq_len: int,
                   thinking: bool = True, pad: bool = True) -> dict[str, np.ndarray]:
    """One SFT example: ``tokens`` int32[seq_len] and ``loss_mask`` float32[seq_len].

    tokens = encode(render_prompt(prompt)) + encode(render_completion(reasoning, response)),
    truncated to ``seq_len`` then right-padded with ``pad_id``. Prompt and completion are
    encoded separately, as the sampler sees them (prompt ids, then generated ids).
    ``loss_mask[t] = 1`` iff token t belongs to the completion (the assistant's output up to and
    including ``<|im_end|>``); prompt and pad tokens are 0. With next-token prediction, the loss
    on ``logits[:, t-1]`` predicting ``tokens[:, t]`` is weighted by ``loss_mask[:, t]``.
    ``pad=False`` leaves the (truncated) example unpadded, for packing.
    """
    prompt = tokenizer.encode(chat.render_prompt(record["prompt"], thinking=thinking))
    completion = tokenizer.encode(
        chat.render_completion(record["reasoning"], record["response"], thinking=thinking))
    ids = (list(prompt) + list(completion))[:seq_len]
    mask = ([0.0] * len(prompt) + [1.0] * len(completion))[:seq_len]
    pad = seq_len - len(ids) if pad else 0
    return {
        "tokens": np.asarray(ids + [tokenizer.pad_id] * pad, dtype=np.int32),
        "loss_mask": np.asarray(mask + [0.0] * pad, dtype=np.float32),
    }


def _shuffled_forever(source, seed: int) -> grain.MapDataset:
    if len(source) == 0:
        raise ValueError("source is empty: nothing to shuffle and repeat")
    # repeat() after shuffle(): each epoch is a new permutation (reseed_each_epoch).
    return grain.MapDataset.source(source).shuffle(seed=seed).repeat()


def sft_dataset(source, tokenizer, seq_len: int, batch_size: int, seed: int,
                thinking: bool = True, pack: bool = False) -> grain.IterDataset:
    """Infinite shuffled SFT batches ``{"tokens": int32[B, L], "loss_mask": float32[B, L]}``.

    See :func:`encode_example` for one row. Iterator state is JSON-serialisable (module
    docstring). The stream is infinite, so every batch is full (a batch may span two epochs).

    ``pack=True``: each row holds as many whole examples as fit (grain's first-fit packing over
    ``batch_size`` bins; an example longer than ``seq_len`` is truncated, never split across rows),
    and the batch adds ``segment_ids`` int32[B, L] (1, 2, ... per example, 0 on padding) and
    ``positions`` int32[B, L] (0 at each example's first token) for ``forward(segment_ids=...)``.
    A step then sees a variable number of examples (about ``batch_size * seq_len / mean length``)
    and spends no compute on padding beyond each row's tail.
    """
    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"seq_len and batch_size must be >= 1, got {seq_len}, {batch_size}")
    ds = _shuffled_forever(source, seed)
    # A partial, not a lambda: picklable for grain worker processes.
    ds = ds.map(functools.partial(encode_example, tokenizer=tokenizer, seq_len=seq_len,
                                  thinking=thinking, pad=not pack))
    if not pack:
        return ds.batch(batch_size, drop_remainder=True).to_iter_dataset(READ_OPTIONS)
    packed = grain.experimental.FirstFitPackIterDataset(
        ds.to_iter_dataset(READ_OPTIONS), length_struct={"tokens": seq_len, "loss_mask": seq_len},
        num_packing_bins=batch_size, shuffle_bins=False)
    return packed.map(_packed_row).batch(batch_size, drop_remainder=True)


def _packed_row(row: dict) -> dict[str, np.ndarray]:
    """grain's packed features -> ours (its pad value 0 is masked by segment 0 and loss_mask 0)."""
    return {"tokens": row["tokens"], "loss_mask": row["loss_mask"],
            "segment_ids": row["tokens_segment_ids"], "positions": row["tokens_positions"]}


def prompt_dataset(source, batch_size: int, seed: int) -> grain.IterDataset:
    """Infinite shuffled batches of raw records (``list[dict]`` of length ``batch_size``) for RL.

    Tokenize with :func:`encode_prompts` where the sampler needs ids. Iterator state is
    JSON-serialisable (module docstring).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ds = _shuffled_forever(source, seed)
    return ds.batch(batch_size, drop_remainder=True, batch_fn=list).to_iter_dataset(READ_OPTIONS)


def encode_prompts(tokenizer, prompts: Sequence[str], max_len: int,
                   thinking: bool = True, bucket: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Chat-rendered, **left**-padded prompt ids for the sampler.

    Returns ``tokens`` int32[B, W] (row b = ``pad_id`` * (W - n_b) + ids_b, so every prompt ends at the
    last column and generation appends on the right) and ``lengths`` int32[B] = n_b. W = ``max_len``, or with
    ``bucket`` > 0 the longest prompt rounded up to a multiple of ``bucket`` (at most ``max_len``): the sampler
    then prefills and caches no more padding than that, and compiles once per bucket. Raises ``ValueError``
    naming the row if a prompt needs more than ``max_len`` tokens (truncating it would silently change the task).
    """
    tokens = np.full((len(prompts), max_len), tokenizer.pad_id, dtype=np.int32)
    lengths = np.zeros((len(prompts),), dtype=np.int32)
    for b, prompt in enumerate(prompts):
        ids = tokenizer.encode(chat.render_prompt(prompt, thinking=thinking))
        if len(ids) > max_len:
            raise ValueError(
                f"prompt row {b} needs {len(ids)} tokens > max_len={max_len}: {prompt[:60]!r}")
        if ids:
            tokens[b, max_len - len(ids):] = ids
        lengths[b] = len(ids)
    return bucket_left_padded(tokens, lengths, bucket) if bucket > 0 else (tokens, lengths)


def bad_mix_weights(domains, weights) -> tuple[dict, dict]:
    """The entries of a mixture's `weights` (domain -> weight) that name no domain of `domains`, and those
    whose weight is not > 0: what `stages/common.py mixture_source` refuses and config validation reports."""
    unknown = {d: w for d, w in weights.items() if d not in domains}
    return unknown, {d: w for d, w in weights.items() if d not in unknown and not w > 0}


def pad_to_bucket(n: int, bucket: int, most: int | None = None) -> int:
    """`n` rounded up to a multiple of `bucket` (at most `most`): the one rule by which prompts, observations and
    kept groups are padded, so a jitted function sees a few shapes instead of one per size."""
    padded = -(-int(n) // bucket) * bucket
    return padded if most is None else min(padded, most)


def bucket_left_padded(tokens: np.ndarray, lengths: np.ndarray, bucket: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded rows [B, W] cut to the longest row padded to its bucket (at least one bucket, at most W):
    only padding columns go."""
    width = pad_to_bucket(max(int(np.max(lengths, initial=0)), 1), bucket, most=tokens.shape[1])
    return tokens[:, tokens.shape[1] - width:], lengths
