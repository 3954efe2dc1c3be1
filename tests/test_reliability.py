"""The run's guards (issue 12): non-finite updates skipped and counted, a diverged run stopped with its last
good checkpoint; a resume must be the same run; one run per workdir; bad input refused before training in one
line with exit status 2; unreadable checkpoints skipped for the previous good one; SIGTERM/SIGINT honoured at a
step boundary, and the resumed run identical to an uninterrupted one."""
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from nemocascade import cascade, checkpoint, configs, errors, interrupts, train_state, workdir
from nemocascade.stages import common

from conftest import ROOT, final_params, tiny_sft_config


def _rows(wd):
    return [json.loads(line) for line in open(os.path.join(wd, "metrics.jsonl"))]


def _assert_same_tree(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# ------------------------------------------------------------------------------------------ non-finite

def _toy_loss(params, batch, shared):
    """Reports batch["loss"] as the loss; its gradient is batch["g"]."""
    linear = jnp.sum(params["w"] * batch["g"])
    return batch["loss"] + linear - jax.lax.stop_gradient(linear), {}


# SGD with lr 0.5, then an update of exactly 0.25 turned NaN: finite loss and gradient, non-finite new params
_BREAKS_AT_QUARTER = optax.chain(optax.sgd(0.5), optax.stateless(
    lambda u, p: jax.tree.map(lambda x: jnp.where(x == 0.25, jnp.nan, x), u)))


def test_nonfinite_update_is_skipped_and_counted():
    params = {"w": jnp.array([1.0, 2.0, 3.0])}
    state = train_state.create(params, _BREAKS_AT_QUARTER, jax.random.key(0))
    step = jax.jit(train_state.make_step(_toy_loss, _BREAKS_AT_QUARTER))
    g = jnp.array([1.0, -2.0, 4.0])

    state, m = step(state, {"g": g, "loss": jnp.float32(2.0)})  # finite: w - 0.5 g
    np.testing.assert_array_equal(state.params["w"], [0.5, 3.0, 1.0])
    assert float(m["skipped_nonfinite"]) == 0.0 and int(state.step) == 1
    for bad in ({"g": g, "loss": jnp.float32(np.nan)},                       # NaN loss
                {"g": jnp.array([np.inf, 0.0, 0.0]), "loss": jnp.float32(1.0)},  # inf gradient
                {"g": jnp.array([-0.5, 0.0, 0.0]), "loss": jnp.float32(1.0)}):  # NaN params, finite loss and grad
        state, m = step(state, bad)
        np.testing.assert_array_equal(state.params["w"], [0.5, 3.0, 1.0])  # unchanged
        assert float(m["skipped_nonfinite"]) == 1.0
    assert int(state.step) == 4  # the step counter moves on: the next batch is a new one


def test_diverging_run_stops_with_last_good_checkpoint(tmp_path):
    cfg = tiny_sft_config(tmp_path, steps=30)
    cfg.stages.sft.optim.update(lr=1e6, schedule="constant", warmup_steps=0)
    cfg.stages.sft.checkpoint_every = 2
    wd = str(tmp_path / "run")
    with pytest.raises(errors.Diverged, match=r"stage 'sft': 3 non-finite updates in a row .*optim.lr") as err:
        cascade.run(cfg, wd, "sft_math", "tiny")
    assert err.value.exit_code == 3
    rows = _rows(wd)
    skipped = [r["step"] for r in rows if r["skipped_nonfinite"]]
    assert len(skipped) == 3 and skipped == list(range(rows[-1]["step"] - 2, rows[-1]["step"] + 1))
    assert all(np.isfinite(v) for r in rows for v in r.values() if isinstance(v, float))  # no NaN in the log
    ckpt = checkpoint.StageCheckpointer(os.path.join(wd, "checkpoints", "sft"))
    assert ckpt.latest_step() == rows[-1]["step"] + 1
    for step in ckpt.manager.all_steps():  # no checkpoint holds a non-finite value
        restored = ckpt.manager.restore(step, args=checkpoint.ocp.args.Composite(
            state=checkpoint.ocp.args.StandardRestore(), data=checkpoint.ocp.args.JsonRestore()))
        assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(restored["state"]["params"]))
    ckpt.close()


