"""A finished run's policy, for notebooks, reports and export: `load(workdir, stage)` rebuilds the model the run
used from its recorded config.json (as `cascade.setup` does on a resume; a pretrained run reads its GGUF / HF
checkpoint once more for the architecture and tokenizer and drops those weights) and reads the stage's final
params; `Policy.generate` samples from it in the chat format the run trained with.

    policy = trained.load("runs/cascade_math")           # the last main-line stage: the run's policy
    policy.generate(["What is 23+48?"])                  # thinking mode, greedy
    policy.generate(["What is 23+48?"], thinking=False)  # the empty think block: straight to the answer

`stage` is a stage name, "final", or a checkpoint name a MOPD teacher can have (`stage:grpo`, `stage:init`,
`best:math`; nemocascade/named_checkpoints.py). Bad input is an `errors.BadInput` naming the file or stage.
"""
from __future__ import annotations

import dataclasses
import os

import jax
import ml_collections

from nemocascade import cascade, checkpoint, evaluation, files, named_checkpoints
from nemocascade import mesh as mesh_lib
from nemocascade.errors import BadInput
from nemocascade.models import ModelConfig, param_shardings, pretrained
from nemocascade.tokenizer import Tokenizer


def read_json(path: str, what: str) -> dict:
    if not files.exists(path):
        raise BadInput(f"{path}: no such file ({what}); is the workdir a finished run of experiments/run.py?")
    return files.read_json(path)


def run_config(workdir: str) -> ml_collections.ConfigDict:
    """The config the run in `workdir` recorded."""
    return ml_collections.ConfigDict(read_json(os.path.join(workdir, "config.json"), "the run's config"))


def resolve_stage(workdir: str, name: str) -> str:
    """The finished stage `name` refers to: `final` is the last finished main-line stage in summary.json; any
    other name resolves through the run's checkpoint registry, as a MOPD teacher's does."""
    summary = read_json(os.path.join(workdir, "summary.json"), "the run's summary")
    if name == "final":
        main = [s["name"] for s in summary.get("stages", []) if not s.get("side_branch")]
        if not main:
            raise BadInput(f"stage 'final': {workdir}/summary.json lists no finished main-line stage yet")
        name = main[-1]
    read_json(os.path.join(workdir, "checkpoints", "registry.json"), "the run's checkpoint registry")
    ref = name if name.startswith((named_checkpoints.STAGE, named_checkpoints.BEST)) else named_checkpoints.STAGE + name
    try:
        return named_checkpoints.NamedCheckpoints(os.path.join(workdir, "checkpoints")).stage_of(ref)
    except KeyError as err:
        raise BadInput(f"stage {name!r}: {err.args[0]} (in {workdir}/checkpoints/registry.json)") from None


def sentencepiece_path(cfg, workdir: str) -> str:
    return cfg.tokenizer.path or os.path.join(workdir, "tokenizer.model")  # as cascade.setup


def run_model(cfg, workdir: str, mesh):
    """(ModelConfig, tokenizer) of the run, as `cascade.setup` builds them."""
    if cfg.get("pretrained") and cfg.pretrained.kind:
        model_cfg, _, tokenizer = pretrained.load(cfg.pretrained, mesh, **pretrained.run_numerics(cfg))  # no weights
        return model_cfg, tokenizer
    path = sentencepiece_path(cfg, workdir)
    if not files.exists(path):
        raise BadInput(f"{path}: the run's tokenizer is missing (config.tokenizer.path)")
    tokenizer = Tokenizer(path)
    return ModelConfig.from_dict({**cfg.model.to_dict(), "vocab_size": tokenizer.vocab_size}), tokenizer


@dataclasses.dataclass
class Policy:
    """A stage's params with the model, tokenizer and config of its run, on `mesh` (this machine's devices)."""

    params: dict
    model_cfg: ModelConfig
    tokenizer: object
    cfg: ml_collections.ConfigDict
    mesh: object
    stage: str
    path: str

    def generate(self, prompts: list[str], *, thinking: bool | None = None, greedy: bool = True,
                 max_new_tokens: int | None = None, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                 batch_size: int = 8) -> list[str]:
        """One completion per user prompt (think block included in thinking mode). `thinking` None: the run's
        mode; `max_new_tokens` None: the run's `eval.max_new_tokens`."""
        records = [{"prompt": p} for p in prompts]
        e = self.cfg.eval
        texts, _ = evaluation.generate(
            self.params, self.model_cfg, self.tokenizer, records, batch_size=batch_size,
            max_prompt_len=e.max_prompt_len, max_new_tokens=max_new_tokens or e.max_new_tokens,
            rng=jax.random.key(seed), thinking=self.cfg.thinking if thinking is None else thinking, greedy=greedy,
            temperature=temperature, top_p=top_p, mesh=self.mesh)
        return texts


def stage_params(workdir: str, stage: str, abstract) -> tuple[str, str, dict]:
    """(stage name, path, params) of `stage` (`resolve_stage`) as the run left them in checkpoints/final/ (a LoRA
    stage's hold merged params), read into `abstract` (`cascade.abstract_params`)."""
    name = resolve_stage(workdir, stage)
    path = os.path.join(workdir, "checkpoints", "final", name)  # where the run wrote it (cascade._final_path)
    return name, path, checkpoint.load_params(path, abstract)


def load(workdir: str, stage: str = "final", mesh=None) -> Policy:
    """The policy `stage` of the run in `workdir`. `mesh`: default, every device of this machine
    (`mesh.make_mesh()`), whatever mesh the run trained on."""
    cfg = run_config(workdir)
    mesh = mesh_lib.make_mesh() if mesh is None else mesh
    model_cfg, tokenizer = run_model(cfg, workdir, mesh)
    abstract = cascade.abstract_params(model_cfg, param_shardings(model_cfg, mesh))
    name, path, params = stage_params(workdir, stage, abstract)
    return Policy(params, model_cfg, tokenizer, cfg, mesh, name, path)
