"""The demo's byte-level BPE tokenizer: 16 specials, 256 bytes, then word merges."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import numpy.typing as npt

from realtime.demo.checkpoint.config import NUM_SPECIALS, PAD, VOCAB_SIZE, word_list

Vocab = dict[str, int]
Merges = list[tuple[str, str]]

_WORDS = word_list(
    "the and you that what this have with your for are can not just know like yes okay "
    "right so well good time here there how about would could think really want need "
    "today maybe hello thanks please sure great sound voice talk say tell hear play call "
    "help make take look come see work day one two three four five world weather music "
    "question answer morning evening friend happy thing people little"
)

SPECIAL_TOKENS_MAP = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "pad_token": f"<SPECIAL_{PAD}>",
    "unk_token": "<unk>",
}
"""``special_tokens_map.json``."""


def byte_alphabet() -> list[str]:
    """The byte-level BPE alphabet: one printable character per byte value, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def tokenizer_tables() -> tuple[Vocab, Merges]:
    """Vocabulary and merges: 16 specials, 256 bytes, then word merges up to 512."""
    alphabet = byte_alphabet()
    vocab: Vocab = {}
    for i in range(NUM_SPECIALS):
        name = {0: "<unk>", 1: "<s>", 2: "</s>"}.get(i, f"<SPECIAL_{i}>")
        vocab[name] = i
    for b, char in enumerate(alphabet):
        vocab[char] = NUM_SPECIALS + b
    merges: Merges = []
    space = alphabet[ord(" ")]
    for word in _WORDS:
        for form in (space + word, word):
            current = form[0]
            for char in form[1:]:
                merged = current + char
                if len(vocab) >= VOCAB_SIZE:
                    return vocab, merges
                if merged not in vocab:
                    vocab[merged] = len(vocab)
                    merges.append((current, char))
                current = merged
    if len(vocab) != VOCAB_SIZE:
        raise AssertionError(f"tokenizer has {len(vocab)} entries, expected {VOCAB_SIZE}")
    return vocab, merges


def tokenizer_json(vocab: Vocab, merges: Merges) -> str:
    """``tokenizer.json``, built by the ``tokenizers`` library itself."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    specials = sorted((i, t) for t, i in vocab.items() if i < NUM_SPECIALS)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for _, t in specials]
    )
    text: str = tokenizer.to_str(pretty=True)
    # Normalise through json so key order and spacing never depend on the library version.
    return json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def tokenizer_config(vocab: Vocab) -> dict[str, Any]:
    """``tokenizer_config.json``: what ``transformers`` needs to load ``tokenizer.json``."""
    return {
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t, i in sorted(vocab.items(), key=lambda item: item[1])
            if i < NUM_SPECIALS
        },
        "bos_token": "<s>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "model_max_length": 131072,
        "pad_token": f"<SPECIAL_{PAD}>",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
    }


def readable_token_ids(vocab: Vocab) -> npt.NDArray[np.bool_]:
    """Tokens that decode to plain ASCII words or punctuation (not specials or raw bytes)."""
    alphabet = byte_alphabet()
    decode = {char: b for b, char in enumerate(alphabet)}
    readable = np.zeros(VOCAB_SIZE, dtype=np.bool_)
    for token, index in vocab.items():
        if index < NUM_SPECIALS:
            continue
        data = bytes(decode[c] for c in token)
        text = data.decode("ascii", errors="replace")
        if all(c.isalnum() or c in " .,?!'" for c in text):
            readable[index] = True
    return readable
