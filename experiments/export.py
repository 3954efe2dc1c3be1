"""Export a run's trained policy to Hugging Face: `python experiments/export.py --workdir=RUN --stage=final --out=DIR`.

--stage is a stage name, `final` (the last finished stage of the main line: the run's policy) or any checkpoint
name a MOPD teacher can have (`stage:grpo`, `stage:init`, `best:rg_math`; nemocascade/named_checkpoints.py).
Its final params are read as a teacher's are (`nemocascade.trained.load`: the run's registry resolves the name,
checkpoints/final/<stage> is read into the model the run used, rebuilt from the run's recorded config.json as
`cascade.setup` rebuilds it on a resume). DIR then holds:

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

from absl import app, flags, logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from nemocascade import chat, files, trained  # noqa: E402
from nemocascade.errors import BadInput  # noqa: E402
from nemocascade.hf_tokenizer import HFTokenizer  # noqa: E402
from nemocascade.models import hf  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", None, "the run's directory (experiments/run.py --workdir)")
_STAGE = flags.DEFINE_string("stage", "final", "a stage name, 'final' (the last main-line stage), or a checkpoint "
                             "name: stage:NAME, best:DOMAIN")
_OUT = flags.DEFINE_string("out", None, "output directory (created)")


def export(workdir: str, stage: str, out: str) -> dict:
    """Write `stage`'s policy of the run in `workdir` to `out` (module docstring); returns what was written."""
    if not files.is_local(out):
        raise BadInput(f"--out={out}: export writes a local directory (transformers loads from one); copy it after")
    # this machine's devices, whatever mesh the run trained on; a LoRA stage's final checkpoint holds merged params
    policy = trained.load(workdir, stage)
    cfg, tokenizer, name, path = policy.cfg, policy.tokenizer, policy.stage, policy.path
    hf.save(policy.model_cfg, policy.params, out)
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
        files.atomic_write(os.path.join(out, "tokenizer.model"),
                           files.read_bytes(trained.sentencepiece_path(cfg, workdir)))
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
