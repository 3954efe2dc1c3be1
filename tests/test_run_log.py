"""Tests for nemocascade.run_log and nemocascade.plots (run outputs, RUN_OUTPUT.md contract)."""

import copy
import json
import os

import matplotlib.image
import numpy as np
import pytest
import tqdm
from tensorboard.backend.event_processing import event_accumulator, event_file_loader
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow

from nemocascade import plots, tb_events, workdir
from nemocascade.run_log import RunLog, duration, load_metrics, progress

TOP_KEYS = ["config", "variant", "seed", "stages", "total_wall_s"]
STAGE_KEYS = ["name", "kind", "domains", "steps", "wall_s", "teachers", "eval"]


def _read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def _read_events(tb_dir):
    """Every Event in every event file under tb_dir, read by TensorBoard's own loader (it checks both CRC-32Cs of
    every record: an independent reader of what nemocascade.tb_events writes)."""
    return {name: list(event_file_loader.LegacyEventFileLoader(os.path.join(tb_dir, name)).Load())
            for name in sorted(os.listdir(tb_dir))}


def _scalars(events):
    return [(v.tag, e.step, v.simple_value) for e in events for v in e.summary.value]


def test_summary_keys_atomic_writes_and_replace_by_name(tmp_path):
    wd = str(tmp_path / "run")
    config = {"rl": {"lr": np.float32(0.5)}, "b": (1, 2)}
    workdir.save_config(wd, config)
    log = RunLog(wd, "cascade_math", None, 0)
    assert json.load(open(os.path.join(wd, "config.json"))) == {"b": [1, 2], "rl": {"lr": 0.5}}
    log.end_stage("sft", "sft", ["math"], 300, 95.2, {"math": {"pass@1": 0.42, "n": 500}})
    s = json.load(open(os.path.join(wd, "summary.json")))
    assert list(s) == TOP_KEYS
    assert s["config"] == "cascade_math" and s["variant"] is None and s["seed"] == 0
    assert list(s["stages"][0]) == STAGE_KEYS
    assert s["stages"][0] == {
        "name": "sft",
        "kind": "sft",
        "domains": ["math"],
        "steps": 300,
        "wall_s": 95.2,
        "teachers": None,
        "eval": {"math": {"pass@1": 0.42, "n": 500}},
    }
    assert s["total_wall_s"] == 95.2  # sum of stage wall_s until finish()

    log.end_stage(
        "mopd",
        "mopd",
        ["math", "code"],
        np.int64(50),
        40.0,
        {"math": {"pass@1": np.float32(0.5), "n": 500, "pass@8": 0.7}, "code": {"pass@1": 0.25, "n": 64}},
        teachers={"math": "sft"},
        lr=2e-6,
    )
    s = json.load(open(os.path.join(wd, "summary.json")))
    assert list(s["stages"][1]) == STAGE_KEYS + ["lr"]
    assert s["stages"][1]["teachers"] == {"math": "sft"} and s["stages"][1]["steps"] == 50
    assert s["stages"][1]["eval"] == {
        "math": {"pass@1": 0.5, "n": 500, "pass@8": 0.7},
        "code": {"pass@1": 0.25, "n": 64},
    }
    assert s["total_wall_s"] == 135.2

    # Replacing an existing stage keeps its position.
    log.end_stage("sft", "sft", ["math"], 310, 100.0, {"math": {"pass@1": 0.45, "n": 500}})
    s = json.load(open(os.path.join(wd, "summary.json")))
    assert [(st["name"], st["steps"]) for st in s["stages"]] == [("sft", 310), ("mopd", 50)]
    log.finish(200.5)
    s = json.load(open(os.path.join(wd, "summary.json")))
    assert s["total_wall_s"] == 200.5 and s == log.summary
    log.close()
    assert sorted(os.listdir(wd)) == ["config.json", "summary.json"]  # no temp files left behind


def test_atomic_write_failure_keeps_old_summary(tmp_path, monkeypatch):
    wd = str(tmp_path)
    log = RunLog(wd, "c", None, 0)
    log.end_stage("a", "sft", ["math"], 1, 1.0, {"math": {"pass@1": 0.1, "n": 2}})
    before = open(os.path.join(wd, "summary.json")).read()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        log.end_stage("b", "grpo", ["math"], 1, 1.0, {"math": {"pass@1": 0.2, "n": 2}})
    assert open(os.path.join(wd, "summary.json")).read() == before
    assert sorted(os.listdir(wd)) == ["summary.json"]


