"""A small language model as the drafter: Leviathan et al. 2023 and Chen et al. 2023.

The draft model keeps its own KV cache. After a step that drafted K tokens, its cache holds the
context plus the first K - 1 drafts (the K-th was sampled but never fed back). ``update`` rolls
the rejected drafts off the cache and queues what the cache has not seen yet -- the K-th draft if
everything was accepted, and always the target's next token -- to be fed in the next ``propose``.
Drafts stay on the model's device: drafting K tokens never waits for the GPU (unless a
``keep_drafting`` policy must read the draft's confidence), and with ``cache="static"`` on a GPU the K
draft steps are one replayed CUDA graph (`specbook.graphs.StaticModel.chain`), its kernels compiled with
``compile=True``. There the next step's chain can even be queued before the host reads this step's
outcome (`ModelDrafter.draft_ahead`), so that the GPU goes from one step to the next without waiting
for the host's bookkeeping in between.
"""

import torch

from ..cache import check_cache_options, rollback
from ..decoder import cache_and_forward
from ..graphs import prefill, static_model
from ..models import SHARED_ENCODER, check_pair, check_token_ids, embedding_rows, vocab_size
from ..seq2seq import EncoderDecoderView, encode, is_encoder_decoder
from .base import Draft, Drafter

ENCODERS = ("own", "target")  # an encoder-decoder draft's encoder states: its own encoder's, or the target's
DRAFT_ROOM = 256  # a new cache's room after the prompt; it grows when a generation needs more


