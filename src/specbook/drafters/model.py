"""A small language model as the drafter: Leviathan et al. 2023 and Chen et al. 2023.

The draft model keeps its own KV cache. After a step that drafted K tokens, its cache holds the
context plus the first K - 1 drafts (the K-th was sampled but never fed back). ``update`` crops
the rejected drafts off the cache and queues what the cache has not seen yet -- the K-th draft if
everything was accepted, and always the target's next token -- to be fed in the next ``propose``.
"""

import torch

from ..cache import new_cache, rollback
from .base import Draft, Drafter


class ModelDrafter(Drafter):
    """Draft with a causal LM that shares the target's tokenizer.

    ``vocab_size`` is the width of the logits it drafts from; the engine narrows it to the
    target's when one of the two models pads its embedding matrix with unused rows.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.calls = 0

    @property
    def device(self) -> torch.device:
        return self.model.device

    def start(self, input_ids: torch.Tensor) -> None:
        self.cache = new_cache(self.model)
        if input_ids.shape[1] > 1:
            self.model(input_ids[:, :-1], past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.pending = input_ids[0, -1:].tolist()  # context tokens the cache has not seen yet
        self.proposed = []  # this step's drafts
        self.calls = 0

    def propose(self, k, sampler, generator, keep_drafting=None):
        tokens, probs = [], []
        inputs = torch.tensor([self.pending], device=self.device)  # (1, n)
        for _ in range(k):
            logits = self.model(inputs, past_key_values=self.cache, use_cache=True,
                                logits_to_keep=1).logits[0, -1, : self.vocab_size]  # (vocab,)
            step_probs = sampler.probs(logits)  # (vocab,): the warped p, what verification uses
            token = sampler.sample(step_probs, generator)  # ()
            tokens.append(token)
            probs.append(step_probs)
            if keep_drafting is not None and not keep_drafting(logits.float().softmax(-1)):  # its own confidence
                break
            inputs = token.view(1, 1)
        self.calls += len(tokens)
        self.pending = []
        draft = Draft(torch.stack(tokens), torch.stack(probs))  # (k,), (k, vocab)
        self.proposed = draft.tokens.tolist()
        return draft

    def update(self, num_accepted, next_token):
        in_cache = max(len(self.proposed) - 1, 0)  # the last draft was sampled, never fed
        rollback(self.cache, in_cache - min(num_accepted, in_cache))
        self.pending += self.proposed[in_cache:num_accepted] + [next_token]
        self.proposed = []
