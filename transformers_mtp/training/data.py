# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Training data for the heads: token sequences (self-distilled, or from a text / JSONL file), and the frozen trunk's
features with the base model's own targets; also the chat-template and JSONL helpers that the CLI and the benchmark
use too.

Targets are the base model's **argmax** at every position, not the text's next tokens and not its distribution:
verification accepts a draft exactly when it equals the base model's argmax, so the argmax is what a head must
predict. On self-distilled (greedy) responses the two coincide; on other text the argmax is still the right target.
That is the default; `head_loss="kl"` (training config) instead fits the base model's distribution over the
drafting vocabulary (soft targets, which speculative sampling rewards), recomputed from the cached lm_head inputs.
"""

import contextlib
import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..generation_onednn import OneDNNLinear, auto_onednn_verify


def chat_ids(tokenizer, text):
    """Token ids of `text` as a user turn in the tokenizer's chat template, ready for the assistant's answer."""
    messages = [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]


def chat_input_ids(tokenizer, text):
    """[1, T] ids of `text` as a chat-template user turn (a batch of one, as `generate()` takes it)."""
    return torch.tensor([chat_ids(tokenizer, text)])


def read_jsonl(path):
    """(line number, object) for each non-empty line of a JSONL file; a bad line is an error naming it."""
    path = Path(path)
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number} is not valid JSON ({error.msg}); write one object per line.") from None


@torch.inference_mode()
def self_distill(model, tokenizer, prompts, *, max_new_tokens=128, batch_size=16, temperature=None, seed=0,
                 progress=True):
    """
    The base model's own responses to `prompts` (strings, formatted with the chat template), generated in
    left-padded batches: greedy by default, or sampled at `temperature` (seeded with `seed`; the samples depend on
    the device and the batch size, as sampling in `generate()` does). Returns sequences: dicts with `input_ids`
    (prompt + response) and `prompt_length`.
    """
    if not prompts:
        raise ValueError("self_distill() got no prompts; pass at least one prompt string.")
    if temperature is not None and temperature <= 0:
        raise ValueError(f"temperature={temperature} must be positive; leave it unset for greedy responses.")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    sampling = {"do_sample": False} if temperature is None else {"do_sample": True, "temperature": temperature}
    if temperature is not None:
        torch.manual_seed(seed)
    sequences = []
    desc = "self-distilling" if temperature is None else f"self-distilling (sampled, T={temperature})"
    for start in tqdm(range(0, len(prompts), batch_size), desc=desc, disable=not progress):
        encoded = [chat_ids(tokenizer, text) for text in prompts[start : start + batch_size]]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in encoded], device=model.device)
        attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded],
                                      device=model.device)
        out = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                             pad_token_id=pad_id, **sampling)
        for row, ids in enumerate(encoded):
            response = out[row, width:].tolist()
            if tokenizer.eos_token_id in response:  # keep the EOS, drop the padding after it
                response = response[: response.index(tokenizer.eos_token_id) + 1]
            sequences.append({"input_ids": ids + response, "prompt_length": len(ids)})
    return sequences


def load_text_sequences(path, tokenizer, *, max_length=512):
    """
    Plain text (documents separated by blank lines) or JSONL (`{"text": ...}` or `{"prompt": ..., "response": ...}`)
    as training sequences. Prompts are formatted with the chat template; only the response is scored.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No training file at {str(path)!r}.")
    sequences = []
    if path.suffix == ".jsonl":
        for number, item in read_jsonl(path):
            if "prompt" in item and "response" in item:
                prompt = chat_ids(tokenizer, item["prompt"])
                response = tokenizer(item["response"], add_special_tokens=False)["input_ids"]
                sequences.append({"input_ids": (prompt + response)[:max_length], "prompt_length": len(prompt)})
            elif "text" in item:
                sequences.append({"input_ids": tokenizer(item["text"])["input_ids"][:max_length], "prompt_length": 0})
            else:
                raise ValueError(f'{path}:{number} needs "text", or "prompt" and "response".')
    else:
        for document in path.read_text().split("\n\n"):
            if document.strip():
                sequences.append({"input_ids": tokenizer(document)["input_ids"][:max_length], "prompt_length": 0})
    return sequences


