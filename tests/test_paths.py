"""A run whose workdir, checkpoints and data live on `gs://`, offline.

Every path goes through etils.epath exactly as it would against Google Cloud Storage (epath's fsspec backend for
`gs://`, no local-path shortcuts). The stand-ins, both under one temporary directory so they see the same bytes:
the fsspec filesystem registered for the `gs` protocol (fsspec's DirFileSystem over that directory, instead of
gcsfs and the network), and the kvstore orbax hands TensorStore for a `gs://` checkpoint (TensorStore's `file`
driver instead of its own GCS driver); orbax's query of the bucket's namespace type answers "flat". A stray
`open("gs://...")` or `os.makedirs("gs://...")` in our code would create `gs:` under the working directory: each
test checks there is none.
"""
import importlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from etils.epath import backend as epath_backend
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from orbax.checkpoint._src.path import gcs_utils

from conftest import tiny_math_config
from nemocascade import cascade, checkpoint, files
from nemocascade.run_log import RunLog, load_metrics

BUCKET = "gs://nc-test"


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    """The directory that holds what is written to gs://... (as <root>/<bucket>/<object path>)."""
    root = tmp_path / "gcs"
    root.mkdir()

    class FakeGCS(DirFileSystem):
        protocol = ("gs", "gcs")

        def __init__(self, *args, **options):  # gcsfs options (finalize_on_close) mean nothing here
            super().__init__(path=str(root), fs=LocalFileSystem())

    for name in ("gs", "gcs"):
        monkeypatch.setitem(importlib.import_module("fsspec.registry")._registry, name, FakeGCS)
    monkeypatch.setattr(gcs_utils, "is_hierarchical_namespace_enabled", lambda path: False)  # a bucket metadata RPC
    monkeypatch.setattr(gcs_utils, "get_kvstore_for_gcs",
                        lambda path: {"driver": "file", "path": str(root / path.removeprefix("gs://"))})
    monkeypatch.setenv("NEMOCASCADE_CACHE", str(tmp_path / "cache"))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    epath_backend.fsspec_backend._get_filesystem.cache_clear()
    yield root
    epath_backend.fsspec_backend._get_filesystem.cache_clear()
    assert not any(cwd.iterdir()), f"local writes of remote paths: {list(cwd.iterdir())}"


def test_file_operations_on_the_bucket(bucket):
    base = f"{BUCKET}/a"
    files.atomic_write(f"{base}/x/t.json", json.dumps({"k": 1}))
    files.atomic_write(f"{base}/x/b.bin", b"\x00\x01")
    assert (bucket / "nc-test/a/x/t.json").read_text() == '{"k": 1}'
    assert files.read_json(f"{base}/x/t.json") == {"k": 1} and files.read_bytes(f"{base}/x/b.bin") == b"\x00\x01"
    assert files.exists(f"{base}/x") and files.isdir(f"{base}/x") and not files.exists(f"{base}/nope")
    assert files.listdir(f"{base}/x") == ["b.bin", "t.json"] and files.listdir(f"{base}/nope") == []
    files.rename(f"{base}/x", f"{base}/y")
    assert files.listdir(base) == ["y"]
    files.remove(f"{base}/y/b.bin")
    files.remove(f"{base}/y/b.bin")  # missing: nothing to do
    assert files.listdir(f"{base}/y") == ["t.json"]
    files.rmtree(f"{base}/y")
    files.rmtree(f"{base}/y")
    assert not files.exists(f"{base}/y")


def test_sync_tree_up_and_down_marker_last(bucket, tmp_path, monkeypatch):
    local = tmp_path / "tree"
    (local / "d").mkdir(parents=True)
    (local / "d" / "shard").write_bytes(b"123")
    (local / "done.json").write_text("{}")
    (local / "z").write_text("z")
    order, cls = [], type(files.path(BUCKET))
    write = cls.write_bytes
    monkeypatch.setattr(cls, "write_bytes", lambda self, data: (order.append(self.name), write(self, data))[1])
    assert files.sync_tree(local, f"{BUCKET}/tree", last="done.json") == 3
    assert order[-1] == "done.json" and sorted(order) == ["done.json", "shard", "z"]
    assert files.sync_tree(local, f"{BUCKET}/tree", last="done.json") == 0  # nothing changed
    (local / "z").write_text("zz")  # grew
    assert files.sync_tree(local, f"{BUCKET}/tree") == 1
    down = tmp_path / "down"
    assert files.sync_tree(f"{BUCKET}/tree", down) == 3 and (down / "d" / "shard").read_bytes() == b"123"
    assert files.sync_tree(f"{BUCKET}/missing", down) == 0
    mirrors = {files.local_mirror(f"{BUCKET}/tree"), files.local_mirror("gs://nc-test-tree"),
               files.local_mirror("s3://nc-test/tree")}
    assert len(mirrors) == 3 and all(m.startswith(str(tmp_path / "cache")) for m in mirrors)