def test_eval_validation_names_domain(tmp_path):
    log = RunLog(str(tmp_path), "c", None, 0)
    with pytest.raises(ValueError, match=r"eval\['code'\] lacks \['n'\]"):
        log.end_stage("a", "grpo", ["code"], 1, 1.0, {"math": {"pass@1": 0.1, "n": 2}, "code": {"pass@1": 0.3}})
    with pytest.raises(ValueError, match=r"eval\['if'\] lacks \['pass@1', 'n'\]"):
        log.end_stage("a", "grpo", ["if"], 1, 1.0, {"if": {"acc": 0.3}})
    with pytest.raises(ValueError, match=r"eval\['math'\]\['pass@1'\] = nan"):
        log.end_stage("a", "grpo", ["math"], 1, 1.0, {"math": {"pass@1": float("nan"), "n": 2}})
    assert not os.path.exists(tmp_path / "summary.json")


def test_metrics_jsonl_global_step_and_conversion(tmp_path):
    import jax.numpy as jnp

    wd = str(tmp_path)
    log = RunLog(wd, "c", None, 0)
    for step in range(3):
        log.log_step("sft", step, {"loss": np.float32(2.0 - step), "lr": jnp.asarray(0.5)})
    for step in (1, 3, 5):
        log.log_step("grpo", step, {"reward": step / 10})
    log.log_step("grpo", 5, {"eval_math": 0.25})  # same step twice is allowed (eval at last step)
    # Flushed per line: readable before close().
    rows = _read_jsonl(os.path.join(wd, "metrics.jsonl"))
    assert [(r["stage"], r["step"], r["global_step"]) for r in rows] == [
        ("sft", 0, 0),
        ("sft", 1, 1),
        ("sft", 2, 2),
        ("grpo", 1, 3),
        ("grpo", 3, 5),
        ("grpo", 5, 7),
        ("grpo", 5, 7),
    ]
    assert [r.get("loss") for r in rows[:3]] == [2.0, 1.0, 0.0]
    assert rows[0]["lr"] == 0.5 and type(rows[0]["lr"]) is float
    assert rows[4]["reward"] == 0.3 and rows[6] == {**rows[6], "eval_math": 0.25}
    assert all(abs(r["time"] - rows[0]["time"]) < 60 for r in rows)

    with pytest.raises(ValueError, match=r"step 4 < last logged step 5.*truncate_after"):
        log.log_step("grpo", 4, {"reward": 0.0})
    with pytest.raises(ValueError, match="stage 'sft' was already followed by 'grpo'"):
        log.log_step("sft", 3, {"loss": 0.0})
    with pytest.raises(ValueError, match="metric key 'step' is reserved"):
        log.log_step("grpo", 6, {"step": 1.0})
    with pytest.raises(ValueError, match="metric 'vec'"):
        log.log_step("grpo", 6, {"vec": np.ones(3)})
    log.close()
    assert len(_read_jsonl(os.path.join(wd, "metrics.jsonl"))) == 7  # rejected calls wrote nothing


def test_resume_keeps_stages_and_truncates_metrics(tmp_path):
    wd = str(tmp_path)
    log = RunLog(wd, "cascade", "tiny", 1)
    for step in range(5):
        log.log_step("sft", step, {"loss": float(step)})
    log.end_stage("sft", "sft", ["math"], 5, 3.0, {"math": {"pass@1": 0.1, "n": 8}})
    for step in range(6):
        log.log_step("grpo", step, {"reward": float(step)})
    log.close()  # "crash" during grpo, last checkpoint at grpo step 2

    log = RunLog(wd, "cascade", "tiny", 1)
    assert log.stage_done("sft") and not log.stage_done("grpo")
    assert [s["name"] for s in log.summary["stages"]] == ["sft"]
    log.truncate_after("grpo", 2)
    rows = _read_jsonl(os.path.join(wd, "metrics.jsonl"))
    assert [(r["stage"], r["step"]) for r in rows] == [("sft", i) for i in range(5)] + [
        ("grpo", 0),
        ("grpo", 1),
        ("grpo", 2),
    ]
    log.log_step("grpo", 3, {"reward": 30.0})  # continues on the same global axis
    log.end_stage("grpo", "grpo", ["math"], 4, 2.0, {"math": {"pass@1": 0.2, "n": 8}})
    log.close()
    rows = load_metrics(os.path.join(wd, "metrics.jsonl"))
    assert [r["global_step"] for r in rows] == list(range(9))
    assert rows[-1]["reward"] == 30.0
    assert [s["name"] for s in json.load(open(os.path.join(wd, "summary.json")))["stages"]] == ["sft", "grpo"]
    assert not [f for f in os.listdir(wd) if f.endswith(".tmp")]

    # truncate_after(stage, -1) drops the whole stage; re-logging restarts right after sft.
    log = RunLog(wd, "cascade", "tiny", 1)
    log.truncate_after("grpo", -1)
    log.log_step("grpo", 10, {"reward": 1.0})
    log.close()
    assert [(r["stage"], r["global_step"]) for r in load_metrics(os.path.join(wd, "metrics.jsonl"))][-2:] == [
        ("sft", 4),
        ("grpo", 5),
    ]

    with pytest.raises(ValueError, match="seed=1, not 2"):
        RunLog(wd, "cascade", "tiny", 2)
    with pytest.raises(ValueError, match="variant='tiny', not 'tiny,kl'"):  # unless the config check allowed it
        RunLog(wd, "cascade", "tiny,kl", 1)
    log = RunLog(wd, "cascade", "tiny,kl", 1, variant_change=True)  # e.g. a variant that adds stages at the end
    assert log.summary["variant"] == "tiny,kl" and log.summary["variants_before"] == ["tiny"]
    assert [s["name"] for s in log.summary["stages"]] == ["sft", "grpo"]  # finished stages kept
    with pytest.raises(ValueError, match="seed=1, not 3"):  # a variant change allows nothing else
        RunLog(wd, "cascade", "tiny,kl", 3, variant_change=True)