# ------------------------------------------------------------------------------------------ resume config

def test_resume_config_changes_listed_allowed_and_grown(tmp_path):
    wd = str(tmp_path)
    old = {"seed": 0, "eval": {"n": 64}, "stage_order": ("sft", "grpo"),
           "stages": {"sft": {"lr": 0.003}, "grpo": {"group_size": 8}}}
    assert workdir.check_config(wd, old) == []  # a first start: nothing recorded yet
    workdir.save_config(wd, old)
    assert workdir.check_config(wd, json.loads(json.dumps(old))) == []  # tuples vs lists: the same config
    new = json.loads(json.dumps(old))
    new["stages"]["sft"]["lr"], new["eval"]["n"], new["extra"] = 0.001, 128, 1
    with pytest.raises(errors.BadInput) as err:
        workdir.check_config(wd, new)
    msg = str(err.value)
    assert "  stages.sft.lr: 0.003 -> 0.001" in msg and "  eval.n: 64 -> 128" in msg and \
        "  extra: '<absent>' -> 1" in msg
    with pytest.raises(errors.BadInput, match="stages.sft.lr"):  # allowing eval.* leaves the lr refused
        workdir.check_config(wd, new, allow=["eval.*", "extra"])
    new["stages"]["sft"]["lr"] = 0.003
    assert workdir.check_config(wd, new, allow=["eval.*", "extra"]) == [("eval.n", 64, 128), ("extra", "<absent>", 1)]
    workdir.save_config(wd, new)  # the driver's next step once every resume check passed: the new reference
    grown = json.loads(json.dumps(new))  # a stage appended: the same run, extended
    grown["stage_order"] = ["sft", "grpo", "mopd"]
    grown["stages"]["mopd"] = {"steps": 5}
    assert workdir.check_config(wd, grown) == [("stage_order", ["sft", "grpo"], ["sft", "grpo", "mopd"])]
    workdir.save_config(wd, grown)
    reordered = json.loads(json.dumps(grown))
    reordered["stage_order"] = ["grpo", "sft", "mopd"]
    with pytest.raises(errors.BadInput, match=r"stage_order: \['sft', 'grpo', 'mopd'\] -> \['grpo', 'sft', 'mopd'\]"):
        workdir.check_config(wd, reordered)


def test_driver_refuses_changed_resume_and_records_allowed_change(tmp_path):
    cfg = tiny_sft_config(tmp_path, steps=2)
    wd = str(tmp_path / "run")
    cascade.run(cfg, wd, "sft_math", "tiny")
    changed = tiny_sft_config(tmp_path, steps=2)
    changed.stages.sft.optim.lr = 1e-3
    with pytest.raises(errors.BadInput, match=r"stages\.sft\.optim\.lr: 0\.003 -> 0\.001"):
        cascade.run(changed, wd, "sft_math", "tiny")
    relaxed = tiny_sft_config(tmp_path, steps=2)
    relaxed.eval.n = 4
    summary = cascade.run(relaxed, wd, "sft_math", "tiny", allow_changes=["eval.n"])
    (entry,) = summary["config_changes"]
    assert entry["changes"] == [{"key": "eval.n", "old": 8, "new": 4}] and entry["after_stages"] == ["sft"]
    assert json.load(open(os.path.join(wd, "config.json")))["eval"]["n"] == 4


# ------------------------------------------------------------------------------------------ one run per workdir

