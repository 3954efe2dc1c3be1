"""What a run leaves behind: metrics.jsonl, TensorBoard, summary.json, progress lines (config.json: workdir.py).

The file layout follows the shared run-output contract (docs/run_output.md); other tools read it, so the key names
below are not ours to change:

- ``summary.json``: ``{"config", "variant", "seed", "stages": [...], "total_wall_s"}``, each stage
  ``{"name", "kind", "domains", "steps", "wall_s", "teachers", "eval", **extra}`` and
  ``eval = {domain: {"pass@1": float, "n": int, ...}}``. Rewritten atomically (temp file in the same
  directory + ``os.replace``) after every stage, so a killed run still leaves a valid file.
- ``metrics.jsonl``: one ``{"stage", "step", "global_step", "time", **metrics}`` object per line.
- ``tb/``: TensorBoard scalars tagged ``f"{stage}/{key}"`` at ``global_step``.

Storage. Every file goes through ``files`` (etils.epath), so the workdir may be ``gs://...``. An object can
not be appended to: there metrics.jsonl is uploaded whole after each step, and TensorBoard writes its event files
to a local mirror (``files.local_mirror``) copied to ``tb/`` at most every ``TB_UPLOAD_S`` seconds and at
each stage's end.

Global step. Each stage numbers its own steps; TensorBoard and the plots want one x axis for the
whole cascade. The first step a stage logs maps to one past the last global step logged so far, and later
steps keep the stage's own spacing: ``global_step = offset[stage] + step``. Offsets are rebuilt from
metrics.jsonl on resume, so a resumed stage continues on the same axis.

Resume. ``RunLog`` on a workdir that already has ``summary.json`` loads it: finished stages stay and
``stage_done(name)`` tells the trainer to skip them. A stage cut short is restarted from its last
checkpoint at step ``k``; call ``truncate_after(stage, k)`` first so its steps ``> k`` are not
logged twice (``k = -1`` drops the whole stage when there is no checkpoint).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
import time
from typing import Any, Iterable

import tqdm

from nemocascade import files, hosts, tb_events
from nemocascade.errors import BadInput
from nemocascade.files import atomic_write

SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"
TB_UPLOAD_S = 60.0  # a remote workdir's TensorBoard files are copied up at most this often (and at stage ends)

# Keys each metrics.jsonl line owns; a metric of the same name would silently overwrite them.
_RESERVED_METRIC_KEYS = ("stage", "step", "global_step", "time")

# event files are named by the second: a second writer in the same second (a quick resume, truncate_after) needs a
# unique suffix (tb_events opens them "xb", so a clash would be an error, not a lost file).
_TB_WRITER_IDS = itertools.count()


def _to_float(key: str, value: Any) -> float:
    """float() of a Python/numpy/jax scalar (or size-1 array), with an error that names the key."""
    try:
        return float(value)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"metric {key!r}: cannot convert {type(value).__name__} {value!r:.80} to a float scalar ({e})"
        ) from None


def load_metrics(path: str) -> list[dict]:
    """Rows of a metrics.jsonl, each with ``global_step`` (computed as in the module docstring if
    absent).

    A last line without its newline is a write cut short by a crash and is skipped; any other line
    that is not a JSON object with ``stage`` and ``step`` is a ValueError naming the line number.
    """
    return parse_metrics(files.read_text(path), path)


def parse_metrics(text: str, path: str = METRICS_FILE) -> list[dict]:
    """`load_metrics` of the text of a metrics.jsonl (`path` names it in errors)."""
    lines = text.split("\n")
    if lines and not text.endswith("\n"):
        lines = lines[:-1]  # partial final write (or an empty file's single "")
    rows, offsets, next_global = [], {}, 0
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({e}): {line[:120]!r}") from None
        if not isinstance(row, dict) or "stage" not in row or "step" not in row:
            raise ValueError(f"{path}:{lineno}: expected an object with 'stage' and 'step': {line[:120]!r}")
        stage, step = row["stage"], row["step"]
        if stage not in offsets:
            offsets[stage] = row.get("global_step", next_global + step) - step
        row.setdefault("global_step", offsets[stage] + step)
        next_global = max(next_global, row["global_step"] + 1)
        rows.append(row)
    return rows


class RunLog:
    """The run's outputs in ``workdir``; see the module docstring for files and resume semantics.

    ``summary`` is the live dict that ``summary.json`` mirrors after each ``end_stage``/``finish``.
    Before ``finish``, ``total_wall_s`` is the sum of the stages' ``wall_s`` (a partial run's best
    estimate); ``finish`` sets the measured total. ``wall_s_before`` is the total that earlier processes on
    this workdir recorded (0 for a new one): a resumed run's total is it plus the resuming process's time.
    """

    def __init__(self, workdir: str, config_name: str, variant: str | None, seed: int, writes: bool | None = None,
                 variant_change: bool = False):
        """`writes`: whether this process writes the files (default: process 0 only; the others keep the same
        summary and step bookkeeping in memory). `variant_change`: the resumed config's `variant` key differs from
        the recorded one and the caller allowed it (the rest of the config was compared key by key, e.g. a variant
        that only adds stages at the end): the summary takes the new variant and lists the old in
        `"variants_before"`."""
        self.workdir = workdir
        self.writes = hosts.is_lead() if writes is None else writes
        self._remote = not files.is_local(workdir)
        files.makedirs(workdir)
        self._summary_path = os.path.join(workdir, SUMMARY_FILE)
        self._metrics_path = os.path.join(workdir, METRICS_FILE)
        self._metrics_file = None
        self._metrics_text: list[str] | None = None  # a remote metrics.jsonl's lines, uploaded whole
        self._tb = None
        self._tb_dir = files.local_mirror(os.path.join(workdir, TB_DIR)) if self._remote else os.path.join(workdir,
                                                                                                            TB_DIR)
        self._tb_uploaded = 0.0
        self._tb_purge_step = None

        if files.exists(self._summary_path):
            self.summary = files.read_json(self._summary_path)
            # Skipping "finished" stages of a different run would silently mix two experiments.
            if variant_change and self.summary.get("variant") != variant:
                self.summary.setdefault("variants_before", []).append(self.summary.get("variant"))
                self.summary["variant"] = variant
            for key, want in (("config", config_name), ("variant", variant), ("seed", seed)):
                if self.summary.get(key) != want:
                    raise BadInput(
                        f"{self._summary_path} belongs to a run with {key}="
                        f"{self.summary.get(key)!r}, not {want!r}; use another workdir"
                    )
        else:
            self.summary = {"config": config_name, "variant": variant, "seed": seed, "stages": [], "total_wall_s": 0.0}
        self.wall_s_before = float(self.summary.get("total_wall_s") or 0.0)
        self._reindex_metrics()

    # ---- metrics.jsonl + TensorBoard ------------------------------------------------------------

    def _reindex_metrics(self) -> None:
        """Rebuild stage offsets and last steps from metrics.jsonl; drop a crash-truncated last line."""
        self._offsets: dict[str, int] = {}
        self._last_step: dict[str, int] = {}
        self._stage_order: list[str] = []
        self._next_global = 0
        if not files.exists(self._metrics_path):
            return
        text = files.read_text(self._metrics_path)
        rows = parse_metrics(text, self._metrics_path)
        if text and not text.endswith("\n"):  # drop a crash's half line: the next append starts a line of its own
            self._rewrite_metrics(rows)
        for row in rows:
            stage, step = row["stage"], row["step"]
            if stage not in self._offsets:
                self._offsets[stage] = row["global_step"] - step
                self._stage_order.append(stage)
            self._last_step[stage] = step
            self._next_global = max(self._next_global, row["global_step"] + 1)

    def _rewrite_metrics(self, rows: list[dict]) -> None:
        if not self.writes:
            return
        self._close_metrics_file()
        atomic_write(self._metrics_path, "".join(json.dumps(r) + "\n" for r in rows))

    def _close_metrics_file(self) -> None:
        if self._metrics_file is not None:
            self._metrics_file.close()
            self._metrics_file = None
        self._metrics_text = None

    def _append_metrics(self, line: str) -> None:
        if not self._remote:
            if self._metrics_file is None:
                self._metrics_file = files.path(self._metrics_path).open("a")
            self._metrics_file.write(line)
            self._metrics_file.flush()
            return
        if self._metrics_text is None:
            self._metrics_text = [files.read_text(self._metrics_path)] if files.exists(self._metrics_path) else []
        self._metrics_text.append(line)
        atomic_write(self._metrics_path, "".join(self._metrics_text))

    def _upload_tb(self, force: bool = False) -> None:
        """Copy a remote workdir's TensorBoard files up (every TB_UPLOAD_S seconds, or now with `force`)."""
        if self._remote and self.writes and (force or time.time() - self._tb_uploaded >= TB_UPLOAD_S):
            if self._tb is not None:
                self._tb.flush()
            files.sync_tree(self._tb_dir, os.path.join(self.workdir, TB_DIR))
            self._tb_uploaded = time.time()

    def log_step(self, stage: str, step: int, metrics: dict[str, Any]) -> None:
        """Append one line to metrics.jsonl (flushed) and one TensorBoard scalar per metric.

        Steps of a stage must not go backwards (equal is allowed, e.g. eval metrics logged at the last
        train step), and a stage cannot resume logging once a later stage has started: both would break
        the monotonic global step. After a restart, call ``truncate_after`` first.
        """
        step = int(step)
        values = {}
        for key, value in metrics.items():
            if key in _RESERVED_METRIC_KEYS:
                raise ValueError(f"metric key {key!r} is reserved in {METRICS_FILE}; rename it")
            values[key] = _to_float(key, value)
        if stage in self._offsets:
            if self._stage_order[-1] != stage:
                raise ValueError(
                    f"stage {stage!r} was already followed by {self._stage_order[-1]!r} in "
                    f"{self._metrics_path}; stages log one after another"
                )
            if step < self._last_step[stage]:
                raise ValueError(
                    f"stage {stage!r} step {step} < last logged step "
                    f"{self._last_step[stage]}; call truncate_after({stage!r}, {step - 1}) "
                    "when resuming"
                )
        else:
            self._offsets[stage] = self._next_global - step
            self._stage_order.append(stage)
        self._last_step[stage] = step
        global_step = self._offsets[stage] + step
        self._next_global = max(self._next_global, global_step + 1)
        if not self.writes:
            return
        row = {"stage": stage, "step": step, "global_step": global_step, "time": time.time(), **values}
        self._append_metrics(json.dumps(row) + "\n")

        if self._tb is None:
            # purge_step makes TensorBoard hide events >= it from earlier (pre-crash) event files.
            self._tb = tb_events.EventWriter(self._tb_dir, filename_suffix=f".{os.getpid()}.{next(_TB_WRITER_IDS)}",
                                             purge_step=self._tb_purge_step, flush_secs=10)
            self._tb_purge_step = None
        for key, value in values.items():
            self._tb.add_scalar(f"{stage}/{key}", value, global_step)
        self._upload_tb()

    def truncate_after(self, stage: str, step: int) -> None:
        """Drop metrics.jsonl lines of ``stage`` with ``step > step`` (atomic rewrite).

        Other stages' lines are kept. TensorBoard's next event file purges global steps past the cut.
        """
        purge = self._offsets[stage] + step + 1 if stage in self._offsets else None
        self._drop_rows(lambda r: r["stage"] == stage and r["step"] > step, purge)

    def _drop_rows(self, gone, purge_step: int | None) -> None:
        """Rewrite metrics.jsonl without the rows `gone(row)` picks, once; TensorBoard's next event file hides global
        steps from `purge_step` on (None: nothing logged to hide)."""
        if not files.exists(self._metrics_path):
            return
        self._rewrite_metrics([r for r in load_metrics(self._metrics_path) if not gone(r)])
        if purge_step is not None:
            if self._tb is not None:
                self._tb.close()
                self._tb = None
            self._tb_purge_step = purge_step
        self._reindex_metrics()

    def logged_stages(self) -> list[str]:
        """The stages metrics.jsonl has rows of, in the order they started."""
        return list(self._stage_order)

    def drop_stages(self, names) -> None:
        """Forget stages `names` entirely (a redo): their metrics.jsonl lines (TensorBoard's next event file hides
        their steps) and then their summary entries. The next stage logs right after what is kept."""
        names = set(names)
        logged = [self._offsets[n] for n in names if n in self._offsets]
        self._drop_rows(lambda r: r["stage"] in names, min(logged) if logged else None)
        self.summary["stages"] = [s for s in self.summary["stages"] if s["name"] not in names]
        self.summary["total_wall_s"] = self.wall_s_before  # the discarded stages' time was spent all the same
        self._write_summary()

    # ---- summary.json -----------------------------------------------------------------------------

    def _write_summary(self) -> None:
        if self.writes:
            atomic_write(self._summary_path, json.dumps(self.summary, indent=2) + "\n")

    def stage_done(self, name: str) -> bool:
        """True iff ``summary.json`` already holds stage ``name`` (a resumed run skips it)."""
        return any(s["name"] == name for s in self.summary["stages"])

    def end_stage(
        self,
        name: str,
        kind: str,
        domains: Iterable[str],
        steps: int,
        wall_s: float,
        eval: dict[str, dict],
        teachers: dict[str, str] | None = None,
        **extra,
    ) -> dict:
        """Add (or replace, by name, in place) a stage entry and rewrite summary.json atomically.

        ``eval`` maps every domain of the run to at least ``{"pass@1": float, "n": int}``; a missing key
        is a ValueError naming the domain. Returns the stage entry.
        """
        checked_eval = {}
        for domain, result in eval.items():
            if not isinstance(result, dict):
                raise ValueError(
                    f"stage {name!r}: eval[{domain!r}] must be a dict with 'pass@1' and 'n', "
                    f"got {type(result).__name__}"
                )
            missing = [k for k in ("pass@1", "n") if k not in result]
            if missing:
                raise ValueError(
                    f"stage {name!r}: eval[{domain!r}] lacks {missing}; every domain needs "
                    "'pass@1' and 'n' (docs/run_output.md)"
                )
            try:
                pass1, n = float(result["pass@1"]), int(result["n"])
            except (TypeError, ValueError) as e:
                raise ValueError(f"stage {name!r}: eval[{domain!r}] pass@1/n are not numbers ({e})") from None
            if not math.isfinite(pass1):
                raise ValueError(f"stage {name!r}: eval[{domain!r}]['pass@1'] = {pass1} is not finite")
            checked_eval[domain] = {**result, "pass@1": pass1, "n": n}
        if isinstance(domains, str):
            raise ValueError(f"stage {name!r}: domains must be a list of names, got the string {domains!r}")
        entry = {
            "name": name,
            "kind": kind,
            "domains": list(domains),
            "steps": int(steps),
            "wall_s": float(wall_s),
            "teachers": None if teachers is None else dict(teachers),
            "eval": checked_eval,
            **extra,
        }
        stages = self.summary["stages"]
        for i, s in enumerate(stages):
            if s["name"] == name:
                stages[i] = entry
                break
        else:
            stages.append(entry)
        self.summary["total_wall_s"] = sum(s["wall_s"] for s in stages)
        self._write_summary()
        self._upload_tb(force=True)
        return entry

    def record_config_changes(self, changes: list[tuple[str, object, object]]) -> None:
        """Config keys a resume was allowed to change (`workdir.check_config`), as `summary["config_changes"]`:
        one entry per start that changed something, so the summary says which stages ran under which values."""
        if changes:
            entry = {"time": time.strftime("%Y-%m-%d %H:%M:%S"),
                     "after_stages": [s["name"] for s in self.summary["stages"]],
                     "changes": [{"key": k, "old": o, "new": n} for k, o, n in changes]}
            self.summary.setdefault("config_changes", []).append(entry)
            self._write_summary()

    def set_init(self, eval: dict[str, dict], wall_s: float, val: dict[str, dict] | None = None) -> None:
        """The starting model's held-out scores (before any stage; test `eval`, validation `val`), as
        ``summary["init"]``."""
        self.summary["init"] = {"eval": eval, "wall_s": float(wall_s)} | ({"val": val} if val is not None else {})
        self._write_summary()

    def finish(self, total_wall_s: float) -> None:
        self.summary["total_wall_s"] = float(total_wall_s)
        self._write_summary()

    def close(self) -> None:
        self._close_metrics_file()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        self._upload_tb(force=True)

    def __enter__(self) -> "RunLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- progress ------------------------------------------------------------------------------------


