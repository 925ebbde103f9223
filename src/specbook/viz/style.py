"""Colours, and the input checks and labels that the figures share."""

import numpy as np
import torch

from ..rejection import check_distribution


# One palette for the whole book: accepted / residual (corrected) / rejected / target / draft.
COLORS = {
    "accepted": "#4C78A8",  # area 1: min(p, q)
    "residual": "#F58518",  # area 2: (q - p)+
    "rejected": "#B0B0B0",  # (p - q)+: drafted, then rejected
    "target": "#000000",
    "draft": "#E45756",
}


SERIES = ["#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#72B7B2", "#9D755D"]


def _as_distribution(probs, name: str) -> np.ndarray:
    """A 1-D probability vector as float64 numpy, or ValueError naming the argument."""
    tensor = torch.as_tensor(probs, dtype=torch.float64)
    if tensor.ndim != 1:
        raise ValueError(f"{name} must be a 1-D probability vector (got shape {tuple(tensor.shape)})")
    check_distribution(tensor, name)
    return tensor.numpy()


def _token_labels(tokens, vocab: int) -> list[str]:
    """Token labels for the x axis: the given names, or the token ids."""
    if tokens is None:
        return [str(i) for i in range(vocab)]
    labels = [str(token) for token in tokens]
    if len(labels) != vocab:
        raise ValueError(f"tokens must name every entry of the vocabulary "
                         f"(got {len(labels)} names for {vocab} entries)")
    return labels


def _as_list(values, name: str) -> list[float]:
    """A float or a sequence of floats as a non-empty list."""
    array = np.atleast_1d(np.asarray(values, dtype=float))
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a number or a non-empty 1-D sequence of numbers")
    return array.tolist()


def _as_vector(values, name: str, length: int | None = None) -> np.ndarray:
    """A 1-D float array (None entries become NaN), of ``length`` entries when given."""
    array = np.array([np.nan if value is None else float(value) for value in values], dtype=float)
    if length is not None and len(array) != length:
        raise ValueError(f"{name} must have one entry per step ({length}), got {len(array)}")
    return array


def show_whitespace(text: str) -> str:
    """A token's text with its whitespace made visible, for axis labels: " man" -> "␣man", "\\n" -> "↵"."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")
