"""KV caches that can be rolled back.

Speculative decoding writes the keys and values of every drafted token into the cache, and must
forget the ones the target rejected. Rolling back is cropping the cache's sequence dimension: the
prefix is never recomputed.
"""

from transformers import DynamicCache


def new_cache(model):
    """An empty cache for ``model`` (grows as tokens are fed)."""
    return DynamicCache()


def rollback(cache, num_tokens: int) -> None:
    """Forget the last ``num_tokens`` positions of ``cache`` (in place)."""
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0 (got {num_tokens})")
    if num_tokens:
        cache.crop(-num_tokens)
