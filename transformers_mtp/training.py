# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Train the heads with PEFT LoRA by self-distillation, with the transformers `Trainer`.

- Every base parameter stays frozen (PEFT freezes them; only LoRA weights of the heads and the heads' own small
  modules train), so the base model's outputs are bit-identical after training.
- The frozen trunk runs once per sequence (`cache_trunk_features`); each step then runs only the heads and the
  shared lm_head, several times cheaper than a full forward on CPU.
- `Trainer` brings gradient accumulation, warmup, bf16, checkpoints of the adapter only, and exact resumption
  (optimizer, scheduler, RNG and data order are restored; the draft vocabulary and datastore are read back from the
  checkpoint, and a changed recipe is refused).
- One process: the loss is computed from cached features outside the model's forward, which a DDP wrapper would
  not see (no gradient sync), so `train_heads` refuses to start under `torchrun` / `accelerate launch`.
"""

import hashlib
import json
import math
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import logging

from .draft_datastore import build_draft_datastore
from .generation_draft_sources import DATASTORE_EMPTY_KEY
from .modeling_multi_token import aggregate_head_losses, head_cross_entropy
from .saving import save_atomically
from .training_data import cache_trunk_features, check_sequences, collate_features

logger = logging.get_logger(__name__)


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
        overwrite (`bool`, defaults to False): replace a non-empty `output_dir` that holds no checkpoint to resume.
        resume (`bool`, defaults to False): continue from the latest checkpoint in `output_dir`.
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
    datastore_min_count: int = 2
    overwrite: bool = False
    resume: bool = False


DRAFT_VOCAB_FILE = "draft_vocab.safetensors"  # PEFT adapters hold parameters only; the draft vocabulary rides beside
DRAFT_DATASTORE_FILE = "draft_datastore.safetensors"  # likewise the draft datastore


HEAD_SETTINGS_FILE = "multi_token.json"  # the convert() settings to rebuild the model this adapter belongs to
HEAD_SETTING_KEYS = ("num_heads", "head_type", "head_rank", "head_input", "head_share_kv", "head_loss_weights",
                     "draft_vocab_size", "draft_datastore_size")


def _save_head_settings(model, folder):
    settings = {key: getattr(model.config, key) for key in HEAD_SETTING_KEYS}
    settings["num_predict_heads"] = getattr(model.generation_config, "num_predict_heads", model.config.num_heads)
    settings["draft_tree_size"] = getattr(model.generation_config, "draft_tree_size", None) or 0
    (Path(folder) / HEAD_SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n")
    draft_ids = model.draft_unembedding()[1]
    if draft_ids is not None:
        save_file({"draft_token_ids": draft_ids.contiguous().cpu()}, str(Path(folder) / DRAFT_VOCAB_FILE))
    datastore = model.draft_datastore()
    if datastore is not None:
        used = int((datastore[0] != DATASTORE_EMPTY_KEY).sum())
        save_file({"keys": datastore[0][:used].contiguous().cpu(), "tokens": datastore[1][:used].contiguous().cpu()},
                  str(Path(folder) / DRAFT_DATASTORE_FILE))


def load_trained_heads(model, adapter_dir):
    """Apply a head adapter written by `train_heads` to a converted model (made with the same head settings) and
    merge it: returns the model with trained heads, base weights untouched."""
    adapter_dir = Path(adapter_dir)
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    if merged.config.draft_vocab_size is not None:
        vocab_file = adapter_dir / DRAFT_VOCAB_FILE
        if not vocab_file.is_file():
            raise FileNotFoundError(f"{vocab_file} is missing: this adapter was trained with a draft vocabulary.")
        merged.set_draft_vocabulary(load_file(str(vocab_file))["draft_token_ids"])
    if merged.config.draft_datastore_size is not None:
        datastore_file = adapter_dir / DRAFT_DATASTORE_FILE
        if not datastore_file.is_file():
            raise FileNotFoundError(f"{datastore_file} is missing: this adapter was trained with a draft datastore.")
        datastore = load_file(str(datastore_file))
        merged.set_draft_datastore(datastore["keys"], datastore["tokens"])
    return merged


def lora_config_for(model, rank=None) -> LoraConfig:
    """LoRA on the heads only, on the submodules their class declares (`lora_targets`, `modules_to_save`). The regexes
    are full matches, so no base layer is touched (a plain ["q_proj"] would adapt every base attention layer too)."""
    head_class = model.head_class
    rank = rank or model.config.head_rank
    targets = "|".join(head_class.lora_targets)
    targets = targets if len(head_class.lora_targets) == 1 else f"({targets})"
    return LoraConfig(r=rank, lora_alpha=rank, target_modules=rf".*mtp_heads\.\d+\.{targets}",
                      modules_to_save=head_class.modules_to_save(model.config), bias=head_class.lora_bias)


def most_emitted_tokens(features, count):
    """The `count` token ids the base model predicts most often on the training features (sorted by id)."""
    teacher = torch.cat([f["teacher"] for f in features])
    frequency = torch.bincount(teacher[teacher >= 0], minlength=count)
    return torch.topk(frequency, count).indices.sort().values


def features_loss(model, batch):
    """
    Loss of heads 1..K-1 from cached trunk features (head 0 is the frozen base: its loss is a constant and left out).
    Returns (loss, per-head losses [K-1], per-head top-1 agreement counts [K-1, 2] as (agreed, scored)).
    """
    teacher, mask = batch["teacher"], batch["attention_mask"]
    batch_size, length = teacher.shape
    positions = torch.arange(length, device=teacher.device)[None].expand(batch_size, length)
    share_kv = model.uses_layer_input and model.config.head_share_kv
    states, _ = model._head_states(
        normed=batch["normed"], layer_input=batch.get("layer_input"), next_token_ids=batch.get("next_ids"),
        position_ids=positions, key_padding_mask=mask if bool((mask == 0).any()) else None,
        base_kv=(batch["keys"], batch["values"]) if share_kv else None,
    )
    weight, draft_ids = model.draft_unembedding()
    head_logits = states @ weight.T  # [B, T, K-1, V or draft vocabulary]
    # teacher[t] is the base model's argmax at t, i.e. its token t + 1: already shifted, as `shift_labels` are. The
    # last position's argmax is a token past the end of the text, which is not scored.
    targets = F.pad(teacher[:, :-1], (0, 1), value=-100)
    draft_targets = targets
    if draft_ids is not None:  # targets as draft-vocabulary indices; a token outside it cannot be learned (-100)
        lookup = torch.full((model.config.vocab_size,), -100, dtype=torch.long, device=targets.device)
        lookup[draft_ids] = torch.arange(draft_ids.shape[0], device=targets.device)
        draft_targets = torch.where(targets == -100, targets, lookup[targets.clamp(min=0)])
    per_head, agreement = [], []
    for i in range(1, head_logits.shape[2] + 1):
        logits = head_logits[:, :, i - 1]
        per_head.append(head_cross_entropy(logits, draft_targets, i))
        target = targets[:, i:]
        scored = target != -100  # agreement counts every target, in the draft vocabulary or not
        choice = logits[:, : length - i].argmax(-1)
        agreed = ((choice if draft_ids is None else draft_ids[choice]) == target) & scored
        agreement.append(torch.stack([agreed.sum(), scored.sum()]))
    per_head = torch.stack(per_head)
    weights = model.config.head_loss_weights
    return aggregate_head_losses(per_head, weights[1:] if weights else None), per_head, torch.stack(agreement)


class HeadsTrainer(Trainer):
    """`Trainer` whose loss comes from cached trunk features, with per-head top-1 agreement in the logs."""

    def __init__(self, *args, recipe=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._agreement = None
        self.recipe = recipe  # written into each checkpoint (see `training_recipe`)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, _, agreement = features_loss(model.get_base_model(), inputs)
        self._agreement = agreement.detach() + (self._agreement if self._agreement is not None else 0)
        return (loss, None) if return_outputs else loss

    def log(self, logs, *args, **kwargs):
        if self._agreement is not None and "loss" in logs:
            for i, (agreed, scored) in enumerate(self._agreement.tolist(), start=1):
                logs[f"agree_head{i}"] = round(agreed / max(scored, 1), 4)
            self._agreement = None
        super().log(logs, *args, **kwargs)

    def _save_checkpoint(self, model, trial):
        # Trainer writes checkpoint-N in place; an interruption mid-write would leave a checkpoint that resume
        # trusts. Write it in a staging folder and move it into place with one rename instead.
        real_dir = self.args.output_dir
        staging = tempfile.mkdtemp(prefix=".staging-", dir=real_dir)
        self.args.output_dir = staging
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.output_dir = real_dir
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        # what resume reads back instead of recomputing: the head settings, draft vocabulary, datastore and recipe
        _save_head_settings(self.model.get_base_model(), os.path.join(staging, name))
        if self.recipe is not None:
            Path(staging, name, RECIPE_FILE).write_text(json.dumps(self.recipe, indent=2, sort_keys=True) + "\n")
        target = os.path.join(real_dir, name)
        if os.path.exists(target):
            shutil.rmtree(target)
        os.rename(os.path.join(staging, name), target)
        shutil.rmtree(staging)
        checkpoints = _checkpoints(real_dir)
        for old in checkpoints[: -self.args.save_total_limit] if self.args.save_total_limit else []:
            shutil.rmtree(old)

    @torch.no_grad()
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        model = self.model.get_base_model()
        was_training = model.training
        model.eval()
        losses, agreement = [], None
        for batch in self.get_eval_dataloader(eval_dataset):
            batch = self._prepare_inputs(batch)
            loss, _, counts = features_loss(model, batch)
            losses.append(loss.item())
            agreement = counts if agreement is None else agreement + counts
        model.train(was_training)
        metrics = {f"{metric_key_prefix}_loss": sum(losses) / max(len(losses), 1)}
        for i, (agreed, scored) in enumerate(agreement.tolist() if agreement is not None else [], start=1):
            metrics[f"{metric_key_prefix}_agree_head{i}"] = round(agreed / max(scored, 1), 4)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics


class AgreementInProgressBar(TrainerCallback):
    """Shows the loss and each head's top-1 agreement with the base model on the training progress bar."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_log(self, args, state, control, logs=None, **kwargs):
        bar = next((cb.training_bar for cb in self.trainer.callback_handler.callbacks
                    if isinstance(cb, ProgressCallback) and cb.training_bar is not None), None)
        if bar is not None and logs and "loss" in logs:
            agree = "/".join(f"{logs[k]:.2f}" for k in sorted(logs) if k.startswith("agree_head"))
            bar.set_postfix(loss=f"{logs['loss']:.3f}", agree=agree)


