"""Attention masks a Hugging Face causal LM takes in place of its own.

Two callers feed rows that the model's own causal mask cannot describe: a token tree (each node sees
its ancestors only, `specbook.trees`) and a batch of ragged rows (padding and rejected drafts
sit between a row's tokens, `specbook.ragged`). Both say which keys each new row may see and at
which position every row and key sits; `attention_inputs` turns that into the model's inputs.

A custom mask replaces the model's own, sliding window included. So when the model's ``config`` has
sliding-window layers (`specbook.cache.attention_windows`), a row at position i also hides the keys at
positions <= i - W, as the model's mask would; and when its layers differ (Gemma 2 and 3, Qwen2: full
and sliding), the mask is a dict with one mask per kind of layer, keyed like the model's
``config.layer_types``, which those models accept. transformers 5 passes a 4D mask through unchanged
(`masking_utils._preprocess_mask_arguments`), and both the eager and the SDPA attention add a float
mask to the scores.
"""

import torch

from .cache import attention_windows


def attention_inputs(visible: torch.Tensor, positions: torch.Tensor, key_positions: torch.Tensor,
                     dtype=torch.float32, device=None, config=None) -> dict:
    """``attention_mask`` and ``position_ids`` for a call that feeds ``rows`` new positions.

    ``visible`` (batch, rows, keys) bool: may row i see key j (the keys are the cache's, then the new
    rows'); ``positions`` (batch, rows) the new rows' position ids; ``key_positions`` (batch, keys) the
    keys' positions, for the sliding window. Returns ``attention_mask`` (batch, 1, rows, keys), a float
    mask (0 = visible, the dtype's minimum = hidden) or a dict of them per kind of layer, and
    ``position_ids`` (batch, rows).
    """

    def mask(window):
        shown = visible if window is None else visible & (key_positions[:, None] > positions[..., None] - window)
        float_mask = torch.zeros(shown.shape, dtype=dtype).masked_fill(~shown.cpu(), torch.finfo(dtype).min)
        return float_mask[:, None].to(device)  # (batch, 1, rows, keys)

    windows = set(attention_windows(config)) if config is not None else {None}
    if len(windows) == 1:
        attention_mask = mask(windows.pop())
    else:
        attention_mask = {"full_attention" if window is None else "sliding_attention": mask(window)
                          for window in windows}
    return dict(attention_mask=attention_mask, position_ids=positions.to(device))
