# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""`FeatureStore`: the trunk features of `cache_trunk_features`, kept on disk between training runs.

`cache_trunk_features` runs the frozen trunk once per sequence and keeps what the heads read in memory. On a 2-core
CPU that is about 20 minutes of each 55-minute run on 2,304 answers, paid again by every run on the same answers (a
study that changes one head setting, a run resumed after `--time-limit`); and the 20,478 answers of the real-prompt
preset (about 4.4M tokens, 6 KB of float32 features per token for `query_extension` heads) would need 27 GB, more
than this machine's memory. A store computes them once, writes them into safetensors shards, and reads each sequence
back (memory-mapped) only when a batch needs it.

What features are depends on: the trunk's and the unembedding's weights, their dtype and the device type, which
features are kept and the tapped layers. All of that is hashed into the name of a sub-folder, so a store made for
another model or head layout is never read by mistake. Inside it, each sequence is addressed by its tokens and
prompt length: a run on a grown answer cache computes only the new answers' features. A shard is written whole and
moved into place with one rename, so an interrupted caching keeps every finished shard and resumes after it.

Hand-written rather than a `datasets` cache: safetensors (already a dependency) stores torch tensors of every dtype,
bfloat16 included (Arrow has none), and reads a slice of a shard without loading the rest.
"""

import hashlib
import json
import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers.utils import logging

from .data import can_derive_trunk_features, cache_trunk_features, derive_trunk_features

logger = logging.get_logger(__name__)
FORMAT_VERSION = 1  # raise when what a shard holds changes: older stores then live in another sub-folder
SHARD_SEQUENCES = 256  # sequences per shard: an interrupted caching loses at most one shard's work
STORE_FILE = "store.json"  # what the sub-folder's key was made from, for a reader of the folder
TIME_DIM = {"keys": 1, "values": 1}  # [kvH, T, D]; every other feature has time first


def _sequence_key(sequence):
    digest = hashlib.sha256(json.dumps([sequence["prompt_length"], list(sequence["input_ids"])]).encode())
    return digest.hexdigest()[:32]


def _weights_digest(model):
    """sha256 over every parameter and buffer outside the heads (trunk, final norm, unembedding), names included."""
    digest = hashlib.sha256()
    tensors = dict(model.named_parameters())
    tensors.update(model.named_buffers())
    for name in sorted(tensors):
        if name.startswith("mtp_heads."):
            continue
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{list(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@lru_cache(maxsize=16)
def _open_shard(path):
    # a handle per shard, kept open: a batch reads from a few shards many times
    return safe_open(path, framework="pt")


class StoredFeatures(Mapping):
    """One sequence's features in a shard, read key by key when asked for (`features["normed"]`), as a dict of them
    would be."""

    def __init__(self, shard, start, length, names):
        self.shard, self.start, self.length, self.names = shard, start, length, tuple(names)

    def __getitem__(self, name):
        if name not in self.names:
            raise KeyError(name)
        span = _open_shard(self.shard).get_slice(name)
        if TIME_DIM.get(name, 0) == 1:
            return span[:, self.start : self.start + self.length]
        return span[self.start : self.start + self.length]

    def __iter__(self):
        return iter(self.names)

    def __len__(self):
        return len(self.names)


class FeatureStore:
    """
    Trunk features of `model` on disk under `folder` (see the module docstring). `features(sequences)` returns, in
    the order given, one mapping per sequence with the keys `cache_trunk_features` gives, computing (and storing)
    only those not stored yet. `all_features` as in `cache_trunk_features`.
    """

    def __init__(self, folder, model, *, all_features=False):
        if Path(folder).exists() and not Path(folder).is_dir():
            raise NotADirectoryError(f"feature_cache={str(folder)!r} is a file; give a folder for the stored features.")
        self.model, self.all_features = model, all_features
        with_layer_input = model.uses_layer_input or all_features
        described = {
            "format": FORMAT_VERSION,
            "weights": _weights_digest(model),
            "dtype": str(model.dtype),
            "device": model.device.type,
            "layer_input": with_layer_input,
            "taps": model.head_feature_indices if with_layer_input else [],
            "keys_values": (model.uses_layer_input and model.config.heads_share_base_kv) or all_features,
        }
        key = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]
        self.described = described
        self.folder = Path(folder) / key
        self.folder.mkdir(parents=True, exist_ok=True)
        description = self.folder / STORE_FILE
        if not description.is_file():
            staging = description.with_suffix(f".{os.getpid()}.tmp")
            staging.write_text(json.dumps(described, indent=2, sort_keys=True) + "\n")
            os.replace(staging, description)

    def _index(self, folder=None):
        """{sequence key: StoredFeatures} over every finished shard (of this store, or of the store in `folder`)."""
        index = {}
        for shard in sorted((folder or self.folder).glob("shard-*.safetensors")):
            handle = _open_shard(str(shard))
            metadata = handle.metadata()
            names = json.loads(metadata["names"])
            start = 0
            for key, length in json.loads(metadata["sequences"]):
                index[key] = StoredFeatures(str(shard), start, length, names)
                start += length
        return index

    def _sources(self):
        """[(taps, index)] of the sibling stores this one can derive its features from (`derive_trunk_features`):
        the same trunk, dtype and device, with tapped hidden states at or below the layers these heads read (any
        such store for heads that read only the normed final state). The deepest tap first: it leaves the fewest
        layers to run."""
        reads_layers = self.described["layer_input"]
        if self.all_features or (reads_layers and not can_derive_trunk_features(self.model)):
            return []
        needed = min(self.described["taps"]) if reads_layers else None
        sources = []
        for description in self.folder.parent.glob(f"*/{STORE_FILE}"):
            if description.parent == self.folder:
                continue
            try:
                other = json.loads(description.read_text())
            except (OSError, ValueError):
                continue  # a store being written, or not a store: compute instead
            same_trunk = all(other.get(k) == self.described[k] for k in ("format", "weights", "dtype", "device"))
            if not same_trunk:
                continue
            if not reads_layers:  # heads that read the normed final state: any store of this trunk holds it
                sources.append((0, other.get("taps", []), description.parent))
                continue
            taps = [t for t in other.get("taps", []) if t <= needed]
            if other.get("layer_input") and taps:
                sources.append((max(taps), other["taps"], description.parent))
        return [(taps, self._index(folder)) for _, taps, folder in sorted(sources, key=lambda s: -s[0])]

    def _write_shard(self, keys, features):
        names = list(features[0])
        tensors = {name: torch.cat([f[name] for f in features], dim=TIME_DIM.get(name, 0)).cpu().contiguous()
                   for name in names}
        metadata = {"names": json.dumps(names),
                    "sequences": json.dumps([[k, f["teacher"].shape[0]] for k, f in zip(keys, features)])}
        shard = self.folder / f"shard-{keys[0]}.safetensors"  # named by its first sequence: unique, no counter
        staging = self.folder / f".{shard.name}.{os.getpid()}.tmp"
        save_file(tensors, str(staging), metadata=metadata)
        os.replace(staging, shard)  # atomic: a reader never sees half a shard

    def _derived(self, keys, sources, progress):
        """{key: features} for those of `keys` that a source store holds, derived from its taps."""
        found = {}
        for taps, index in sources:
            held = [k for k in keys if k in index and k not in found]
            if held:
                found.update(zip(held, derive_trunk_features(self.model, [index[k] for k in held], source_taps=taps,
                                                             progress=progress)))
        if found:
            logger.info(f"Derived the features of {len(found)} of {len(keys)} sequences from stored hidden states")
        return found

    def features(self, sequences, *, batch_size=1, progress=True):
        keys = [_sequence_key(s) for s in sequences]
        index = self._index()
        missing = list(dict.fromkeys(k for k in keys if k not in index))  # each new sequence once, in order
        if missing:
            by_key = dict(zip(keys, sequences))
            logger.info(f"Caching the trunk features of {len(missing)} of {len(keys)} sequences into {self.folder} "
                        f"({len(keys) - len(missing)} stored already)")
            sources = self._sources()
            for start in range(0, len(missing), SHARD_SEQUENCES):
                chunk = missing[start : start + SHARD_SEQUENCES]
                computed = self._derived(chunk, sources, progress)
                rest = [k for k in chunk if k not in computed]
                if rest:
                    computed.update(zip(rest, cache_trunk_features(
                        self.model, [by_key[k] for k in rest], all_features=self.all_features, batch_size=batch_size,
                        progress=progress)))
                self._write_shard(chunk, [computed[k] for k in chunk])
            index = self._index()
        else:
            logger.info(f"Reading the trunk features of all {len(keys)} sequences from {self.folder}")
        return [index[k] for k in keys]