def test_second_run_on_a_locked_workdir_exits_naming_the_holder(tmp_path):
    wd = str(tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from nemocascade.workdir import WorkdirLock\n"
        f"WorkdirLock({wd!r}).acquire(); print('locked', flush=True); time.sleep(120)")],
        stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        with pytest.raises(errors.WorkdirBusy, match=rf"in use by pid {holder.pid} on host \S+") as err:
            cascade.run(tiny_sft_config(tmp_path, steps=1), wd, "sft_math", "tiny")
        assert time.monotonic() - t0 < 5 and err.value.exit_code == 75
    finally:
        holder.kill()  # SIGKILL: no chance to clean up
        holder.wait()
    lock = workdir.WorkdirLock(wd)  # the kernel released it: no stale lock
    lock.acquire()
    lock.release()


# ------------------------------------------------------------------------------------------ bad input

def _math_cfg():
    return configs.load("cascade_math:tiny")


@pytest.mark.parametrize("override, message", [
    ({"stages.grpo.rollout.group_size": 1}, r"config\.stages\.grpo\.rollout\.group_size=1: the group baseline"),
    ({"stages.sft.seq_len": 2}, r"config\.stages\.sft\.seq_len=2 leaves no room for a response"),
    ({"stages.grpo.objective.micro_batches": 3},
     r"config\.stages\.grpo\.objective\.micro_batches=3 must divide .*=128"),
    ({"stages.grpo.rollout.length_curriculum": ((5, 64),)},
     r"config\.stages\.grpo\.rollout\.length_curriculum=.*entry at step 0"),
    ({"stages.grpo.optim.lr": 0.0}, r"config\.stages\.grpo\.optim\.lr must be > 0"),
    ({"stages.grpo.optim.schedule": "cosin"}, r"config\.stages\.grpo\.optim\.schedule='cosin' unknown"),
    ({"stages.grpo.objective.terms": {"pg": 1.0, "kll": 0.1}},
     r"config\.stages\.grpo\.objective\.terms\.kll: unknown term"),
    ({"stages.grpo.filters.overlong": "drop"}, r"config\.stages\.grpo\.filters\.overlong='drop'"),
    ({"stages.grpo.reward.verifiers": {"math": "maths"}},
     r"config\.stages\.grpo: no reward 'maths': neither a domain \(\[.*'math'"),
    ({"stages.grpo.domains": ["code"]}, r"config\.stages\.grpo\.domains names 'code'"),
    ({"stages.grpo.kind": "ppo"}, r"config\.stages\.grpo\.kind='ppo' unknown"),
    ({"stages.grpo.handoff.init_from": "stage:grpo"}, r"config\.stages\.grpo\.handoff\.init_from='stage:grpo'"),
    ({"stages.sft.optim.max_nonfinite_steps": 0},
     r"config\.stages\.sft\.optim\.max_nonfinite_steps must be an int >= 1"),
    ({"stage_order": ("sft,nosuchstage",)}, r"config\.stage_order names 'nosuchstage'"),  # as the CLI delivers it
    ({"stage_order": ("sft", "grpo", "sft")}, r"repeats a stage"),
    ({"stage_order": ("sfft",)}, r"names 'sfft'.*did you mean 'sft'\?"),
    ({"mesh": {"data": 3, "fsdp": 1, "tensor": 1}}, r"config\.mesh=.*need 3 devices"),
    ({"eval.batch_size": 0}, r"config\.eval\.batch_size must be > 0"),
    ({"eval.sets": {"humaneva": {"n": 4}}}, r"config\.eval\.sets\.humaneva: unknown evaluation set"),
    ({"pretrained.path": "/nonexistent/model.gguf"}, r"config\.pretrained\.path='/nonexistent/model\.gguf' does not"),
])
def test_validate_names_the_bad_key(override, message):
    cfg = configs.load("smollm2_cascade:tiny") if "pretrained.path" in override else _math_cfg()
    for key, value in override.items():
        node, *path = cfg, *key.split(".")
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
    with pytest.raises(errors.BadInput, match=message) as err:
        cascade.validate(cfg)
    assert err.value.exit_code == 2