def test_resumed_total_wall_time_adds_the_earlier_processes(tmp_path):
    """A run resumed with nothing left to do once wrote its own few seconds as the run's total wall time."""
    wd = str(tmp_path)
    log = RunLog(wd, "cascade", None, 0)
    assert log.wall_s_before == 0.0
    log.end_stage("sft", "sft", ["math"], 5, 30.0, {"math": {"pass@1": 0.1, "n": 8}})
    log.close()  # interrupted: the total so far is the finished stages' sum
    log = RunLog(wd, "cascade", None, 0)
    assert log.wall_s_before == 30.0
    log.end_stage("grpo", "grpo", ["math"], 4, 20.0, {"math": {"pass@1": 0.2, "n": 8}})
    log.finish(log.wall_s_before + 25.0)  # what the driver passes: this process ran 25 s
    log.close()
    log = RunLog(wd, "cascade", None, 0)
    assert log.wall_s_before == 55.0
    log.finish(log.wall_s_before + 3.0)  # a resume that found every stage done
    assert json.load(open(os.path.join(wd, "summary.json")))["total_wall_s"] == 58.0


def test_crash_cut_line_is_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"stage": "sft", "step": 0, "loss": 1.0}\n{"stage": "sft", "st')
    log = RunLog(str(tmp_path), "c", None, 0)
    log.log_step("sft", 1, {"loss": 0.5})
    log.close()
    rows = _read_jsonl(path)
    assert [(r["step"], r["global_step"], r["loss"]) for r in rows] == [(0, 0, 1.0), (1, 1, 0.5)]
    path.write_text('{"stage": "sft", "step": 0}\nnot json\n{"stage": "sft", "step": 1}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not valid JSON"):
        load_metrics(str(path))


def test_tensorboard_scalars_and_purge_on_truncate(tmp_path):
    wd = str(tmp_path)
    log = RunLog(wd, "c", None, 0)
    log.log_step("sft", 0, {"loss": 2.0})
    log.log_step("sft", 1, {"loss": 1.5})
    log.log_step("grpo", 0, {"reward": 0.25, "kl": 0.5})
    log.log_step("grpo", 1, {"reward": 0.75, "kl": 0.5})
    log.truncate_after("grpo", 0)
    log.log_step("grpo", 1, {"reward": 1.0, "kl": 0.0})
    log.close()
    files = _read_events(os.path.join(wd, "tb"))
    assert len(files) == 2 and all(os.path.getsize(os.path.join(wd, "tb", f)) > 0 for f in files)
    first, second = (files[k] for k in sorted(files, key=lambda k: int(k.rsplit(".", 1)[1])))
    assert _scalars(first) == [
        ("sft/loss", 0, 2.0),
        ("sft/loss", 1, 1.5),
        ("grpo/reward", 2, 0.25),
        ("grpo/kl", 2, 0.5),
        ("grpo/reward", 3, 0.75),
        ("grpo/kl", 3, 0.5),
    ]
    assert _scalars(second) == [("grpo/reward", 3, 1.0), ("grpo/kl", 3, 0.0)]
    # TensorBoard drops earlier events at steps >= 3 when it sees this SessionLog START.
    starts = [(e.step, e.session_log.status) for e in second if e.HasField("session_log")]
    assert starts == [(3, event_pb2.SessionLog.START)]
    # what `tensorboard --logdir` shows: the purged step 3 replaced, file by file in order
    shown = event_accumulator.EventAccumulator(os.path.join(wd, "tb"))
    shown.Reload()
    assert sorted(shown.Tags()["scalars"]) == ["grpo/kl", "grpo/reward", "sft/loss"]
    assert [(e.step, e.value) for e in shown.Scalars("grpo/reward")] == [(2, 0.25), (3, 1.0)]
    assert [(e.step, e.value) for e in shown.Scalars("sft/loss")] == [(0, 2.0), (1, 1.5)]


def test_event_records_match_tensorboards_framing():
    # CRC-32C check value of "123456789" (RFC 3720 B.4) and tensorboard's own masked CRC of a record
    assert tb_events.crc32c(b"123456789") == 0xE3069283
    data = tb_events.event(1.5, 300, scalar=("a/b", 0.25))
    assert tb_events.masked_crc32c(data) == pywrap_tensorflow.masked_crc32c(data)
    e = event_pb2.Event.FromString(data)
    assert (e.wall_time, e.step, e.summary.value[0].tag, e.summary.value[0].simple_value) == (1.5, 300, "a/b", 0.25)
    with pytest.raises(ValueError, match="step must be >= 0"):
        tb_events.event(0.0, -1)


def test_progress_lines_give_the_time_left(monkeypatch, capsys):
    # a clock at 2 s per item: after 4 of 20 items (8 s) 16 are left at 2 s each, 32 s
    now = [0.0]
    monkeypatch.setattr("nemocascade.run_log.time.time", lambda: now[0])
    monkeypatch.delenv("NEMOCASCADE_PROGRESS", raising=False)
    bar = progress(20, "sft")
    for k in range(1, 21):
        now[0] = 2.0 * k
        bar.update()
    lines = capsys.readouterr().err.splitlines()
    etas = [line.split("ETA ")[1] if "ETA " in line else None for line in lines]
    assert etas == ["36s", "32s", "28s", "24s", "20s", "16s", "12s", "8s", "4s", None]  # done: none to give
    assert lines[1].startswith("sft: 4/20 (20%) it 8.0s, 0.5 it/s, ETA 32s")


def test_duration_formats():
    assert [duration(s) for s in (0, 44.6, 60, 725, 3600, 11220)] == ["0s", "45s", "1m00s", "12m05s", "1h00m",
                                                                        "3h07m"]


def test_progress_lines_when_not_a_tty(monkeypatch, capsys):
    monkeypatch.delenv("NEMOCASCADE_PROGRESS", raising=False)
    assert list(progress(range(20), "sft")) == list(range(20))
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" it ")[0] for line in lines] == [f"sft: {2 * k}/20 ({10 * k}%)" for k in range(1, 11)]

    with progress(4, "grpo") as bar:
        for _ in range(3):
            bar.update()
            bar.set_postfix(reward=0.5)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" it ")[0] for line in lines] == ["grpo: 1/4 (25%)", "grpo: 2/4 (50%)", "grpo: 3/4 (75%)"]
    assert lines[-1].endswith(" reward=0.5")

    for _ in progress(iter(range(3)), "gen"):  # unknown total: one line at the end
        pass
    assert [line.split(" it ")[0] for line in capsys.readouterr().err.splitlines()] == ["gen: 3"]

    monkeypatch.setenv("NEMOCASCADE_PROGRESS", "1")
    bar = progress(range(3), "sft")
    assert isinstance(bar, tqdm.tqdm) and bar.total == 3 and bar.dynamic_ncols
    assert bar.mininterval == 1.0
    assert list(bar) == [0, 1, 2]
    silent = progress(range(3), "x", disable=True)
    assert list(silent) == [0, 1, 2]
    capsys.readouterr()


