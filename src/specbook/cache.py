"""KV caches that can be rolled back.

Speculative decoding writes the keys and values of every drafted token into the cache, and must
forget the ones the target rejected. Rolling back is cropping the cache's sequence dimension: the
prefix is never recomputed. Tree verification (`specbook.trees`) feeds every branch of a token
tree at once; afterwards the cache keeps the prefix and the accepted path only (`keep_positions`).
"""

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def new_cache(model):
    """An empty cache for ``model`` (grows as tokens are fed)."""
    return DynamicCache()


def rollback(cache, num_tokens: int) -> None:
    """Forget the last ``num_tokens`` positions of ``cache`` (in place)."""
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0 (got {num_tokens})")
    if num_tokens:
        cache.crop(-num_tokens)


def keep_positions(cache, positions) -> None:
    """Keep only ``positions`` (increasing indices along the sequence) of ``cache``, in place.

    After a tree pass over [prefix, root, nodes...], the positions of the prefix, the root and the
    accepted nodes. Works on `DynamicCache` layers (keys and values (batch, heads, seq, head_dim)).
    """
    positions = torch.as_tensor(positions, dtype=torch.long)  # (m,)
    length = cache.get_seq_length()
    if positions.ndim != 1 or (positions.numel() and (positions[0] < 0 or positions[-1] >= length
                                                      or (positions.diff() <= 0).any())):
        raise ValueError(f"positions must be increasing indices in [0, {length}) (got {positions.tolist()})")
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise ValueError(f"keep_positions needs DynamicLayer cache layers (got {type(layer).__name__})")
        if layer.is_initialized:
            layer.keys = layer.keys.index_select(-2, positions.to(layer.keys.device))
            layer.values = layer.values.index_select(-2, positions.to(layer.values.device))
