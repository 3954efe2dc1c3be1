"""nemocascade.rl.filters: hand-worked tables, readmission statistics, state round-trips."""

import json

import numpy as np
import pytest

from nemocascade.rl import filters

# Rows: all right, all wrong, mixed, all 0.5 (non-binary but equal), mixed non-binary.
REWARDS = np.array([
    [1.0, 1.0, 1.0, 1.0],
    [0.0, 0.0, 0.0, 0.0],
    [1.0, 0.0, 0.0, 1.0],
    [0.5, 0.5, 0.5, 0.5],
    [0.2, 0.6, 0.4, 0.5],
])


def test_dynamic_filter_keep_table():
    np.testing.assert_array_equal(filters.dynamic_filter_keep(REWARDS), [False, False, True, False, True])
    # A single rollout per prompt is always "all equal".
    np.testing.assert_array_equal(filters.dynamic_filter_keep(np.array([[1.0], [0.0]])), [False, False])


def test_rewards_validation_names_the_row():
    bad = REWARDS.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match=r"rows \[3\]"):
        filters.dynamic_filter_keep(bad)
    with pytest.raises(ValueError, match="shape"):
        filters.max_reward_keep(np.zeros(4), 0.5)


def test_max_reward_keep_table():
    # Max per row: 1, 0, 1, 0.5, 0.6. Strictly above 0.5 -> the 0.5 row is dropped.
    np.testing.assert_array_equal(filters.max_reward_keep(REWARDS, 0.5), [True, False, True, False, True])
    np.testing.assert_array_equal(filters.max_reward_keep(REWARDS, 0.0), [True, False, True, True, True])
    # SWE agentless rewards can be negative (-1 unparsable).
    np.testing.assert_array_equal(filters.max_reward_keep(np.array([[-1.0, -1.0]]), -2.0), [True])


# ------------------------------------------------------------------------------------ EpochFilter


def test_epoch_filter_hand_worked_classification():
    f = filters.EpochFilter(p_readmit_hard=0.0, p_readmit_easy=0.0)
    # "a" is seen twice: [1,1] then [1,0] -> 3/4, kept. "b" all 0 -> hard. "c" all 1 -> easy.
    f.update(["a", "b"], [[1, 1], [0, 0]])
    f.update(["a", "c"], [[1, 0], [1, 1]])
    assert all(f.keep(p) for p in "abcz")  # nothing is dropped during the first epoch
    f.end_epoch()
    assert [f.keep(p) for p in "abcz"] == [True, False, False, True]
    assert f.summary() == {"epoch": 1, "hard": 1, "easy": 1, "dropped": 2}
    # p = 1: everything is re-admitted, but the classes are remembered.
    g = filters.EpochFilter(p_readmit_hard=1.0, p_readmit_easy=1.0)
    g.update(["b", "c"], [[0, 0], [1, 1]])
    g.end_epoch()
    assert g.keep("b") and g.keep("c") and g.summary()["hard"] == 1


def test_epoch_filter_reclassifies_readmitted_prompt():
    f = filters.EpochFilter(p_readmit_hard=1.0, p_readmit_easy=0.0)
    f.update(["x", "y"], [[0, 0, 0], [0, 0, 0]])
    f.end_epoch()
    assert f.summary()["hard"] == 2
    f.update(["x"], [[1, 0, 0]])  # x is now in between: unclassified; y unseen keeps "hard"
    f.end_epoch()
    assert f.summary() == {"epoch": 2, "hard": 1, "easy": 0, "dropped": 0}


def test_epoch_filter_readmission_frequencies():
    # 20k hard and 20k easy prompts. Std of the re-admitted fraction: hard sqrt(.1*.9/2e4) = 0.0021,
    # easy sqrt(.01*.99/2e4) = 0.0007; the bounds below are ~5 sigma and would fail if p were swapped.
    n = 20_000
    hard = [f"h{i}" for i in range(n)]
    easy = [f"e{i}" for i in range(n)]
    f = filters.EpochFilter(p_readmit_hard=0.1, p_readmit_easy=0.01, seed=123)
    f.update(hard, np.zeros((n, 4)))
    f.update(easy, np.ones((n, 4)))
    f.update(["mid"], [[0, 1, 0, 1]])
    f.end_epoch()
    kept_h1 = {p for p in hard if f.keep(p)}
    kept_e1 = {p for p in easy if f.keep(p)}
    assert abs(len(kept_h1) / n - 0.1) < 0.01
    assert abs(len(kept_e1) / n - 0.01) < 0.0035
    assert f.keep("mid")
    # Next epoch the dropped prompts produce no rewards, yet get a fresh, independent draw: the fraction
    # is again ~0.1, and the overlap with last epoch's re-admitted set is ~0.1 * 0.1 = 0.01.
    f.end_epoch()
    kept_h2 = {p for p in hard if f.keep(p)}
    assert abs(len(kept_h2) / n - 0.1) < 0.01
    assert abs(len(kept_h1 & kept_h2) / n - 0.01) < 0.0035