@pytest.mark.parametrize("override, message", [
    ({"episodes.max_turns": 0}, r"config\.stages\.rl_multi\.episodes\.max_turns=0 must be >= 1"),
    ({"episodes.envs": {"swe": "swe_repare"}}, r"config\.stages\.rl_multi\.episodes\.envs\.swe='swe_repare': no such "
     r"environment"),
    ({"episodes.max_total_tokens": 8}, r"config\.stages\.rl_multi\.episodes\.max_total_tokens=8 must be None or >= "
     r"rollout\.max_new_tokens"),
    ({"prefilter.drop_unsolved": 1.5}, r"config\.stages\.rl_multi\.prefilter\.drop_unsolved=1\.5 must lie in \[0, 1\]"),
    ({"rollout.group_size": 1}, r"config\.stages\.rl_multi\.rollout\.group_size=1: the group baseline"),
])
def test_an_agent_stages_bad_key_is_named(override, message):
    """An agent stage (stages/agent.py) checks its own parts at start, as every stage kind does."""
    cfg = configs.load("swe_agent:tiny")
    stage = cfg.stages.rl_multi
    for key, value in override.items():
        part, k = key.split(".")
        stage[part][k] = value
    with pytest.raises(errors.BadInput, match=message) as err:
        cascade.validate(cfg)
    assert err.value.exit_code == 2


def test_sft_rows_without_room_for_a_response_fail_before_training(tmp_path):
    cfg = tiny_sft_config(tmp_path, steps=2)
    cfg.stages.sft.seq_len = 12  # the math prompts are longer: every response would be cut off
    wd = str(tmp_path / "run")
    with pytest.raises(errors.BadInput, match=r"config\.stages\.sft\.seq_len=12 cuts off every response .*'math'"):
        cascade.run(cfg, wd, "sft_math", "tiny")
    assert not os.path.exists(os.path.join(wd, "metrics.jsonl")) and \
        not os.path.exists(os.path.join(wd, "checkpoints", "sft"))


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "experiments/run.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("args, line", [
    (["--config.stages.sft.stepz=3"], "error: --config.stages.sft.stepz: no such config key; "
                                      "did you mean --config.stages.sft.steps?"),
    (["--config.foo=1"], "error: --config.foo: no such config key"),
    (["--config.stages.sft.steps=abc"], "error: flag --config.stages.sft.steps=abc: invalid literal for int() "
                                        "with base 10: 'abc'"),
    (["--config.stage_order=sft,nosuchstage"], "error: config.stage_order names 'nosuchstage', not in "
                                                "config.stages (['grpo', 'sft'])"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, args, line):
    proc = _cli("--config=cascade_math:tiny", f"--workdir={tmp_path}/run", *args)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [line]
    assert not os.path.exists(tmp_path / "run")  # nothing was started


# ------------------------------------------------------------------------------------------ checkpoints

