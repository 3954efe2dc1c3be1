"""How much of the library one RL step reads: the distinct lines of nemocascade/ executed during one step.

    python benchmarks/step_lines.py [--config=cascade_math:tiny] [--stage=grpo] [--step=1]

Runs the config up to `--stage` (the stages before it as configured), traces (sys.settrace) from the
moment the stage's loop yields step `--step` until it yields the next, and prints the distinct executed lines of
nemocascade/ per file. Step 0 would count the one-off compiles (tracing the sampler and the step); step 1 is a
steady step: host loop, sampling call, reward scoring (the verifier pool runs in this process with
`reward.num_workers=0`), gather, frozen roles, the jitted update's call, metrics, checkpoint. The jitted functions'
bodies run at trace time, so pass `--step=0` to count them as well. Machine-independent: a count of lines, not a
time.
"""
import argparse
import collections
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nemocascade import cascade, configs  # noqa: E402
from nemocascade.stages import common  # noqa: E402

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "nemocascade") + os.sep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="cascade_math:tiny")
    ap.add_argument("--stage", default="grpo")
    ap.add_argument("--step", type=int, default=1)
    a = ap.parse_args()
    name, _, variant = a.config.partition(":")
    cfg = configs.load(a.config)
    order = list(configs.stage_order(cfg))
    cfg.stage_order = tuple(order[:order.index(a.stage) + 1])  # the stages before it give it a start that scores
    cfg.stages[a.stage].steps = a.step + 2
    cfg.stages[a.stage].checkpoint_every = 1  # a checkpoint every step: the loop's whole body is counted
    cfg.reward.num_workers = 0  # verifiers in this process, so their lines count too
    cfg.eval.update(n=4, val_n=4, avg_k=0)
    seen = collections.defaultdict(set)

    def tracer(frame, event, arg):
        path = frame.f_code.co_filename
        if not path.startswith(PKG):
            return None
        if event == "line":
            seen[path[len(PKG):]].add(frame.f_lineno)
        return tracer

    steps = common.Trainer.steps

    def trace(on: bool, *running):  # new frames through settrace; frames already running (the loops) by hand
        sys.settrace(tracer if on else None)
        f, frames = sys._getframe(2), list(running)
        while f is not None:
            frames.append(f)
            f = f.f_back
        for f in frames:
            if f is not None and f.f_code.co_filename.startswith(PKG):
                f.f_trace = tracer if on else None

    def traced_steps(self):
        inner = steps(self)
        for step in inner:
            trace(self.name == a.stage and step == a.step, inner.gi_frame)
            yield step
        trace(False)

    common.Trainer.steps = traced_steps
    with tempfile.TemporaryDirectory() as wd:
        cascade.run(cfg, wd, name, variant or None)
    total = sum(len(v) for v in seen.values())
    print(f"{a.config} stage {a.stage!r} step {a.step}: {total} distinct lines of nemocascade/ in {len(seen)} files")
    for path, lines in sorted(seen.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(lines):5d}  {path}")


if __name__ == "__main__":
    main()