def check_sequences(sequences, *, num_heads, vocab_size):
    """Clear errors for data that would train nothing or index out of the vocabulary."""
    if not sequences:
        raise ValueError("The training data is empty; pass at least one sequence (prompts, a text or JSONL file).")
    usable = [s for s in sequences if len(s["input_ids"]) - max(s["prompt_length"] - 1, 0) > num_heads]
    if not usable:
        raise ValueError(
            f"Every sequence is too short: a head needs more than num_heads={num_heads} scored tokens after the "
            "prompt. Use longer responses (max_new_tokens) or texts."
        )
    top = max(max(s["input_ids"]) for s in usable)
    if top >= vocab_size:
        raise ValueError(
            f"Token id {top} is outside the model's vocabulary of {vocab_size}: the tokenizer does not belong to this "
            "model. Use the base model's own tokenizer."
        )
    return usable


@torch.inference_mode()
def cache_trunk_features(model, sequences, *, all_features=False, batch_size=1, progress=True):
    """
    One teacher-forced trunk pass per sequence. The trunk is frozen, so its outputs are computed once instead of at
    every epoch; training then runs only the heads and the shared lm_head.

    Returns per sequence (T tokens): `normed` [T, H] (the input of lm_head), `layer_input` [T, H] and the base last
    layer's `keys` / `values` [kvH, T, D] for `query_extension` heads, `next_ids` [T] (the token after each position,
    0 at the end) and `teacher` [T]: the base model's argmax at each position, -100 before the last prompt token.
    `all_features=True` keeps everything any head type reads, so one cache serves a comparison of head types.
    `batch_size > 1` runs right-padded batches (a GPU's way; the padding comes after every real token, so causal
    attention keeps it out of the real positions' features). The features stay on the model's device.

    A float32 model on a CPU computes these passes' products on oneDNN where `onednn_verify="auto"` would decode on it
    (generation_onednn.py): for one SmolLM2-135M answer of about 225 tokens on the 2-core AMD EPYC (Zen 4), the trunk
    took 364 against 411 ms on MKL and the unembedding 78 against 108 ms (2026-12-07). The features then come from the
    same kernels as the verify passes that read them when decoding.
    """
    model.eval()
    routed = OneDNNLinear(model) if auto_onednn_verify(model) else contextlib.nullcontext()
    with_layer_input = model.uses_layer_input or all_features
    share_kv = (model.uses_layer_input and model.config.heads_share_base_kv) or all_features
    features = []
    for start in tqdm(range(0, len(sequences), batch_size), desc="caching trunk features", disable=not progress):
        chunk = sequences[start : start + batch_size]
        width = max(len(s["input_ids"]) for s in chunk)
        ids = torch.tensor([s["input_ids"] + [0] * (width - len(s["input_ids"])) for s in chunk], device=model.device)
        with routed:
            normed, layer_input, out = model._trunk_forward(ids, use_cache=share_kv, need_layer_input=with_layer_input)
            teachers = model.unembed(normed).argmax(-1)
        cache = out.cache
        for row, sequence in enumerate(chunk):
            length = len(sequence["input_ids"])
            teacher = teachers[row, :length].clone()
            teacher[: max(sequence["prompt_length"] - 1, 0)] = -100
            item = {"normed": normed[row, :length].clone(), "teacher": teacher,
                    "next_ids": torch.cat([ids[row, 1:length], ids.new_zeros(1)])}
            if with_layer_input:
                item["layer_input"] = layer_input[row, :length].clone()
            if share_kv:
                item["keys"] = cache.layers[-1].keys[row, :, :length].clone()
                item["values"] = cache.layers[-1].values[row, :, :length].clone()
            features.append(item)
    return features


def can_derive_trunk_features(model):
    """Whether `derive_trunk_features` can run `model`'s decoder layers by themselves: Llama-shaped trunks whose
    every layer attends causally over the whole sequence (one rotary embedding, no sliding window). Others (GPT-2's
    learned positions, Gemma's per-layer rotary and sliding layers) compute their features from the tokens."""
    config = model.config
    full_attention = set(getattr(config, "layer_types", None) or ["full_attention"]) == {"full_attention"}
    no_window = getattr(config, "sliding_window", None) is None or getattr(config, "use_sliding_window", True) is False
    return (model.architecture.rotary is not None and not model.architecture.rotary_per_layer_type
            and full_attention and no_window)


