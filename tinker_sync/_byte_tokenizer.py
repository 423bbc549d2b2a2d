"""The built-in byte-level tokenizer ``tinker-sync/byte``, built in memory (nothing downloaded).

Usage::

    from tinker_sync._byte_tokenizer import build_byte_tokenizer

    tok = build_byte_tokenizer()
    tok.encode("héllo").ids == list("héllo".encode("utf-8"))   # id == byte value
    tok.decode([104, 105, 256], skip_special_tokens=False) == "hi<|endoftext|>"

Layout (the same as ``tinker_sync.local.backends.base``, which the local server uses):

* ids 0..255 are the raw UTF-8 bytes of the text, so ``decode(encode(s)) == s`` for every
  Python string that is valid UTF-8 (no lone surrogates);
* 256 is ``<|endoftext|>`` (EOS), 257 ``<|bos|>`` (BOS), 258 ``<|pad|>`` (PAD); vocabulary 259.

Decisions:

* ``add_special_tokens=True`` adds nothing: there is no post-processor, so ``encode`` gives
  exactly the bytes of the text whatever the flag says. Put :data:`BOS_TOKEN_ID` /
  :data:`EOS_TOKEN_ID` in yourself where a model wants them.
* Text is always bytes: the strings ``"<|endoftext|>"``, ``"<|bos|>"`` and ``"<|pad|>"`` inside
  the input encode as their bytes, never as the special ids (``encode_special_tokens`` is set
  when the tokenizer is built), so no text can forge an EOS. Special ids only come from ids.
* Decoding bytes that are not valid UTF-8 gives U+FFFD for the bad sequence.

Thread safety: every call returns a new ``tokenizers.Tokenizer``; configure it before sharing
it, then only call encode/decode on it. Fork safety: plain in-memory data.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

__all__ = [
    "BOS_TOKEN",
    "BOS_TOKEN_ID",
    "BYTE_TOKENIZER_ID",
    "BYTE_VOCAB_SIZE",
    "EOS_TOKEN",
    "EOS_TOKEN_ID",
    "PAD_TOKEN",
    "PAD_TOKEN_ID",
    "build_byte_tokenizer",
    "tokenizer_config",
]

#: The tokenizer id the local backends report in ``get_info.model_data.tokenizer_id``.
BYTE_TOKENIZER_ID = "tinker-sync/byte"
EOS_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|bos|>"
PAD_TOKEN = "<|pad|>"
EOS_TOKEN_ID = 256
BOS_TOKEN_ID = 257
PAD_TOKEN_ID = 258
#: Bytes plus the three special tokens (``len(tokenizer)``); the base vocabulary is 256.
BYTE_VOCAB_SIZE = 259

#: The ``tokenizer_config.json`` equivalent of the byte tokenizer (what TinkerTokenizer reads).
tokenizer_config: dict[str, Any] = {
    "bos_token": BOS_TOKEN,
    "eos_token": EOS_TOKEN,
    "pad_token": PAD_TOKEN,
    "chat_template": None,
}


def _byte_to_unicode() -> dict[int, str]:
    """The byte-level alphabet: one printable character per byte (GPT-2 convention).

    The ``ByteLevel`` pre-tokenizer rewrites each UTF-8 byte of the input as this character and
    the ``ByteLevel`` decoder maps it back; the model then gives each character its byte value.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\N{INVERTED EXCLAMATION MARK}"), ord("\N{NOT SIGN}") + 1),
        *range(ord("\N{REGISTERED SIGN}"), ord("\N{LATIN SMALL LETTER Y WITH DIAERESIS}") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


def build_byte_tokenizer() -> Tokenizer:
    """Build a new ``tokenizers.Tokenizer`` for ``tinker-sync/byte`` (see the module docstring).

    Returns a fresh instance on every call; ``tinker_sync.tokenizer`` caches one per process.
    """
    alphabet = _byte_to_unicode()
    if set(alphabet.values()) != set(pre_tokenizers.ByteLevel.alphabet()):
        raise RuntimeError(
            "tokenizers' byte-level alphabet changed; the byte tokenizer needs fixing"
        )
    vocab = {char: byte for byte, char in alphabet.items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # One "word" per input (no regex split): every byte stays its own token whatever the text.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    added = tokenizer.add_special_tokens(
        [
            AddedToken(content, special=True, normalized=False)
            for content in (EOS_TOKEN, BOS_TOKEN, PAD_TOKEN)
        ]
    )
    if added != 3 or tokenizer.token_to_id(EOS_TOKEN) != EOS_TOKEN_ID:
        raise RuntimeError("unexpected special-token layout in the byte tokenizer")
    # Special-token strings inside the text are encoded as plain bytes.
    tokenizer.encode_special_tokens = True
    return tokenizer
