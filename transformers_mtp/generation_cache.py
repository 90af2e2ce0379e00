# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""KV-cache helpers that mean the same on every transformers release and cache class a user may have.

Copied next to the weights by `save_pretrained` (through generation_multi_token.py): imports only torch, transformers
and `from .module import Name`.
"""


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