@torch.inference_mode()
def derive_trunk_features(model, stored, *, source_taps, progress=True):
    """
    `cache_trunk_features`' features for sequences whose features another head layout stored (a `FeatureStore` of
    the same trunk), without running the trunk from the tokens: from the deepest of the stored taps
    (`source_taps`, the indices of `hidden_states` the stored `layer_input` concatenates) at or below the layers this
    model's heads read, the decoder layers in between run on the stored hidden state; `normed`, `teacher` and
    `next_ids` are copied, and the last layer's keys and values (`share_kv` heads) are computed from its input as
    the layer computes them. `stored`: one mapping per sequence, as a store returns them.

    What it saves: the 20 GB store of the chained drafter's taps (2 / 15 / 27 of SmolLM2's 30 layers) gives the
    `query_extension` heads' features (the input of layer 29) through 2 layers instead of 30 and no unembedding.
    Hand-written over `LlamaModel.forward`'s own loop (`create_causal_mask`, the rotary embedding, the layers)
    because transformers has no way to start a forward at a middle layer.
    """
    from transformers.masking_utils import create_causal_mask

    if model.uses_layer_input and not can_derive_trunk_features(model):
        raise ValueError(f"{type(model).__name__} ({model.config.model_type}) cannot run its decoder layers from a "
                         "stored hidden state; compute its features with cache_trunk_features.")
    model.eval()
    targets = model.head_feature_indices if model.uses_layer_input else []
    share_kv = model.uses_layer_input and model.config.heads_share_base_kv
    last_input = model.config.num_hidden_layers - 1
    needed = sorted(set(targets) | ({last_input} if share_kv else set()))
    below = [t for t in source_taps if not needed or t <= needed[0]]
    if needed and not below:
        raise ValueError(f"The stored taps {list(source_taps)} are all deeper than the layers {needed} these heads "
                         "read; compute their features with cache_trunk_features.")
    start = max(below) if needed else None
    trunk, last_layer, _, _, rotary = model._parts()
    layers = getattr(trunk, model.architecture.layers)
    width = model.config.hidden_size
    routed = OneDNNLinear(model) if auto_onednn_verify(model) else contextlib.nullcontext()
    features = []
    for item in tqdm(stored, desc="deriving trunk features", disable=not progress):
        derived = {name: item[name].clone() for name in ("normed", "teacher", "next_ids")}
        if needed:
            column = list(source_taps).index(start) * width
            hidden = item["layer_input"][:, column : column + width].unsqueeze(0).to(model.device)
            position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
            position_embeddings = rotary(hidden, position_ids)
            mask = create_causal_mask(config=trunk.config, inputs_embeds=hidden, attention_mask=None, cache=None,
                                      position_ids=position_ids)
            taps = {}
            with routed:
                for index in range(start, needed[-1] + 1):
                    if index in needed:
                        taps[index] = hidden
                    if index < needed[-1]:
                        hidden = layers[index](hidden, attention_mask=mask, position_ids=position_ids,
                                               position_embeddings=position_embeddings)
                if share_kv:
                    keys, values = model.query_extension_head_class.base_layer_keys_values(
                        last_layer, taps[last_input], position_embeddings)
            if targets:
                derived["layer_input"] = torch.cat([taps[t] for t in targets], dim=-1)[0].clone()
            if share_kv:
                derived["keys"], derived["values"] = keys[0].clone(), values[0].clone()
        features.append(derived)
    return features


def collate_features(items):
    """Right-pad a list of feature dicts into a batch; padded teacher positions are -100 and masked."""
    length = max(item["teacher"].shape[0] for item in items)
    batch = {}
    for key in items[0]:
        time_dim = 1 if key in ("keys", "values") else 0
        pad_value = -100 if key == "teacher" else 0
        padded = []
        for item in items:
            tensor = item[key]
            missing = length - tensor.shape[time_dim]
            if missing:
                shape = list(tensor.shape)
                shape[time_dim] = missing
                tensor = torch.cat([tensor, tensor.new_full(shape, pad_value)], dim=time_dim)
            padded.append(tensor)
        batch[key] = torch.stack(padded)
    batch["attention_mask"] = torch.stack([
        torch.cat([torch.ones(i["teacher"].shape[0], dtype=torch.long),
                   torch.zeros(length - i["teacher"].shape[0], dtype=torch.long)]) for i in items
    ])
    return batch
