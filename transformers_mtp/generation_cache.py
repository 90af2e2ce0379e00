# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""KV-cache helpers that mean the same on every transformers release and cache class a user may have.

Copied next to the weights by `save_pretrained` (through generation_multi_token.py): imports only torch, transformers
and `from .module import Name`.
"""

from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


def cache_layer_keys_values(cache, index):
    """(keys, values) [B, kvH, length, D] that layer `index` of `cache` holds. A static cache's tensors span its whole
    capacity; only the first `get_seq_length()` positions are filled."""
    layer = cache.layers[index]
    length = int(layer.get_seq_length())
    return layer.keys[:, :, :length], layer.values[:, :, :length]


def crop_cache(cache, length):
    """Crop `cache` to its first `length` positions. Written here because `crop`'s meaning moved across transformers
    releases (a positive argument was the length to keep; `crop(0)` emptied the cache before 5.x), and a model loaded
    with `trust_remote_code` runs on whatever release the user has: only a negative count, "remove this many", means
    the same in all of them."""
    remove = int(cache.get_seq_length()) - length
    if remove < 0:
        raise ValueError(f"cannot crop a cache of {length - remove} positions to {length}")
    if remove:
        cache.crop(-remove)


def is_static_cache(cache):
    return bool(getattr(cache, "is_compileable", False))


def unslide_within_window(cache, num_positions=None):
    """
    Make the sliding-window layers of a dynamic `cache` full-attention layers that keep every position, so that a
    rejected draft can be rolled back; transformers still applies the window when it builds the mask (from the
    model's config, over cache positions). Only a layer that has dropped nothing yet, and, where the decoding's cache
    positions are not its text positions (`num_positions`: see `cache_positions_needed`), only when the window spans
    all of them. Costs the memory of a full layer past the window. In place; other layers stay.
    """
    for i, layer in enumerate(getattr(cache, "layers", None) or []):
        if not isinstance(layer, DynamicSlidingWindowLayer):
            continue
        if num_positions is not None and num_positions > layer.sliding_window:
            continue
        if layer.is_initialized and layer.cumulative_length != layer.keys.shape[-2]:
            continue  # it dropped positions already
        full = DynamicLayer()
        if layer.is_initialized:
            full.lazy_initialization(layer.keys, layer.values)
            full.keys, full.values = layer.keys, layer.values
        cache.layers[i] = full


def layers_that_cannot_roll_back(cache):
    """Indices of `cache`'s sliding-window layers that drop positions a rejected draft may need back: every one but
    static ones sized within their window (transformers' `is_croppable`: such a layer never wraps around)."""
    return [i for i, layer in enumerate(getattr(cache, "layers", None) or [])
            if getattr(layer, "is_sliding", False)
            and not (hasattr(layer, "max_cache_len") and getattr(layer, "is_croppable", False))]