class ModelDrafter(Drafter):
    """Draft with a causal LM that shares the target's tokenizer.

    ``vocab_size`` is the width of the logits it drafts from; the engine narrows it to the
    target's when one of the two models pads its embedding matrix with unused rows. ``cache`` is
    "dynamic" or "static" (pre-allocated for ``max_length`` tokens, by default the model's
    context), kept between generations; ``compile=True`` (static caches only) compiles the draft step.
    ``encoder`` is for an encoder-decoder draft (`read_encoder`).
    """

    def __init__(self, model: torch.nn.Module, cache: str = "dynamic", compile: bool = False,
                 max_length: int | None = None, encoder: str = "own"):
        check_cache_options(cache, compile)
        if encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {ENCODERS} (got {encoder!r})")
        self.model, self.seq2seq, self.encoder = model, model, encoder
        self.static_length = (max_length or model.config.max_position_embeddings) if cache == "static" else None
        self.compile = compile
        self.vocab_size = vocab_size(model)
        self.calls = 0

    @classmethod
    def for_pair(cls, pair, **options):
        """The draft of a `specbook.models.ModelPair`, reading the target's encoder states where the draft was
        trained on them (the built-in encoder-decoder pair); ``options`` as for the constructor."""
        return cls(pair.draft, encoder="target" if pair.name in SHARED_ENCODER else "own", **options)

    def read_encoder(self, encoder_outputs, input_ids, attention_mask):
        """Draft with this encoder-decoder model's decoder, over the target's encoder states (``encoder="target"``,
        distil-whisper's recipe: its decoder was trained on them, and the encoder runs once for both) or over
        its own encoder's (``encoder="own"``, the default)."""
        if self.encoder == "target":
            width = encoder_outputs.last_hidden_state.shape[-1]
            if width != self.seq2seq.config.d_model:
                raise ValueError(f"the draft reads the target's encoder states (encoder='target'), which are {width} "
                                 f"wide, but its decoder's cross-attention reads {self.seq2seq.config.d_model}: "
                                 "use encoder='own'")
        else:
            encoder_outputs = encode(self.seq2seq, input_ids, attention_mask)
        self.model = EncoderDecoderView(self.seq2seq, encoder_outputs, attention_mask)

    @property
    def device(self) -> torch.device:
        return self.model.device

    def start(self, input_ids: torch.Tensor) -> None:
        check_token_ids(input_ids, self.model, "the prompt (for the draft model)")
        if self.static_length is None:  # a new cache, and what runs the model over it (`specbook.decoder`)
            self.cache, self.call = cache_and_forward(self.model, input_ids.shape[1] + DRAFT_ROOM)
            self.forward = None
        else:  # the model's static cache for drafting, emptied, and the runner that replays its steps
            self.forward = static_model(self.model, self.static_length, "draft", self.compile)
            self.cache, self.call = self.forward.start(), self.forward.eager
        self.readable = embedding_rows(self.model)  # the token ids it can read (looked up once: a walk of modules)
        self.pending = prefill(self.model, self.cache, input_ids, runner=self.forward)[0]  # (n,): not in the cache
        self.proposed = self.pending[:0]  # (K,): this step's drafts
        self.last_fed = self.pending  # (1,): the context's last token, which the first draft follows
        self.ahead = None  # the next step's `Draft`, made before the host read this step's outcome
        self.calls = 0

    def propose(self, k, sampler, generator, keep_drafting=None):
        if self.ahead is not None:  # drafted during the last step (`draft_ahead`), for this k
            draft, self.ahead = self.ahead, None
            return self._drafted(draft.tokens, draft.probs)
        pending, self.pending, self.last_fed = self.pending, self.pending[:0], self.pending[-1:]
        if keep_drafting is None and self.forward is not None and self.forward.replays:  # K steps, one replay
            return self._drafted(*self.forward.chain(pending, k, sampler, self.vocab_size, generator))
        tokens, probs = [], []
        inputs = pending[None]  # (1, n)
        for _ in range(k):
            if self.forward is None:
                logits = self.call(inputs, past_key_values=self.cache, use_cache=True, logits_to_keep=1).logits[0]
            else:
                logits = self.forward(inputs)[0]  # (n, vocab)
            logits = logits[-1, : self.vocab_size]  # (vocab,)
            token, step_probs = sampler.pick(logits, generator)  # (), on the device; the warped p, or None (greedy)
            tokens.append(token)
            probs.append(step_probs)
            if keep_drafting is not None and not keep_drafting(logits.float().softmax(-1)):  # its own confidence
                break
            inputs = token.view(1, 1)
        return self._drafted(torch.stack(tokens), None if sampler.greedy else torch.stack(probs))

    def _drafted(self, tokens, probs) -> Draft:
        """The step's `Draft` of ``tokens`` (k,) with their distributions (k, vocab), or None (greedy)."""
        self.calls += len(tokens)
        self.proposed = tokens
        return Draft(tokens, probs)

    def draft_ahead(self, outcome, k, sampler, generator) -> bool:
        """Queue the next step's chain of ``k`` drafts now, behind this step's verification, before the host has
        read its ``outcome`` (2,) on the device: [number accepted, next token].

        The host's work between two steps (reading the outcome, rolling the target back, the engine's
        bookkeeping, launching the next chain) would otherwise leave the GPU idle. The draft's cache rolls back
        on the device, to the context and the accepted drafts but the last committed token, which the chain
        reads again with the next token: two tokens whatever was accepted, one graph. `update` then only checks
        the next token; `propose` returns this draft. Only a draft model whose chain replays does it (not a
        subclass that drafts its own way); returns whether it did.
        """
        if (type(self).propose is not ModelDrafter.propose or type(self).update is not ModelDrafter.update
                or self.forward is None or not self.forward.replays or not len(self.proposed)):
            return False
        accepted = outcome[:1]  # (1,)
        last = torch.cat([self.last_fed, self.proposed]).gather(0, accepted)  # (1,): the token before the next
        next_token = outcome[1:].clamp(max=self.readable - 1)  # (1,); one it lacks: `update` refuses
        pending = torch.cat([last, next_token])  # (2,)
        rollback(self.cache, len(self.proposed) - accepted[0])  # the cache held the context and n - 1 drafts
        self.last_fed = pending[1:]
        self.ahead = Draft(*self.forward.chain(pending, k, sampler, self.vocab_size, generator))
        return True

    def _check_readable(self, token: int) -> None:
        """Refuse a target token beyond the draft's embedding: a padding row only a wider target has."""
        if token >= self.readable:
            raise ValueError(f"the target emitted token {token}, a padding row of its vocabulary that the draft "
                             f"model's embedding ({self.readable} rows) cannot read: draft with a model whose "
                             "embedding covers the target's tokens")

    def update(self, num_accepted, next_token):
        self._check_readable(next_token)
        if self.ahead is not None:  # the cache and the next drafts moved on already, on the device
            return
        in_cache = max(len(self.proposed) - 1, 0)  # the last draft was sampled, never fed
        rollback(self.cache, in_cache - min(num_accepted, in_cache))
        next_token = torch.full((1,), next_token, dtype=self.proposed.dtype, device=self.proposed.device)
        self.pending = torch.cat([self.pending, self.proposed[in_cache:num_accepted], next_token])
        self.proposed = self.proposed[:0]


def as_drafter(drafter, target, cache="dynamic", compile=False, max_length=None) -> Drafter:
    """``drafter`` ready to draft for ``target``: a model becomes a `ModelDrafter` (with the engine's ``cache``,
    ``compile`` and ``max_length``), and a drafter that cannot serve this target is refused."""
    if isinstance(drafter, torch.nn.Module):
        drafter = ModelDrafter(drafter, cache, compile, max_length)
    if not isinstance(drafter, Drafter):
        raise ValueError(f"drafter must be a Drafter (e.g. ModelDrafter(draft_model)) or a model "
                         f"(got {type(drafter).__name__})")
    if isinstance(drafter, ModelDrafter):
        if is_encoder_decoder(drafter.model) != is_encoder_decoder(target):
            kinds = ["an encoder-decoder model" if is_encoder_decoder(m) else "decoder-only" for m in (drafter.model,
                                                                                                    target)]
            raise ValueError(f"the draft model ({type(drafter.model).__name__}) is {kinds[0]} and the target is "
                             f"{kinds[1]}: draft with a model of the target's kind that shares its tokenizer")
        check_pair(target, drafter.model)
        drafter.vocab_size = min(vocab_size(target), vocab_size(drafter.model))
    if drafter.uses_features and getattr(drafter, "target", target) is not target:
        raise ValueError(f"{type(drafter).__name__} reads the features of another model than this target: "
                         "build it on the target you verify with")
    return drafter