class _LineProgress:
    """tqdm's everyday surface (iterate, update, set_postfix, close) printing plain lines to stderr.

    Used when stderr is not a terminal, where tqdm's carriage returns turn CI logs into one huge line.
    Prints when the completed fraction crosses each 10% mark, or every 30 s when the total is unknown.
    """

    def __init__(self, iterable, desc: str, total: int | None, unit: str = "it"):
        self.iterable, self.desc, self.total, self.unit = iterable, desc, total, unit
        self.n = 0
        self._postfix = ""
        self._start = self._last_print_time = time.time()
        self._last_decile = 0
        self._last_printed_n = 0

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update(1)
        self.close()

    def __len__(self):
        return self.total

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
        items = {**(ordered_dict or {}), **kwargs}
        self._postfix = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in items.items())

    def set_description(self, desc=None, refresh=True):
        self.desc = desc or ""

    def _print(self) -> None:
        elapsed = time.time() - self._start
        done = f"{self.n}/{self.total} ({100 * self.n // self.total}%)" if self.total else f"{self.n}"
        rate = f", {self.n / elapsed:.3g} {self.unit}/s" if elapsed > 0 else ""
        if self.total and 0 < self.n < self.total and elapsed > 0:  # at the mean rate so far, as tqdm's
            rate += f", ETA {duration(elapsed * (self.total - self.n) / self.n)}"
        post = f" {self._postfix}" if self._postfix else ""
        print(f"{self.desc}: {done} {self.unit} {elapsed:.1f}s{rate}{post}", file=sys.stderr, flush=True)
        self._last_printed_n, self._last_print_time = self.n, time.time()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.total:
            decile = min(10, 10 * self.n // self.total)
            if decile > self._last_decile:
                self._last_decile = decile
                self._print()
        elif time.time() - self._last_print_time >= 30.0:
            self._print()

    def close(self) -> None:
        if self.n != self._last_printed_n:
            self._print()


def duration(seconds: float) -> str:
    """A time left as a log line shows it: "45s", "12m05s", "3h07m"."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress(iterable_or_total: Iterable | int, desc: str, **kw):
    """A progress bar over an iterable, or one to ``update()`` by hand when given an int total.

    tqdm with ``dynamic_ncols=True, mininterval=1.0`` when stderr is a terminal or
    ``NEMOCASCADE_PROGRESS=1``; otherwise (``NEMOCASCADE_PROGRESS=0`` or a non-TTY stderr, as in CI)
    a line per 10% on stderr with the rate and the time left. ``disable=True`` silences both. Other ``kw`` go to tqdm.
    """
    if isinstance(iterable_or_total, int):
        iterable, total = None, iterable_or_total
    else:
        iterable = iterable_or_total
        total = kw.pop("total", None)
        if total is None and hasattr(iterable, "__len__"):
            total = len(iterable)
    if kw.get("disable"):
        return tqdm.tqdm(iterable, desc=desc, total=total, **kw)
    env = os.environ.get("NEMOCASCADE_PROGRESS")
    bar = env == "1" or (env != "0" and sys.stderr.isatty())
    if not bar:
        return _LineProgress(iterable, desc, total, unit=kw.get("unit", "it"))
    kw = {"dynamic_ncols": True, "mininterval": 1.0, **kw}
    return tqdm.tqdm(iterable, desc=desc, total=total, **kw)
