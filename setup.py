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
        "tensorboardX",   # TensorBoard event files without TensorFlow
        "math-verify",    # symbolic answer equivalence, fallback of the math verifier
        "safetensors",    # models/hf.py: HF checkpoints in and out
        "gguf", "tokenizers", "jinja2",  # models/gguf.py, hf_tokenizer.py: GGUF models, HF vocabularies, chat templates
    ],
    # torch pinned exactly: install the CPU build (--index-url https://download.pytorch.org/whl/cpu), plain
    # `pip install torch` pulls a multi-GB CUDA one; accelerate: transformers' GGUF loading needs it
    extras_require={"test": ["pytest>=8", "torch==2.13.0", "transformers>=5", "safetensors", "accelerate"]},
)
