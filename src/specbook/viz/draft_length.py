"""Chapter 5: the draft length a policy chose over one generation, with what was accepted."""

import numpy as np
from matplotlib.figure import Figure

from .style import COLORS, SERIES, _as_vector


def draft_length_plot(draft_lengths, accepted, entropies, smoothed=None, *, k_bounds=None,
                      entropy_ref: float | None = None, title: str | None = None):
    """K over one generation, under the draft's entropy: two panels that share the step axis.

    draft_lengths: the tokens drafted at each step (``len(step.drafted)``); accepted: how many
    of them the target kept (``step.accepted``); entropies: the mean entropy of the step's
    draft distributions, in nats (None for a step that drafted nothing); smoothed: optional,
    its moving average as the policy saw it (None where it had none yet). k_bounds: optional
    (gamma_min, gamma_max), drawn as dashed lines; entropy_ref: optional, the entropy at which
    K reaches gamma_min. Returns the Figure.
    """
    lengths = _as_vector(draft_lengths, "draft_lengths")
    if len(lengths) == 0:
        raise ValueError("draft_lengths must have at least one step")
    kept = _as_vector(accepted, "accepted", len(lengths))
    entropy = _as_vector(entropies, "entropies", len(lengths))
    if np.isnan(lengths).any() or (lengths < 0).any():
        raise ValueError("draft_lengths must be counts >= 0")
    if np.isnan(kept).any() or (kept < 0).any() or (kept > lengths).any():
        raise ValueError("accepted must be counts between 0 and the step's draft length")
    if (entropy[~np.isnan(entropy)] < 0).any():
        raise ValueError("entropies must be >= 0 (nats)")
    steps = np.arange(1, len(lengths) + 1)
    fig = Figure(figsize=(9.0, 4.6), layout="constrained")
    entropy_ax, k_ax = fig.subplots(2, 1, sharex=True, height_ratios=[1, 1.2])
    entropy_ax.plot(steps, entropy, "o", color=SERIES[1], markersize=3.5, gid="entropy",
                    label="draft entropy of the step")
    if smoothed is not None:
        entropy_ax.plot(steps, _as_vector(smoothed, "smoothed", len(lengths)), "-", color=SERIES[0],
                        gid="smoothed", label="moving average")
    if entropy_ref is not None:
        entropy_ax.axhline(entropy_ref, color="grey", linestyle=":", linewidth=1, gid="entropy_ref")
    entropy_ax.set_ylabel("entropy (nats)")
    entropy_ax.grid(alpha=0.3)
    entropy_ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    k_ax.bar(steps, lengths, width=0.8, color=COLORS["rejected"], gid="drafted", label="drafted (K)")
    k_ax.bar(steps, kept, width=0.8, color=COLORS["accepted"], gid="accepted", label="accepted")
    if k_bounds is not None:
        for bound in k_bounds:
            k_ax.axhline(bound, color="black", linestyle="--", linewidth=0.8)
    k_ax.set_xlabel("step (one target call each)")
    k_ax.set_ylabel("tokens")
    k_ax.grid(axis="y", alpha=0.3)
    k_ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    if title is not None:
        entropy_ax.set_title(title)
    return fig