class _ListDataset(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


def _has_checkpoint(folder):
    return folder.is_dir() and any(p.name.startswith("checkpoint-") for p in folder.iterdir())


def _prepare_output_dir(config):
    output_dir = Path(config.output_dir)
    if config.resume:
        if not _has_checkpoint(output_dir):
            raise FileNotFoundError(f"resume=True, but {str(output_dir)!r} holds no checkpoint-* folder to resume from.")
        return output_dir
    if output_dir.exists() and any(output_dir.iterdir()):
        if not config.overwrite:
            raise FileExistsError(
                f"{str(output_dir)!r} already exists and is not empty; pass resume=True (--resume) to continue its "
                "training, overwrite=True (--overwrite) to start over, or choose another folder."
            )
        shutil.rmtree(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    return output_dir


RECIPE_FILE = "training_recipe.json"
# HeadTrainingConfig fields that do not change what is trained
_RECIPE_IGNORED = ("output_dir", "overwrite", "resume", "eval_steps", "save_steps", "logging_steps",
                   "feature_batch_size")


def training_recipe(model, sequences, config):
    """What a resumed run must share with the run it continues: the head settings, the training settings, the base
    model's config and a digest of its unembedding, and a digest of the token sequences."""
    data = hashlib.sha256()
    for sequence in sequences:
        data.update(json.dumps([sequence["prompt_length"], list(sequence["input_ids"])]).encode())
    base = {k: v for k, v in model.config.to_dict().items() if k not in HEAD_SETTING_KEYS
            and k not in ("transformers_version", "auto_map", "architectures", "dtype", "torch_dtype")}
    weight = model.lm_head.weight.detach().float().cpu()
    return {
        "heads": {key: getattr(model.config, key) for key in HEAD_SETTING_KEYS},
        "training": {k: v for k, v in vars(config).items() if k not in _RECIPE_IGNORED},
        "base_config": hashlib.sha256(json.dumps(base, sort_keys=True, default=str).encode()).hexdigest(),
        "base_unembedding": hashlib.sha256(weight.numpy().tobytes()).hexdigest(),
        "data": data.hexdigest(),
        "num_sequences": len(sequences),
    }


def _check_recipe(saved, current, checkpoint):
    """A resume whose recipe differs from the checkpoint's is an error naming what changed."""
    changed = []
    for key in sorted(set(saved) | set(current)):
        old, new = saved.get(key), current.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            changed += [f"{key}.{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
                        if old.get(k) != new.get(k)]
        elif old != new:
            digest = key in ("data", "base_config", "base_unembedding")
            changed.append(f"{key}: changed" if digest else f"{key}: {old!r} -> {new!r}")
    if changed:
        raise ValueError(
            f"resume=True, but {checkpoint} was trained with another recipe ({'; '.join(changed)}). Resume with the "
            "same model, data and settings, or start a new run in another output_dir (or pass overwrite=True)."
        )


def _checkpoints(output_dir):
    """The checkpoint-N folders of `output_dir`, by step."""
    return sorted((p for p in Path(output_dir).glob(f"{PREFIX_CHECKPOINT_DIR}-*") if p.is_dir()),
                  key=lambda p: int(p.name.rsplit("-", 1)[1]))


def _latest_checkpoint(output_dir):
    checkpoints = _checkpoints(output_dir)
    return checkpoints[-1] if checkpoints else None


def _restore_draft_tables(model, checkpoint):
    """Set the draft vocabulary and datastore that `checkpoint` was trained with (read back, not recomputed)."""
    for size, name, restore in (
        (model.config.draft_vocab_size, DRAFT_VOCAB_FILE,
         lambda tables: model.set_draft_vocabulary(tables["draft_token_ids"])),
        (model.config.draft_datastore_size, DRAFT_DATASTORE_FILE,
         lambda tables: model.set_draft_datastore(tables["keys"], tables["tokens"])),
    ):
        if size is None:
            continue
        path = checkpoint / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: the checkpoint cannot be resumed with the draft tables it was "
                                    "trained with. Start a new run (overwrite=True).")
        restore(load_file(str(path)))


def check_single_process():
    """Raise unless this is the only training process (see the module docstring)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world_size = max(world_size, torch.distributed.get_world_size())
    if world_size > 1:
        raise ValueError(
            f"train_heads runs in one process, but this is one of {world_size} (torchrun / accelerate launch set "
            "WORLD_SIZE): the heads' loss comes from cached trunk features outside the model's forward, so a DDP "
            "wrapper would not synchronise their gradients, and every process would write checkpoints. Start it as "
            "one process (python -m transformers_mtp train ..., --device cuda for one GPU)."
        )


def train_heads(model, sequences, config: HeadTrainingConfig, *, tokenizer=None, features=None, progress=True):
    """
    Train heads 1..num_heads-1 of a converted multi-token `model` on token `sequences` (dicts with `input_ids` and
    `prompt_length`, e.g. from `self_distill`). Writes `output_dir/adapter` (PEFT adapter) and `output_dir/merged`
    (a full checkpoint that loads with `trust_remote_code=True`). Returns (merged model, final eval metrics).
    `features`: trunk features of `sequences` (same order) cached earlier with `cache_trunk_features(...,
    all_features=True)`, to train several head types on one cache. Training runs on the model's device: move the
    model to a GPU first to train there (bf16 by default). It runs in one process and raises under `torchrun` /
    `accelerate launch`. With `config.resume`, the latest checkpoint's recipe must match this call's (the same model,
    sequences and settings) and its draft vocabulary and datastore are used as saved.
    """
    check_single_process()
    output_dir = _prepare_output_dir(config)
    if features is not None:
        if len(features) != len(sequences):
            raise ValueError(f"Got {len(features)} cached features for {len(sequences)} sequences; cache them together.")
        features_by_id = {id(s): f for s, f in zip(sequences, features)}
    usable = check_sequences(sequences, num_heads=model.config.num_heads, vocab_size=model.config.vocab_size)
    order = list(range(len(usable)))
    random.Random(config.seed).shuffle(order)
    n_eval = max(1, math.ceil(len(usable) * config.eval_fraction)) if len(usable) > 1 else 0
    eval_items = [usable[i] for i in order[:n_eval]]
    train_items = [usable[i] for i in order[n_eval:]] or eval_items
    if features is None:
        features = cache_trunk_features(model, train_items + eval_items, batch_size=config.feature_batch_size,
                                        progress=progress)
    else:
        features = [features_by_id[id(s)] for s in train_items + eval_items]
    train_features, eval_features = features[: len(train_items)], features[len(train_items) :]
    recipe = training_recipe(model, usable, config)
    checkpoint = _latest_checkpoint(output_dir) if config.resume else None
    if checkpoint is not None:
        if not (checkpoint / RECIPE_FILE).is_file():
            raise FileNotFoundError(f"{checkpoint / RECIPE_FILE} is missing: this checkpoint was not written by "
                                    "train_heads, or by an older release; start a new run (overwrite=True).")
        _check_recipe(json.loads((checkpoint / RECIPE_FILE).read_text()), recipe, checkpoint)
        _restore_draft_tables(model, checkpoint)
    else:
        if model.config.draft_vocab_size is not None:
            model.set_draft_vocabulary(most_emitted_tokens(train_features, model.config.draft_vocab_size))
        if model.config.draft_datastore_size is not None:  # from every answer: the datastore is not what eval measures
            model.set_draft_datastore(*build_draft_datastore(
                usable, vocab_size=model.config.vocab_size, length=model.config.num_heads - 1,
                max_entries=model.config.draft_datastore_size, min_count=config.datastore_min_count))

    peft_model = get_peft_model(model, lora_config_for(model, config.lora_rank))
    on_cuda = model.device.type == "cuda"  # train where the caller put the model (and where the features are)
    args = TrainingArguments(
        output_dir=str(output_dir),
        learning_rate=config.learning_rate,
        num_train_epochs=config.num_train_epochs,
        max_steps=config.max_steps,
        per_device_train_batch_size=config.per_device_train_batch_size,
        per_device_eval_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        warmup_steps=config.warmup_ratio,  # a float below 1 is a ratio of the total steps
        lr_scheduler_type="cosine",
        eval_strategy="steps" if eval_features else "no",
        eval_steps=config.eval_steps,
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=2,
        logging_steps=config.logging_steps,
        seed=config.seed,
        data_seed=config.seed,
        bf16=on_cuda if config.bf16 is None else config.bf16,
        use_cpu=not on_cuda,
        remove_unused_columns=False,
        report_to=[],
        disable_tqdm=not progress,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,  # the cached features already live on the model's device
    )
    trainer = HeadsTrainer(model=peft_model, args=args, recipe=recipe, train_dataset=_ListDataset(train_features),
                           eval_dataset=_ListDataset(eval_features) if eval_features else None,
                           data_collator=collate_features)
    trainer.add_callback(AgreementInProgressBar(trainer))
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
    metrics = trainer.evaluate() if eval_features else {}

    save_atomically(peft_model, output_dir / "adapter", overwrite=True, write_extra=partial(_save_head_settings, model))
    merged = peft_model.merge_and_unload().eval()  # Trainer left it in training mode (dropout on, for GPT-2)
    save_atomically(merged, output_dir / "merged", tokenizer=tokenizer, overwrite=True)
    return merged, metrics


def _read_cache(cache, expected, describe):
    """Lines of a self-distillation cache, checked against `expected` (one (prompt, extra) key per line, in order):
    a cache made from other prompts or settings is an error naming the line, never silently reused."""

    if cache is None or not cache.is_file():
        return []
    cached = [json.loads(line) for line in cache.read_text().splitlines() if line.strip()][: len(expected)]
    for number, (sequence, (prompt, extra)) in enumerate(zip(cached, expected), 1):
        found = {key: sequence.get(key) for key in extra}
        if sequence.get("prompt") != prompt or found != extra:
            raise ValueError(
                f"{cache}:{number} holds the response to {sequence.get('prompt')!r} {found or ''}, not to "
                f"{describe(number)} ({prompt!r} {extra or ''}): the cache was made from other prompts or settings. "
                "Delete it or set another data_cache."
            )
    logger.info(f"Reusing {len(cached)} self-distilled sequences from {cache}")
    return cached


def _write_cache(cache, sequences):
    cache.parent.mkdir(parents=True, exist_ok=True)
    staging = cache.with_suffix(f".{os.getpid()}.tmp")  # one per process: under torchrun every rank writes the same
    staging.write_text("".join(json.dumps(s) + "\n" for s in sequences))
    os.replace(staging, cache)  # atomic: a later run never reads half a file


def training_sequences(model, tokenizer, settings, *, progress=True):
    """The sequences a preset's `train:` section asks for: self-distillation on the first `num_prompts` built-in
    prompts, or a plain text / JSONL file.

    Self-distillation gives each prompt its greedy response and, with `sampled_per_prompt: N`, N more responses
    sampled at `sample_temperature`. Sampled text is still scored against the base model's argmax at every
    position (`cache_trunk_features`), so it adds contexts the model itself writes, at no loss of target quality.

    With `data_cache`, responses are kept in JSONL files (greedy: `data_cache`; sampled: `data_cache` with a
    `.sampled` suffix), one line per response in a fixed order. A later run reuses them, and when it asks for more
    it generates only the missing ones and appends them (a longer run need not redo the first hours of generation).
    A cache made from other prompts or settings is an error, never silently reused."""
    from .training_data import load_text_sequences, self_distill
    from .training_prompts import training_prompts

    data = settings.get("data", "builtin")
    if data != "builtin":
        return load_text_sequences(data, tokenizer)
    prompts = [p["prompt"] for p in training_prompts(limit=settings.get("num_prompts", 640))]
    samples = settings.get("sampled_per_prompt", 0)
    if not isinstance(samples, int) or samples < 0:
        raise ValueError(f"sampled_per_prompt={samples!r} must be a whole number >= 0 (0: greedy responses only).")
    temperature = settings.get("sample_temperature", 0.7)
    distill = partial(self_distill, model, tokenizer, max_new_tokens=settings.get("max_new_tokens", 160),
                      batch_size=settings.get("distill_batch_size", 16), progress=progress)
    cache = Path(settings["data_cache"]) if settings.get("data_cache") else None

    greedy = _read_cache(cache, [(p, {}) for p in prompts], lambda n: f"built-in prompt {n}")
    if len(greedy) < len(prompts):
        missing = prompts[len(greedy):]
        greedy += [dict(s, prompt=p) for s, p in zip(distill(missing), missing)]
        if cache is not None:
            _write_cache(cache, greedy)
    if not samples:
        return greedy

    # round j holds the j-th sample of every prompt, so asking for more samples only appends rounds
    expected = [(p, {"sample": j, "temperature": temperature}) for j in range(samples) for p in prompts]
    sampled_cache = cache.with_suffix(".sampled.jsonl") if cache is not None else None
    sampled = _read_cache(sampled_cache, expected, lambda n: f"sample {(n - 1) // len(prompts)} of built-in prompt "
                                                             f"{(n - 1) % len(prompts) + 1}")
    while len(sampled) < len(expected):
        j, done = divmod(len(sampled), len(prompts))
        missing = prompts[done:]
        responses = distill(missing, temperature=temperature, seed=settings.get("seed", 0) * 1000 + j)
        sampled += [dict(s, prompt=p, sample=j, temperature=temperature) for s, p in zip(responses, missing)]
        if sampled_cache is not None:
            _write_cache(sampled_cache, sampled)
    return greedy + sampled