SUMMARY = {
    "config": "cascade_math",
    "variant": "tiny",
    "seed": 0,
    "total_wall_s": 10.0,
    "stages": [
        {
            "name": "sft",
            "kind": "sft",
            "domains": ["math"],
            "steps": 3,
            "wall_s": 1.0,
            "teachers": None,
            "eval": {"math": {"pass@1": 0.42, "n": 500}, "code": {"pass@1": 0.1, "n": 64}},
        },
        {
            "name": "grpo_math",
            "kind": "grpo",
            "domains": ["math"],
            "steps": 3,
            "wall_s": 1.0,
            "teachers": None,
            "eval": {"math": {"pass@1": 0.5126, "n": 500}, "code": {"pass@1": 0.09375, "n": 32}},
        },
        {
            "name": "mopd",
            "kind": "mopd",
            "domains": ["math", "if"],
            "steps": 3,
            "wall_s": 1.0,
            "teachers": {"math": "sft"},
            "eval": {"math": {"pass@1": 0.6, "n": 500}, "if": {"pass@1": 1.0, "n": 10}},
        },
    ],
}


def test_eval_table_markdown_exact():
    assert plots.eval_table_markdown(SUMMARY) == (
        "| stage | math (n=500) | code | if (n=10) |\n"
        "|:--|--:|--:|--:|\n"
        "| sft | 42.0 | 10.0 (n=64) | - |\n"
        "| grpo_math | 51.3 | 9.4 (n=32) | - |\n"
        "| mopd | 60.0 | - | 100.0 |"
    )
    branched = copy.deepcopy(SUMMARY)
    branched["stages"][1]["side_branch"] = True  # off the main line: bracketed
    assert plots.eval_table_markdown(branched).splitlines()[3] == "| [grpo_math] | 51.3 | 9.4 (n=32) | - |"