def _log_a_run(workdir):
    """The same writes to a RunLog: two stages, a restart cut back to step 1, a resume in a new RunLog."""
    with RunLog(workdir, "c", None, 0) as log:
        for step in range(3):
            log.log_step("sft", step, {"loss": 1.0 / (step + 1)})
        log.end_stage("sft", "sft", ["math"], 3, 1.5, {"math": {"pass@1": 0.5, "n": 4}})
        log.log_step("grpo", 0, {"reward": 0.1})
        log.log_step("grpo", 1, {"reward": 0.2})
        log.log_step("grpo", 2, {"reward": 0.3})
    with RunLog(workdir, "c", None, 0) as log:  # resumed from a checkpoint at grpo step 1
        assert log.stage_done("sft") and not log.stage_done("grpo")
        log.truncate_after("grpo", 1)
        log.log_step("grpo", 2, {"reward": 0.35})
        log.end_stage("grpo", "grpo", ["math"], 3, 2.0, {"math": {"pass@1": 0.75, "n": 4}})
        log.finish(3.5)
        return log.summary


def test_run_log_on_the_bucket_writes_what_it_writes_locally(bucket, tmp_path):
    local, remote = str(tmp_path / "local_run"), f"{BUCKET}/run"
    assert _log_a_run(local) == _log_a_run(remote)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time"} for r in rows]  # noqa: E731
    rows = strip(load_metrics(f"{remote}/metrics.jsonl"))
    assert rows == strip(load_metrics(os.path.join(local, "metrics.jsonl")))
    assert [(r["stage"], r["step"], r["global_step"]) for r in rows] == [
        ("sft", 0, 0), ("sft", 1, 1), ("sft", 2, 2), ("grpo", 0, 3), ("grpo", 1, 4), ("grpo", 2, 5)]
    assert rows[-1]["reward"] == 0.35
    assert json.loads((bucket / "nc-test/run/summary.json").read_text())["total_wall_s"] == 3.5
    # TensorBoard: written to the local mirror, copied up at each stage's end: one event file per RunLog
    events = files.listdir(f"{remote}/tb")
    assert len(events) == 2 and all(e.startswith("events.out.tfevents") for e in events)
    assert len(os.listdir(os.path.join(local, "tb"))) == 2


def test_checkpoints_on_the_bucket(bucket):
    state = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3, jnp.bfloat16)}
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    ck = checkpoint.StageCheckpointer(f"{BUCKET}/run/checkpoints/sft")
    for step in (0, 1, 2):
        ck.save(step, jax.tree.map(lambda x: x + step, state), {"epoch": step})
    assert ck.latest_step() == 2
    restored, data = ck.restore(abstract, 1)
    np.testing.assert_array_equal(restored["w"], np.arange(6.0).reshape(2, 3) + 1)
    assert data == {"epoch": 1}
    ck.drop_after(1)
    assert ck.latest_step() == 1
    ck.close()
    assert [n for n in os.listdir(bucket / "nc-test/run/checkpoints/sft") if n.isdigit()] == ["1"]  # 0: max_to_keep
    path = f"{BUCKET}/run/checkpoints/final/sft"
    checkpoint.save_params(path, state)
    checkpoint.save_params(path, jax.tree.map(lambda x: x * 2, state))  # replaces the first, via .old
    assert files.listdir(f"{BUCKET}/run/checkpoints/final") == ["sft"]
    np.testing.assert_array_equal(checkpoint.load_params(path, abstract)["w"], 2 * np.arange(6.0).reshape(2, 3))


def _tiny(tmp_path):
    cfg = tiny_math_config("cascade_math:tiny", tmp_path)
    cfg.data.data_dir = ""  # the workdir's (remote: built in a local mirror, copied up)
    cfg.tokenizer.path = ""
    cfg.eval.update(n=8, val_n=8)
    cfg.stages.sft.update(steps=4, batch_size=4, seq_len=96, checkpoint_every=2, eval_every=0)
    cfg.stages.grpo.update(steps=1, eval_every=0, rollout=dict(prompts_per_step=2, group_size=2,
                                                               length_curriculum=((0, 24),)))
    cfg.stage_order = ("sft", "grpo")
    return cfg


def test_a_cascade_on_the_bucket_equals_the_local_one(bucket, tmp_path):
    """cascade_math:tiny with workdir gs://...: every output lands in the bucket, the scores equal those of the
    same run on a local workdir, and a second start resumes from the bucket (nothing is trained again)."""
    remote = f"{BUCKET}/run"
    summary = cascade.run(_tiny(tmp_path), remote, "cascade_math")
    local = cascade.run(_tiny(tmp_path), str(tmp_path / "local_run"), "cascade_math")
    for a, b in zip(summary["stages"], local["stages"]):
        assert a["name"] == b["name"] and a["eval"]["math"]["pass@1"] == b["eval"]["math"]["pass@1"]
    run = bucket / "nc-test/run"
    for name in ("summary.json", "config.json", "metrics.jsonl", "eval_table.md", "tokenizer.model",
                 "plots/eval_by_stage.png", "checkpoints/registry.json", "checkpoints/manifest.json",
                 "eval_scores/sft.json", "eval_scores/grpo.json"):
        assert (run / name).is_file(), name
    assert {"sft", "grpo"} <= set(os.listdir(run / "checkpoints" / "final"))
    assert os.listdir(run / "checkpoints" / "sft")  # the stage's step checkpoints
    assert list(run.glob("data/domain_records/*/*/dataset_info.json"))  # the dataset, copied up
    assert list(run.glob("tb/events.out.tfevents*"))
    rows = load_metrics(f"{remote}/metrics.jsonl")
    assert [r["step"] for r in rows if r["stage"] == "sft"] == [0, 1, 2, 3]
    again = cascade.run(_tiny(tmp_path), remote, "cascade_math")  # resumed: both stages already done
    assert again["stages"] == summary["stages"]
    assert load_metrics(f"{remote}/metrics.jsonl") == rows
