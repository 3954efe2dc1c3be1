"""Preflight: a program's peak from XLA's accounting, the refusal naming the knob, and that the knobs it names
(micro-batches for the update) lower the peak it measures; a run prints its stage's preflight."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from nemocascade import objectives, optim, preflight, train_state
from nemocascade.errors import BadInput
from nemocascade.models import ModelConfig, init_params
from nemocascade.rl import update


def test_peak_counts_a_programs_output_and_the_refusal_names_the_knob():
    lowered = jax.jit(lambda: jnp.zeros((1024, 1024), jnp.float32)).lower()
    assert preflight.peak(lowered.compile()) >= 4 * 2**20  # its 4 MiB output
    with pytest.raises(BadInput, match=r"\[grpo\] its update needs 0\.0\d GiB per device and a device holds 0\.00: "
                                       r"raise objective.micro_batches"):
        preflight.check("grpo", [("update", lowered, 2**20, "raise objective.micro_batches (now 1)")], limit=2**20)
    peaks = preflight.check("grpo", [("update", lowered, 2**20, "-")], limit=2**30)
    assert peaks["update"] >= 5 * 2**20  # the resident megabyte beside it counted


def test_more_micro_batches_lower_the_update_peak_preflight_measures():
    cfg = ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128)
    params = init_params(cfg, jax.random.key(0))
    tx, _ = optim.make_optimizer(ml_collections.ConfigDict(dict(optim.DEFAULTS)), 10)
    state = train_state.create(params, tx, jax.random.key(0))
    N, W = 32, 129
    batch = {"tokens": np.ones((N, W), np.int32), "valid": np.ones((N, W), bool),
             "positions": np.tile(np.arange(W, dtype=np.int32), (N, 1)), "mask": np.ones((N, W - 1), np.float32),
             "sampler_logp": np.zeros((N, W - 1), np.float32), "domain_idx": np.zeros((N,), np.int32),
             "rewards": np.ones((4, 8), np.float32), "truncated": np.zeros((4, 8), bool)}
    objective = objectives.build(dict(terms={"pg": 1.0}))
    peaks = {m: preflight.peak(jax.jit(update.policy_step(tx, model_cfg=cfg, objective=objective, micro_batches=m))
                               .lower(state, batch).compile()) for m in (1, 8)}
    assert peaks[8] < 0.6 * peaks[1], peaks