def _corrupt(step_dir):
    """Garble every file of a saved step's array data (as a disk error or a half copy would)."""
    hit = 0
    for root, _, files in os.walk(os.path.join(step_dir, "state")):
        for f in files:
            with open(os.path.join(root, f), "r+b") as fh:
                fh.truncate(max(0, os.path.getsize(fh.name) // 3))
                fh.seek(0)
                fh.write(b"\xde\xad" * 8)
            hit += 1
    assert hit


def test_unreadable_latest_checkpoint_falls_back_then_names_the_path(tmp_path, capsys):
    ck = checkpoint.StageCheckpointer(str(tmp_path / "ck"))
    for step in (1, 2):
        ck.save(step, {"w": jnp.full((64,), float(step))}, {"iterator": step})
    ck.wait()  # saves are asynchronous: on disk only now
    abstract = {"w": jax.ShapeDtypeStruct((64,), jnp.float32)}
    _corrupt(os.path.join(ck.directory, "2"))
    step, state, data = ck.restore_latest_good(abstract)
    assert step == 1 and data == {"iterator": 1}
    np.testing.assert_array_equal(np.asarray(state["w"]), np.full(64, 1.0))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"checkpoint {ck.directory}/2 is unreadable (")
    _corrupt(os.path.join(ck.directory, "1"))
    with pytest.raises(errors.BadInput, match=rf"no readable checkpoint in {ck.directory} \(steps \[2, 1\]"):
        ck.restore_latest_good(abstract)
    ck.close()


def test_params_save_is_atomic_and_a_missing_file_is_named(tmp_path, monkeypatch):
    path = str(tmp_path / "final" / "sft")
    checkpoint.save_params(path, {"w": jnp.ones(4)})
    abstract = {"w": jax.ShapeDtypeStruct((4,), jnp.float32)}

    def crash(*a, **k):
        raise KeyboardInterrupt  # killed in the middle of writing the new params
    monkeypatch.setattr(checkpoint.ocp.StandardCheckpointer, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_params(path, {"w": jnp.zeros(4)})
    np.testing.assert_array_equal(np.asarray(checkpoint.load_params(path, abstract)["w"]), np.ones(4))
    with pytest.raises(errors.BadInput, match=rf"params checkpoint {tmp_path}/final/nope is missing or unreadable"):
        checkpoint.load_params(str(tmp_path / "final" / "nope"), abstract)


# ------------------------------------------------------------------------------------------ signals

@pytest.fixture
def signal_handlers():
    """interrupts.install() for the test; the previous handlers back afterwards."""
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    interrupts.install()
    yield
    for s, h in old.items():
        signal.signal(s, h)


def test_sigterm_stops_at_a_step_boundary_and_the_resume_is_identical(tmp_path, monkeypatch, signal_handlers):
    cfg = tiny_sft_config(tmp_path, steps=7)
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    cascade.run(cfg, full, "sft_math", "tiny")
    original = common.Trainer.log

    def log_then_signal(self, step, metrics):
        original(self, step, metrics)
        if step == 4:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the step's bookkeeping is still running

    monkeypatch.setattr(common.Trainer, "log", log_then_signal)
    with pytest.raises(errors.Interrupted, match="stopped by SIGTERM after sft step 5/7") as err:
        cascade.run(cfg, cut, "sft_math", "tiny")
    assert err.value.exit_code == 143
    assert [r["step"] for r in _rows(cut)] == [0, 1, 2, 3, 4]  # the last row is there
    ck = checkpoint.StageCheckpointer(os.path.join(cut, "checkpoints", "sft"))
    assert sorted(ck.manager.all_steps()) == [4, 5]  # periodic (every 4) and the one at the stop
    ck.close()
    _corrupt(os.path.join(cut, "checkpoints", "sft", "5"))  # and the newest is damaged: resume from step 4
    monkeypatch.setattr(common.Trainer, "log", original)
    cascade.run(cfg, cut, "sft_math", "tiny")
    _assert_same_tree(final_params(full, "sft"), final_params(cut, "sft"))
    assert [r["step"] for r in _rows(cut)] == list(range(7))


def test_cli_sigint_exits_130_with_one_line(tmp_path):
    wd = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "experiments/run.py", "--config=sft_math:tiny", f"--workdir={wd}",
                             "--config.stages.sft.steps=400", "--config.stages.sft.checkpoint_every=1000",
                             "--config.model.n_layers=1", "--config.data.domains.math.num_train=256"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "NEMOCASCADE_PROGRESS": "0"})
    deadline = time.monotonic() + 240
    while not (wd / "metrics.jsonl").exists() or len(_rows(str(wd))) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("stopped by SIGINT after sft step ")
    assert last.endswith("run the same command again to resume")
    step = int(last.split("after sft step ")[1].split("/")[0])
    assert _rows(str(wd))[-1]["step"] == step - 1  # the row of the step it finished
    assert checkpoint.StageCheckpointer(str(wd / "checkpoints" / "sft")).latest_step() == step