def test_epoch_filter_state_round_trip_through_json():
    f = filters.EpochFilter(p_readmit_hard=0.3, p_readmit_easy=0.2, seed=7)
    ids = [f"p{i}" for i in range(200)]
    rng = np.random.default_rng(0)
    f.update(ids, rng.integers(0, 2, size=(200, 2)).astype(float))
    f.end_epoch()
    f.update(ids[:50], rng.integers(0, 2, size=(50, 2)).astype(float))  # mid-epoch checkpoint
    g = filters.EpochFilter(seed=999)
    g.load_state_dict(json.loads(json.dumps(f.state_dict())))
    assert g.state_dict() == f.state_dict()
    f.end_epoch()
    g.end_epoch()  # same rng state and accumulators -> the same draws
    assert [f.keep(p) for p in ids] == [g.keep(p) for p in ids]
    assert 0 < sum(not f.keep(p) for p in ids) < 200
    with pytest.raises(ValueError, match="rng"):
        g.load_state_dict({k: v for k, v in f.state_dict().items() if k != "rng"})


def test_epoch_filter_bad_input_raises():
    f = filters.EpochFilter()
    with pytest.raises(ValueError, match="'q'.*outside"):
        f.update(["q"], [[2.0, 0.0]])
    with pytest.raises(ValueError, match="2 prompt_ids"):
        f.update(["a", "b"], [[1.0, 0.0]])
    with pytest.raises(ValueError, match="p_readmit_easy"):
        filters.EpochFilter(p_readmit_easy=1.5)


# ----------------------------------------------------------------------------------- RefillBuffer


def _groups(start, p):
    ids = np.arange(start, start + p)
    return {"ids": ids, "tokens": np.stack([ids, ids * 10], axis=1), "meta": (ids * 0.5,)}


def test_refill_buffer_fills_and_discards_surplus():
    buf = filters.RefillBuffer(target=4, max_rounds=5)
    assert not buf.ready() and buf.short_by == 4
    buf.add(_groups(0, 3), np.array([True, False, True]))      # keeps ids 0, 2
    assert not buf.ready() and buf.short_by == 2
    buf.add(_groups(10, 3), np.array([True, True, True]))      # keeps 10, 11, 12 -> 5 >= 4
    assert buf.ready()
    batch, stats = buf.take()
    np.testing.assert_array_equal(batch["ids"], [0, 2, 10, 11])
    np.testing.assert_array_equal(batch["tokens"][:, 1], [0, 20, 100, 110])
    np.testing.assert_array_equal(batch["meta"][0], [0.0, 1.0, 5.0, 5.5])
    assert stats == {"rounds": 2, "kept": 4, "dropped": 1, "surplus": 1, "short_by": 0}
    # take() empties the buffer; the surplus (id 12) is not carried over (strictly on-policy).
    assert buf.short_by == 4 and not buf.ready()
    buf.add(_groups(20, 4), np.ones(4, bool))
    batch, stats = buf.take()
    np.testing.assert_array_equal(batch["ids"], [20, 21, 22, 23])
    assert stats["rounds"] == 1


def test_refill_buffer_degrades_gracefully():
    buf = filters.RefillBuffer(target=4, max_rounds=2)
    buf.add(_groups(0, 3), np.array([False, True, False]))
    buf.add(_groups(3, 3), np.zeros(3, bool))
    assert buf.ready()  # out of rounds, short by 3
    batch, stats = buf.take()
    np.testing.assert_array_equal(batch["ids"], [1])
    assert stats == {"rounds": 2, "kept": 1, "dropped": 5, "surplus": 0, "short_by": 3}
    # Nothing kept at all: a zero-length batch with the same structure, never an exception.
    buf.add(_groups(0, 2), np.zeros(2, bool))
    buf.add(_groups(2, 2), np.zeros(2, bool))
    batch, stats = buf.take()
    assert batch["tokens"].shape == (0, 2) and batch["meta"][0].shape == (0,)
    assert stats == {"rounds": 2, "kept": 0, "dropped": 4, "surplus": 0, "short_by": 4}
    assert filters.RefillBuffer(target=2, max_rounds=1).take()[0] is None


def test_refill_buffer_bad_input_names_the_leaf():
    buf = filters.RefillBuffer(target=2, max_rounds=2)
    with pytest.raises(ValueError, match=r"\['tokens'\]"):
        buf.add({"ids": np.arange(3), "tokens": np.zeros((2, 5))}, np.ones(3, bool))
    with pytest.raises(ValueError, match="bool"):
        buf.add({"ids": np.arange(3)}, np.ones(3))
    buf.add({"ids": np.arange(3)}, np.ones(1, bool)[[0, 0, 0]])
    with pytest.raises(ValueError, match="structure"):
        buf.add({"other": np.arange(3)}, np.ones(3, bool))
    with pytest.raises(ValueError, match="max_rounds"):
        filters.RefillBuffer(target=2, max_rounds=0)
