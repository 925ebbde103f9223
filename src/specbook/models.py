"""Loading a target/draft model pair.

``load_pair("shakespeare")`` returns the built-in pair that ships inside the package (trained by
`specbook.train` on Shakespeare's plays): no network, fp32 on the CPU, a couple of seconds.
``load_pair(target="org/name", draft="org/name")`` loads any Hugging Face causal LM pair that
shares a tokenizer -- an explicit opt-in, for a GPU on Colab.
"""

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

BUILT_IN = ("shakespeare",)


@dataclass
class ModelPair:
    """A target model (whose distribution q the output follows), a draft model (p) and their tokenizer."""

    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object
    name: str

    def encode(self, text: str) -> torch.Tensor:
        """Text -> a (1, T) tensor of token ids on the target's device."""
        return self.tokenizer(text, return_tensors="pt").input_ids.to(self.target.device)


def assets_dir(name: str = "shakespeare") -> Path:
    """Where a built-in pair's files live inside the installed package."""
    return Path(resources.files("specbook")) / "assets" / name


def _resolve(device, dtype):
    device = torch.device(device if device is not None else "cpu")
    if dtype is None:
        dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    return device, dtype


def load_pair(name: str | None = None, *, target: str | None = None, draft: str | None = None,
              device=None, dtype=None) -> ModelPair:
    """Load a model pair in eval mode.

    Either a built-in pair by ``name`` (``"shakespeare"``), a pair that ``python -m specbook.train
    --out DIR`` wrote (``name=DIR``: a tokenizer, ``target/`` and ``draft/``), or two Hugging Face hub
    models by id (``target=``, ``draft=``). ``device`` defaults to the CPU and ``dtype`` to float32
    there (bfloat16 on a GPU).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device, dtype = _resolve(device, dtype)
    if (target is None) != (draft is None):
        raise ValueError("give both target= and draft= (Hugging Face model ids), or neither")
    if target is None:
        name = str(name or "shakespeare")
        trained = Path(name)
        if name not in BUILT_IN and not ((trained / "target").is_dir() and (trained / "draft").is_dir()):
            raise ValueError(f"name must be one of the built-in pairs {list(BUILT_IN)} or a directory written by "
                             f"specbook.train (got {name!r}); for a Hugging Face pair pass target= and draft=")
        root = assets_dir(name) if name in BUILT_IN else trained
        tokenizer = AutoTokenizer.from_pretrained(root)
        models = [AutoModelForCausalLM.from_pretrained(root / part, dtype=dtype) for part in ("target", "draft")]
    else:
        if name is not None:
            raise ValueError("give either a built-in pair name or target=/draft=, not both")
        name = f"{target} / {draft}"
        try:
            tokenizer = AutoTokenizer.from_pretrained(target)
            draft_tokenizer = AutoTokenizer.from_pretrained(draft)
            models = [AutoModelForCausalLM.from_pretrained(model_id, dtype=dtype) for model_id in (target, draft)]
        except OSError as error:
            raise OSError(f"could not load {name} from the Hugging Face hub ({error}). Loading a hub pair "
                          "needs a network connection (or a local copy in the cache) and the exact model ids.") from error
        if tokenizer.get_vocab() != draft_tokenizer.get_vocab():
            raise ValueError(f"target and draft must share a tokenizer: {target} and {draft} have different vocabularies")
    target_model, draft_model = (model.to(device).eval() for model in models)
    return ModelPair(target_model, draft_model, tokenizer, name)
