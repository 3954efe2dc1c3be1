"""Export a run's trained policy to Hugging Face: `python experiments/export.py --workdir=RUN --stage=final --out=DIR`.

--stage is a stage name, `final` (the last finished stage of the main line: the run's policy) or any checkpoint
name a MOPD teacher can have (`stage:grpo`, `stage:init`, `best:rg_math`; nemocascade/named_checkpoints.py).
Its final params are read as a teacher's are (the run's registry resolves the name, `checkpoint.load_params`
reads checkpoints/final/<stage>) into the model the run used, rebuilt from the run's recorded config.json as
`cascade.setup` rebuilds it on a resume (a pretrained run reads its GGUF / HF checkpoint once more for the
architecture and tokenizer, and drops those weights). DIR then holds:

  * config.json + model.safetensors (`models/hf.save`: Llama / Qwen2 / Qwen3 layout, the run's param dtype),
    which `transformers.AutoModelForCausalLM.from_pretrained(DIR)` loads;
  * generation_config.json: the stop token our sampler stops on (`<|im_end|>`) and the pad token;
  * the tokenizer. A HF / GGUF tokenizer (pretrained runs) is written as tokenizer.json + tokenizer_config.json
    (`AutoTokenizer.from_pretrained(DIR)`), with the chat template the run trained with (`chat.jinja_template`:
    our ChatML in the run's thinking mode), not the checkpoint's original one. A run trained from scratch has
    our SentencePiece tokenizer: tokenizer.model is copied, but no transformers tokenizer files are written
    (not converted here); read it with `nemocascade.tokenizer.Tokenizer(DIR/tokenizer.model)`.

Exit status: 0 done; 2 bad input (no such workdir, stage or file), with one line naming it.
"""
import copy
import json
import os
import sys

import ml_collections
from absl import app, flags, logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from nemocascade import cascade, chat, checkpoint, files, named_checkpoints  # noqa: E402
from nemocascade import mesh as mesh_lib  # noqa: E402
from nemocascade.errors import BadInput  # noqa: E402
from nemocascade.hf_tokenizer import HFTokenizer  # noqa: E402
from nemocascade.models import ModelConfig, hf, param_shardings  # noqa: E402
from nemocascade.tokenizer import Tokenizer  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", None, "the run's directory (experiments/run.py --workdir)")
_STAGE = flags.DEFINE_string("stage", "final", "a stage name, 'final' (the last main-line stage), or a checkpoint "
                             "name: stage:NAME, best:DOMAIN")
_OUT = flags.DEFINE_string("out", None, "output directory (created)")


def _read_json(path: str, what: str) -> dict:
    if not files.exists(path):
        raise BadInput(f"{path}: no such file ({what}); is the workdir a finished run of experiments/run.py?")
    return files.read_json(path)


def resolve_stage(workdir: str, name: str) -> str:
    """The finished stage `name` refers to: `final` is the last finished main-line stage in summary.json; any
    other name resolves through the run's checkpoint registry, as a MOPD teacher's does."""
    summary = _read_json(os.path.join(workdir, "summary.json"), "the run's summary")
    if name == "final":
        main = [s["name"] for s in summary.get("stages", []) if not s.get("side_branch")]
        if not main:
            raise BadInput(f"--stage=final: {workdir}/summary.json lists no finished main-line stage yet")
        name = main[-1]
    _read_json(os.path.join(workdir, "checkpoints", "registry.json"), "the run's checkpoint registry")
    ref = name if name.startswith((named_checkpoints.STAGE, named_checkpoints.BEST)) else named_checkpoints.STAGE + name
    try:
        return named_checkpoints.NamedCheckpoints(os.path.join(workdir, "checkpoints")).stage_of(ref)
    except KeyError as err:
        raise BadInput(f"--stage={name}: {err.args[0]} (in {workdir}/checkpoints/registry.json)") from None


def _sentencepiece_path(cfg, workdir: str) -> str:
    return cfg.tokenizer.path or os.path.join(workdir, "tokenizer.model")  # as cascade.setup


def run_model(cfg, workdir: str, mesh):
    """(ModelConfig, tokenizer) of the run, as `cascade.setup` builds them."""
    if cfg.get("pretrained") and cfg.pretrained.kind:
        model_cfg, _, tokenizer = cascade.load_pretrained(cfg.pretrained, mesh)  # the weights are dropped
        return model_cfg, tokenizer
    path = _sentencepiece_path(cfg, workdir)
    if not files.exists(path):
        raise BadInput(f"{path}: the run's tokenizer is missing (config.tokenizer.path)")
    tokenizer = Tokenizer(path)
    return ModelConfig.from_dict({**cfg.model.to_dict(), "vocab_size": tokenizer.vocab_size}), tokenizer


def export(workdir: str, stage: str, out: str) -> dict:
    """Write `stage`'s policy of the run in `workdir` to `out` (module docstring); returns what was written."""
    cfg = ml_collections.ConfigDict(_read_json(os.path.join(workdir, "config.json"), "the run's config"))
    if not files.is_local(out):
        raise BadInput(f"--out={out}: export writes a local directory (transformers loads from one); copy it after")
    name = resolve_stage(workdir, stage)
    path = os.path.join(workdir, "checkpoints", "final", name)  # where the run wrote it (cascade._final_path)
    mesh = mesh_lib.make_mesh()  # this machine's devices, whatever mesh the run trained on
    model_cfg, tokenizer = run_model(cfg, workdir, mesh)
    # a LoRA stage's final checkpoint holds merged params (stages/common.py Trainer.finish), like any other
    params = checkpoint.load_params(path, cascade.abstract_params(model_cfg, param_shardings(model_cfg, mesh)))
    hf.save(model_cfg, params, out)
    written = ["config.json", "model.safetensors", "generation_config.json"]
    special = {"eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.pad_id}
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(special, f, indent=2)
    if isinstance(tokenizer, HFTokenizer):
        tokenizer = copy.copy(tokenizer)
        tokenizer.chat_template = chat.jinja_template(cfg.thinking)
        tokenizer.save(out)
        written += ["tokenizer.json", "tokenizer_config.json"]
    else:
        files.atomic_write(os.path.join(out, "tokenizer.model"), files.read_bytes(_sentencepiece_path(cfg, workdir)))
        written.append("tokenizer.model")
    return {"stage": name, "params": path, "out": out, "files": written}


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax's INFO lines
    try:
        done = export(_WORKDIR.value, _STAGE.value, _OUT.value)
    except BadInput as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    print(f"exported stage {done['stage']!r} ({done['params']}) to {done['out']}: {', '.join(done['files'])}")


if __name__ == "__main__":
    flags.mark_flags_as_required(["workdir", "out"])
    app.run(main)
