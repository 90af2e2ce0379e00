# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""`HeadTrainingConfig`: the settings of one `train_heads` run (output folder, LoRA rank, optimisation, evaluation
and checkpoint intervals, draft datastore threshold, resume / overwrite)."""

from dataclasses import dataclass

HEAD_LOSSES = ("cross_entropy", "kl")  # see `features_loss`


@dataclass
class HeadTrainingConfig:
    r"""
    Args:
        output_dir (`str`): where checkpoints, `adapter/` (PEFT adapter) and `merged/` (full checkpoint) go.
        lora_rank (`int`, *optional*): LoRA rank on the heads; defaults to the model's `head_rank`.
        learning_rate (`float`, defaults to 1e-3): the heads are new and small; Medusa trains its heads at 1e-3.
        num_train_epochs (`float`, defaults to 2.0), max_steps (`int`, defaults to -1: use epochs).
        per_device_train_batch_size (`int`, defaults to 8), gradient_accumulation_steps (`int`, defaults to 1).
        warmup_ratio (`float`, defaults to 0.03): seed 004's recipe.
        eval_fraction (`float`, defaults to 0.05): share of sequences held out for evaluation.
        eval_steps / save_steps / logging_steps (`int`): evaluation, checkpoint and log intervals in steps.
        seed (`int`, defaults to 0). bf16 (`bool`, *optional*): defaults to True on CUDA, False on CPU.
        datastore_min_count (`int`, defaults to 2): a 3-token context enters the draft datastore (models with
            `draft_datastore_size`) when its most frequent continuation was seen at least this often.
        feature_batch_size (`int`, defaults to 1): sequences per trunk pass when caching features; raise it on a GPU
            (on a CPU a padded batch only adds work).
        feature_cache (`str`, *optional*): a folder that keeps the trunk features on disk (`FeatureStore`): a later
            run on the same model and answers reads them instead of recomputing them, a grown answer cache adds only
            the new ones, and training reads each sequence from disk when a batch needs it instead of holding every
            feature in memory. Not part of the recipe a resumed run must match.
        group_by_length (`bool`, defaults to False): batch sequences of similar length together (transformers'
            `LengthGroupedSampler`), so that less of each batch is padding; pays where lengths vary (real prompts).
        head_loss (`str`, defaults to "cross_entropy"): "cross_entropy" against the base model's argmax, or "kl": KL
            divergence from its distribution over the drafting vocabulary (soft targets; see `features_loss`).
        overwrite (`bool`, defaults to False): replace a non-empty `output_dir` that holds no checkpoint to resume.
        resume (`bool`, defaults to False): continue from the latest checkpoint in `output_dir`.
        deadline (`float`, *optional*): a `time.time()` value after which no further training step starts: the
            run then ends as a finished one does (final evaluation, `adapter/`, `merged/`) after saving a checkpoint
            that `resume` continues. Not part of the recipe a resumed run must match.
        init_heads (`str`, *optional*): start from trained heads instead of new ones: a head adapter folder
            (`OUTPUT_DIR/adapter` of an earlier run) or the name of a shipped head set ("default", "chained"). Its
            LoRA weights, fully trained modules and draft vocabulary are the starting point; its head settings must
            be the model's. The draft datastore is built from this run's sequences, as in any run.
    """

    output_dir: str
    lora_rank: int | None = None
    learning_rate: float = 1e-3
    num_train_epochs: float = 2.0
    max_steps: int = -1
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    warmup_ratio: float = 0.03
    eval_fraction: float = 0.05
    eval_steps: int = 100
    save_steps: int = 100
    logging_steps: int = 10
    seed: int = 0
    bf16: bool | None = None
    feature_batch_size: int = 1
    feature_cache: str | None = None
    group_by_length: bool = False
    datastore_min_count: int = 2
    head_loss: str = "cross_entropy"
    overwrite: bool = False
    resume: bool = False
    init_heads: str | None = None
    deadline: float | None = None

    def __post_init__(self):
        if self.head_loss not in HEAD_LOSSES:
            raise ValueError(f"head_loss={self.head_loss!r} is not a head loss; use 'cross_entropy' (against the base "
                             "model's argmax) or 'kl' (against its distribution over the drafting vocabulary).")