def test_paired_table_markdown_exact():
    assert plots.paired_table_markdown(SUMMARY) == ""  # no stage recorded paired gains
    s = copy.deepcopy(SUMMARY)
    s["stages"][1].update(started_from="sft", paired_vs_start={"math": {"mean_gain": 0.093, "ci95": [0.05, 0.137]},
                                                               "code": {"mean_gain": -0.006, "ci95": [-0.03, 0.02]}})
    assert plots.paired_table_markdown(s) == (
        "| stage (from) | math | code | if |\n"
        "|:--|--:|--:|--:|\n"
        "| grpo_math (from sft) | **+9.3 [+5.0, +13.7]** | -0.6 [-3.0, +2.0] | - |")


def test_trailing_mean_matches_hand_values():
    np.testing.assert_allclose(plots._trailing_mean(np.array([1.0, 2.0, 3.0, 4.0]), 2), [1.0, 1.5, 2.5, 3.5])
    np.testing.assert_allclose(plots._trailing_mean(np.array([3.0, 0.0, 3.0, 6.0]), 3), [3.0, 1.5, 2.0, 3.0])


def test_curves_draw_the_raw_points_under_the_mean(tmp_path):
    log = RunLog(str(tmp_path), "c", None, 0)
    for step, v in enumerate([1.0, 2.0, 3.0, 4.0]):
        log.log_step("sft", step, {"eval/math/pass@1": v})
    log.log_step("grpo", 0, {"eval/math/pass@1": 9.0})
    log.close()
    fig = plots.metric_curves_figure(str(tmp_path / "metrics.jsonl"), ["eval/math/pass@1"], smooth=2)
    lines = fig.axes[0].lines
    raw = [(list(ln.get_xdata()), list(ln.get_ydata())) for ln in lines if ln.get_marker() == "o"]
    mean = [(list(ln.get_xdata()), list(ln.get_ydata())) for ln in lines
            if ln.get_marker() != "o" and ln.get_linestyle() == "-"]
    assert raw == [([0, 1, 2, 3], [1, 2, 3, 4]), ([4], [9])]  # every point, per stage
    assert all(ln.get_linestyle() == "None" for ln in lines if ln.get_marker() == "o")
    assert mean == [([0, 1, 2, 3], [1.0, 1.5, 2.5, 3.5]), ([4], [9.0])]  # the trailing mean restarts per stage


def _assert_real_png(path):
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    img = matplotlib.image.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert np.ptp(img[..., :3]) > 0.5  # drawn content, not a blank canvas


def test_plots_write_pngs(tmp_path):
    log = RunLog(str(tmp_path), "c", None, 0)
    rng = np.random.default_rng(0)
    for step in range(20):
        log.log_step("sft", step, {"loss": 2.0 - 0.05 * step + 0.1 * rng.random()})
    for step in range(15):
        log.log_step("grpo", step, {"reward": 0.03 * step, "loss": 0.1 * rng.random()})
    log.close()
    metrics = str(tmp_path / "metrics.jsonl")
    out = str(tmp_path / "plots" / "curves.png")
    plots.plot_metric_curves(metrics, out, ["loss", "reward"], smooth=3, title="tiny")
    _assert_real_png(out)
    with pytest.raises(ValueError, match=r"metric 'kl' is not in .*available: \['loss', 'reward'\]"):
        plots.plot_metric_curves(metrics, str(tmp_path / "x.png"), ["kl"])

    out = str(tmp_path / "plots" / "eval.png")
    plots.plot_eval_by_stage(SUMMARY, out)
    _assert_real_png(out)
