"""Checkers for the book's exercises: run a learner's function on hidden cases, say what went wrong.

Each exercise notebook (exercises/chNN_*.ipynb) gives a function stub with a TODO and, right after
it, a cell such as ``check_residual(residual)``. The checker calls the learner's function on cases
the learner cannot see, compares every answer with specbook's own reference (the package's
functions, `specbook.Sampler`, the decoding loops and drafters run on tiny random models, or a
one-line formula written here where the package has none), and prints one line:

- ``✓ residual: all 10 cases pass.``, or
- ``✗ residual, case 7 of 10 (q == p): got NaN. ...``: the first case that failed, what was
  expected and what came back, often with the likely mistake named.

A checker never raises and never shows a stack trace: an exception from the learner's code
(NotImplementedError from an untouched stub included) becomes one line too. The cases are fixed
(seeded), so a notebook prints the same thing every run and nbval can compare outputs; none
depends on the weights of the book's trained pair.

Tests and tools can ask for the verdict instead of the printout: ``check_residual.outcome(fn)``
returns an :class:`Outcome` (passed, message). `CHECKS` lists every checker by name. One module
per chapter holds its checkers (`ch01` … `ch07`, `ch04b`, `ch06b`, `ch06c`; chapter 6's are split between `ch06`,
building a tree, and `ch06_verification`, verifying one, chapter 6b's between `ch06b` and `ch06b_eagle3`, EAGLE-3's
mask and vocabulary, chapter 6c's between `ch06c` and `ch06c_pard`, PARD's training mask); `core` holds the
machinery they share and `tiny` the tiny models of the decoding exercises.

Notation as everywhere in the book: q is the target's distribution (`target_probs`), p the
draft's (`draft_probs`), K the draft length (`k`), alpha the acceptance rate and c the cost ratio
(`cost_ratio`).
"""

from __future__ import annotations

from .ch01 import check_greedy_generate, check_softmax, check_step_cost, check_warped_probs
from .ch02 import (check_accept_draft, check_acceptance_rate, check_residual, check_shortcut_bias,
                   check_shortcut_output, check_verify_chain)
from .ch03 import (check_estimate_alpha, check_optimal_k, check_speedup, check_tokens_per_step,
                   check_tokens_per_step_by_index)
from .ch04 import (check_acceptance_from_steps, check_rollback_cache, check_rollback_counts,
                   check_speculative_greedy)
from .ch04b import check_encoder_decoder_speedup, check_greedy_seq2seq, check_seq2seq_rollback, check_shift_right
from .ch05 import check_fresh_draw_output, check_heuristic_next_k, check_ngram_draft, check_prompt_lookup
from .ch06 import check_medusa_tree, check_tree_mask, check_tree_position_ids
from .ch06_verification import check_no_residual_output, check_tree_tokens_per_call, check_verify_tree_greedily
from .ch06b import check_collect_ngrams, check_jacobi_step, check_self_speculative_speedup, check_window_parents
from .ch06b_eagle3 import check_draft_distribution, check_ttt_mask
from .ch06c import check_blockwise_accept, check_cape_siblings, check_multi_token_loss, check_phrases_after
from .ch06c_pard import check_pard_mask
from .ch07 import check_accept_rows, check_batch_k, check_left_pad, check_row_positions
from .core import FAIL, PASS, Case, Check, Outcome

CHECKS: dict[str, Check] = {check.name: check for check in (
    check_softmax, check_warped_probs, check_greedy_generate, check_step_cost,
    check_accept_draft, check_residual, check_verify_chain, check_acceptance_rate,
    check_shortcut_output, check_shortcut_bias,
    check_tokens_per_step, check_speedup, check_optimal_k, check_estimate_alpha,
    check_tokens_per_step_by_index,
    check_rollback_cache, check_rollback_counts, check_speculative_greedy, check_acceptance_from_steps,
    check_greedy_seq2seq, check_shift_right, check_seq2seq_rollback, check_encoder_decoder_speedup,
    check_fresh_draw_output, check_prompt_lookup, check_ngram_draft, check_heuristic_next_k,
    check_tree_mask, check_tree_position_ids, check_medusa_tree, check_verify_tree_greedily,
    check_no_residual_output, check_tree_tokens_per_call,
    check_jacobi_step, check_window_parents, check_collect_ngrams, check_self_speculative_speedup,
    check_ttt_mask, check_draft_distribution,
    check_blockwise_accept, check_multi_token_loss, check_cape_siblings, check_phrases_after, check_pard_mask,
    check_left_pad, check_row_positions, check_accept_rows, check_batch_k,
)}

__all__ = ["CHECKS", "FAIL", "PASS", "Case", "Check", "Outcome"] + [check.__name__ for check in CHECKS.values()]
