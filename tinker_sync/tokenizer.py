"""Tokenizers for Tinker models: id resolution, a process-wide single-flight cache, an adapter.

Usage::

    from tinker_sync.tokenizer import load_tokenizer, resolve_tokenizer_id

    tok = load_tokenizer("Qwen/Qwen3-8B")                  # downloads tokenizer.json once
    tok = load_tokenizer("tinker-sync/tiny")               # built in, no network
    ids = tok.encode("The weather today is")
    text = tok.decode(ids)
    resolve_tokenizer_id("meta-llama/Llama-3.1-8B")        # the public Llama-3 mirror

Resolution (:func:`resolve_tokenizer_id`, the official SDK's order): a server-provided
tokenizer id, cut at its first ``:``, wins and skips every rule below. Otherwise the model name
is cut at its first ``:``; ``meta-llama/Llama-3*`` maps to
``thinkingmachineslabinc/meta-llama-3-instruct-tokenizer``, ``org/model/variant`` to
``org/model``, anything else to itself. A model name that is a local directory (servers
that serve local checkpoints send no tokenizer id) loads ``tokenizer.json`` (and
``tokenizer_config.json`` / ``chat_template.jinja``) from it and is never rewritten into a Hub
id. Ids under ``tinker-sync/`` are built in
(``tinker-sync/byte``; the local model names ``tinker-sync/tiny`` and ``tinker-sync/instant``
resolve to it). ``TML/...`` and ``thinkingmachines/...`` ids and the Kimi models that need
``trust_remote_code`` cannot be loaded without ``transformers`` and raise
:class:`~tinker_sync.exceptions.TokenizerLoadError` saying what to do instead.

Loading uses the ``tokenizers`` package, not ``transformers``: ``Tokenizer.from_pretrained``
(which downloads through ``huggingface_hub``, a dependency of ``tokenizers``) honours
``HF_TOKEN``, ``HF_HOME`` and ``HF_ENDPOINT``; ``tokenizer_config.json`` (special tokens, chat
template; ``chat_template.jinja`` when the config has none) is read through ``huggingface_hub``
when it is importable, otherwise those fields are None. Results are cached per (resolved id, revision) in an LRU of 32 entries; concurrent first
calls for one id share one load, different ids load in parallel, and a failed load reaches every
waiting caller as ``TokenizerLoadError`` and is not cached.

Thread safety: every function here may be called from any thread. Fork safety: an at-fork hook
gives the child a fresh lock and in-flight table (cached tokenizers are kept).
"""

from __future__ import annotations

import importlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, overload

from tokenizers import Tokenizer

from tinker_sync import _byte_tokenizer
from tinker_sync._lazynp import is_ndarray, is_np_integer
from tinker_sync._runtime.redact import register_secret
from tinker_sync.exceptions import TokenizerLoadError

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "CACHE_SIZE",
    "LLAMA3_TOKENIZER_ID",
    "TinkerTokenizer",
    "TokenizerLoader",
    "load_tokenizer",
    "resolve_tokenizer_id",
    "set_tokenizer_loader",
]

#: Entries kept by the process-wide tokenizer cache.
CACHE_SIZE = 32
#: Public, ungated mirror of the Llama-3 instruct tokenizer used for ``meta-llama/Llama-3*``.
LLAMA3_TOKENIZER_ID = "thinkingmachineslabinc/meta-llama-3-instruct-tokenizer"

_BUILTIN_PREFIX = "tinker-sync/"
#: Built-in ids and local model names -> the built-in tokenizer they use.
_BUILTIN_ALIASES: dict[str, str] = {
    _byte_tokenizer.BYTE_TOKENIZER_ID: _byte_tokenizer.BYTE_TOKENIZER_ID,
    "tinker-sync/tiny": _byte_tokenizer.BYTE_TOKENIZER_ID,
    "tinker-sync/instant": _byte_tokenizer.BYTE_TOKENIZER_ID,
}
_TML_PREFIXES = ("TML/", "thinkingmachines/")
#: Models whose official tokenizer is Python code from the repo (``trust_remote_code=True``):
#: model id -> (repository, pinned revision). Source: docs/design/protocol.md#tokenizer-resolution.
_REMOTE_CODE_PINS: dict[str, tuple[str, str]] = {
    "moonshotai/Kimi-K2-Thinking": (
        "moonshotai/Kimi-K2-Thinking",
        "612681931a8c906ddb349f8ad0f582cb552189cd",
    ),
    "moonshotai/Kimi-K2.5": ("moonshotai/Kimi-K2.5", "4d01dfe0332d63057c186e0b262165819efb6611"),
    "moonshotai/Kimi-K2.5-Text-Only": (
        "moonshotai/Kimi-K2.5",
        "4d01dfe0332d63057c186e0b262165819efb6611",
    ),
    "moonshotai/Kimi-K2.6": ("moonshotai/Kimi-K2.6", "b5aabbfb20227ed42becbf5541dbffd213942c58"),
    "moonshotai/Kimi-K3": ("moonshotai/Kimi-K3", "f831ab66814297da540d832a5235f8e904f29d06"),
}
#: tokenizer_config.json keys holding one special token, in HF's ``all_special_tokens`` order.
_SPECIAL_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


# --------------------------------------------------------------------------------------------
# Resolution
# --------------------------------------------------------------------------------------------


def resolve_tokenizer_id(model_name: str, server_tokenizer_id: str | None = None) -> str:
    """Return the tokenizer id used for ``model_name`` (never raises for a string).

    A name (or server id) that is an existing local directory is returned unchanged.

    ``server_tokenizer_id`` is ``get_info().model_data.tokenizer_id`` (None or "" when the
    server sent none; a SamplingClient has none). See the module docstring for the rules.
    """
    for candidate in (server_tokenizer_id, None if server_tokenizer_id else model_name):
        if candidate and os.path.isdir(candidate):
            return candidate  # a local directory: a path, never rewritten into a Hub id
    if server_tokenizer_id:
        tokenizer_id = server_tokenizer_id.split(":", 1)[0]
    else:
        name = model_name.split(":", 1)[0]
        if name.startswith("meta-llama/Llama-3"):
            tokenizer_id = LLAMA3_TOKENIZER_ID
        elif name.count("/") == 2:
            org, model, _variant = name.split("/")
            tokenizer_id = f"{org}/{model}"
        else:
            tokenizer_id = name
    return _BUILTIN_ALIASES.get(tokenizer_id, tokenizer_id)


def _check_loadable(tokenizer_id: str) -> None:
    """Raise TokenizerLoadError for ids this package cannot load, explaining why."""
    if tokenizer_id.startswith(_TML_PREFIXES):
        raise TokenizerLoadError(
            f"tokenizer {tokenizer_id!r} is a Thinking Machines tokenizer, served only through "
            "the tml_tokenizers package, which tinker_sync does not use. Build a renderer with "
            "the tml_renderers package instead (`pip install tml_renderers`)"
        )
    pin = _REMOTE_CODE_PINS.get(tokenizer_id)
    if pin is not None:
        repo, revision = pin
        raise TokenizerLoadError(
            f"tokenizer {tokenizer_id!r} is Python code in the model repository (it needs "
            "trust_remote_code=True), and tinker_sync loads tokenizers with the `tokenizers` "
            "package only. Load it with transformers: AutoTokenizer.from_pretrained("
            f"{repo!r}, revision={revision!r}, trust_remote_code=True)"
        )
    if tokenizer_id.startswith(_BUILTIN_PREFIX) and tokenizer_id not in _BUILTIN_ALIASES:
        known = ", ".join(sorted(_BUILTIN_ALIASES))
        raise TokenizerLoadError(
            f"unknown built-in tokenizer {tokenizer_id!r}; built-in ids and models: {known}"
        )
    if not tokenizer_id:
        raise TokenizerLoadError("empty tokenizer id (no model name and no tokenizer id)")


# --------------------------------------------------------------------------------------------
# The adapter
# --------------------------------------------------------------------------------------------


def _token_content(value: object) -> str | None:
    """A special token from tokenizer_config.json: a string or a serialized AddedToken."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        content = value.get("content")
        return content if isinstance(content, str) else None
    return None


def _chat_template(value: object) -> str | None:
    """The raw template: a string, or the ``default`` (else first) of a list of named ones."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = [t for t in value if isinstance(t, Mapping) and isinstance(t.get("template"), str)]
        for entry in named:
            if entry.get("name") == "default":
                return str(entry["template"])
        if named:
            return str(named[0]["template"])
    return None


def _as_id_list(token_ids: Sequence[int] | np.ndarray[Any, Any] | int) -> list[int]:
    if is_ndarray(token_ids):
        if token_ids.ndim > 1:
            raise ValueError(f"expected a 1-D array of token ids, got shape {token_ids.shape}")
        if token_ids.dtype.kind not in "iu":
            raise TypeError(f"token ids must be integers, got dtype {token_ids.dtype}")
        return [int(i) for i in token_ids.reshape(-1).tolist()]
    if isinstance(token_ids, int) or is_np_integer(token_ids):
        return [int(token_ids)]
    return [int(i) for i in token_ids]


def _restore_tinker_tokenizer(
    name_or_path: str,
    backend_json: str,
    encode_special_tokens: bool,
    config: dict[str, Any] | None,
) -> TinkerTokenizer:
    backend = Tokenizer.from_str(backend_json)
    if encode_special_tokens:
        backend.encode_special_tokens = True
    return TinkerTokenizer(backend, name_or_path=name_or_path, config=config)


class TinkerTokenizer:
    """A small adapter over ``tokenizers.Tokenizer`` with the HF fast-tokenizer names we need.

    Usage::

        tok = TinkerTokenizer(tokenizers.Tokenizer.from_file("tokenizer.json"),
                              name_or_path="org/model", config={"eos_token": "</s>"})
        tok.decode(tok.encode("hi"))

    ``config`` is the parsed ``tokenizer_config.json`` (special tokens and ``chat_template``);
    without it the special-token attributes are None and ``all_special_tokens`` lists the
    backend's added tokens marked special. Truncation and padding configured in the backend are
    switched off once, here, before the instance is shared; options are then passed per call.

    Thread safety: safe for concurrent encode/decode from any number of threads (the shared
    ``tokenizers.Tokenizer`` is never mutated after construction). Fork safety: usable in a
    forked child (the Rust library turns its own parallelism off after a fork).
    """

    def __init__(
        self,
        backend: Tokenizer,
        *,
        name_or_path: str,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        if backend.truncation is not None:
            backend.no_truncation()
        if backend.padding is not None:
            backend.no_padding()
        self._backend = backend
        self._name_or_path = name_or_path
        self._config: dict[str, Any] | None = dict(config) if config is not None else None
        cfg = self._config or {}
        specials: dict[str, str | None] = {
            key: _token_content(cfg.get(key)) for key in _SPECIAL_KEYS
        }
        self._specials = specials
        extra: list[str] = []
        for key in ("additional_special_tokens", "extra_special_tokens"):
            value = cfg.get(key)
            items = value.values() if isinstance(value, Mapping) else value
            if isinstance(items, Iterable) and not isinstance(items, (str, bytes)):
                extra.extend(t for t in map(_token_content, items) if t is not None)
        if self._config is not None:
            ordered = [t for t in specials.values() if t is not None] + extra
        else:
            decoder = backend.get_added_tokens_decoder()
            ordered = [decoder[i].content for i in sorted(decoder) if decoder[i].special]
        self._all_special_tokens = list(dict.fromkeys(ordered))
        self._chat_template = _chat_template(cfg.get("chat_template"))

    # -- encode / decode ------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` applies the tokenizer's post-processor."""
        ids: list[int] = self._backend.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def decode(
        self,
        token_ids: Sequence[int] | np.ndarray[Any, Any] | int,
        skip_special_tokens: bool = False,
    ) -> str:
        """Text of ``token_ids`` (a sequence, a 1-D integer numpy array, or one id)."""
        text: str = self._backend.decode(
            _as_id_list(token_ids), skip_special_tokens=skip_special_tokens
        )
        return text

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = True
    ) -> list[list[int]]:
        """``[encode(t) for t in texts]``, computed in parallel by the Rust library."""
        encodings = self._backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [list(e.ids) for e in encodings]

    def batch_decode(
        self,
        sequences: Iterable[Sequence[int] | np.ndarray[Any, Any]],
        skip_special_tokens: bool = False,
    ) -> list[str]:
        """``[decode(s) for s in sequences]``, computed in parallel by the Rust library."""
        texts: list[str] = self._backend.decode_batch(
            [_as_id_list(s) for s in sequences], skip_special_tokens=skip_special_tokens
        )
        return texts

    # -- special tokens -------------------------------------------------------------------

    def _special_id(self, key: str) -> int | None:
        token = self._specials.get(key)
        return None if token is None else self._backend.token_to_id(token)

    @property
    def bos_token(self) -> str | None:
        return self._specials["bos_token"]

    @property
    def eos_token(self) -> str | None:
        return self._specials["eos_token"]

    @property
    def pad_token(self) -> str | None:
        return self._specials["pad_token"]

    @property
    def unk_token(self) -> str | None:
        return self._specials["unk_token"]

    @property
    def bos_token_id(self) -> int | None:
        return self._special_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._special_id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._special_id("pad_token")

    @property
    def unk_token_id(self) -> int | None:
        return self._special_id("unk_token")

    @property
    def all_special_tokens(self) -> list[str]:
        """Special tokens from the config (HF order, then the extra ones), without repeats."""
        return list(self._all_special_tokens)

    @property
    def all_special_ids(self) -> list[int]:
        """Ids of :attr:`all_special_tokens` that the vocabulary knows."""
        ids = (self._backend.token_to_id(t) for t in self._all_special_tokens)
        return [i for i in ids if i is not None]

    # -- vocabulary -----------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Size of the base vocabulary, without added tokens (HF semantics)."""
        size: int = self._backend.get_vocab_size(with_added_tokens=False)
        return size

    def __len__(self) -> int:
        """Size of the full vocabulary, added tokens included."""
        size: int = self._backend.get_vocab_size(with_added_tokens=True)
        return size

    def get_vocab(self) -> dict[str, int]:
        """Token -> id for the full vocabulary (added tokens included); a new dict per call."""
        vocab: dict[str, int] = self._backend.get_vocab(with_added_tokens=True)
        return vocab

    @overload
    def convert_tokens_to_ids(self, tokens: str) -> int | None: ...  # type: ignore[overload-overlap]
    @overload
    def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int | None]: ...
    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int | None] | None:
        """Id of each token; unknown tokens give the unk id (None when there is none)."""
        if isinstance(tokens, str):
            return self._token_to_id(tokens)
        return [self._token_to_id(t) for t in tokens]

    def _token_to_id(self, token: str) -> int | None:
        found: int | None = self._backend.token_to_id(token)
        return self.unk_token_id if found is None else found

    @overload
    def convert_ids_to_tokens(self, ids: int, skip_special_tokens: bool = False) -> str | None: ...
    @overload
    def convert_ids_to_tokens(
        self, ids: Sequence[int] | np.ndarray[Any, Any], skip_special_tokens: bool = False
    ) -> list[str | None]: ...
    def convert_ids_to_tokens(
        self,
        ids: int | Sequence[int] | np.ndarray[Any, Any],
        skip_special_tokens: bool = False,
    ) -> str | list[str | None] | None:
        """Token string of each id (None for an id outside the vocabulary)."""
        if isinstance(ids, int) or is_np_integer(ids):
            token: str | None = self._backend.id_to_token(int(ids))
            return token
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._backend.id_to_token(i) for i in _as_id_list(ids) if i not in skip]

    # -- metadata -------------------------------------------------------------------------

    @property
    def name_or_path(self) -> str:
        """The resolved tokenizer id."""
        return self._name_or_path

    @property
    def chat_template(self) -> str | None:
        """The raw chat template string, when the repository has one (never rendered)."""
        return self._chat_template

    @property
    def init_kwargs(self) -> dict[str, Any]:
        """A copy of the parsed ``tokenizer_config.json`` ({} when it was not available)."""
        return dict(self._config or {})

    @property
    def backend_tokenizer(self) -> Tokenizer:
        """The shared ``tokenizers.Tokenizer``; do not change its settings (call options only)."""
        return self._backend

    @property
    def backend(self) -> Tokenizer:
        """Alias of :attr:`backend_tokenizer`."""
        return self._backend

    def __repr__(self) -> str:
        return (
            f"TinkerTokenizer(name_or_path={self._name_or_path!r}, vocab_size={self.vocab_size}, "
            f"len={len(self)})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Serialized tokenizers forget encode_special_tokens; carry it explicitly.
        return (
            _restore_tinker_tokenizer,
            (
                self._name_or_path,
                self._backend.to_str(),
                bool(getattr(self._backend, "encode_special_tokens", False)),
                self._config,
            ),
        )


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------

#: ``loader(tokenizer_id, revision) -> TinkerTokenizer``; raises on failure. Never called for
#: built-in ``tinker-sync/`` ids. The default downloads from the Hugging Face Hub.
TokenizerLoader = Callable[[str, str | None], TinkerTokenizer]


def _build_builtin(tokenizer_id: str) -> TinkerTokenizer:
    # Only the byte tokenizer exists today; _check_loadable rejected any other built-in id.
    return TinkerTokenizer(
        _byte_tokenizer.build_byte_tokenizer(),
        name_or_path=tokenizer_id,
        config=_byte_tokenizer.tokenizer_config,
    )


def _hf_token() -> str | None:
    token = os.environ.get("HF_TOKEN") or None
    if token is not None:
        register_secret(token)
    return token


def _from_pretrained(tokenizer_id: str, revision: str | None, token: str | None) -> Tokenizer:
    rev = revision or "main"
    try:
        backend: Tokenizer = Tokenizer.from_pretrained(tokenizer_id, revision=rev, token=token)
    except TypeError:  # tokenizers < 0.20 named the argument auth_token
        from_pretrained: Any = Tokenizer.from_pretrained
        backend = from_pretrained(tokenizer_id, revision=rev, auth_token=token)
    return backend


def _hub_file(
    hub: Any, tokenizer_id: str, filename: str, revision: str | None, token: str | None
) -> str | None:
    """Local path of one repository file via huggingface_hub; None when the repo lacks it."""
    errors = hub.errors
    remote_missing = getattr(errors, "RemoteEntryNotFoundError", None)
    try:
        path: str = hub.hf_hub_download(tokenizer_id, filename, revision=revision, token=token)
    except Exception as exc:
        local_missing = isinstance(exc, errors.LocalEntryNotFoundError)
        if remote_missing is not None and isinstance(exc, remote_missing):
            return None
        if (
            remote_missing is None
            and isinstance(exc, errors.EntryNotFoundError)
            and not local_missing
        ):
            return None  # older huggingface_hub: EntryNotFoundError is the remote 404
        if local_missing and bool(getattr(hub.constants, "HF_HUB_OFFLINE", False)):
            return None  # offline and never cached: treat as absent
        raise TokenizerLoadError(
            f"could not fetch {filename} of tokenizer {tokenizer_id!r}: {type(exc).__name__}: {exc}"
        ) from exc
    return path


def _fetch_tokenizer_config(
    tokenizer_id: str, revision: str | None, token: str | None
) -> dict[str, Any] | None:
    """tokenizer_config.json (plus chat_template.jinja when the config has no template).

    None when huggingface_hub is not installed or the repository has neither file.
    """
    try:
        hub: Any = importlib.import_module("huggingface_hub")
    except ImportError:
        return None
    return _read_config(
        tokenizer_id,
        _hub_file(hub, tokenizer_id, "tokenizer_config.json", revision, token),
        lambda: _hub_file(hub, tokenizer_id, "chat_template.jinja", revision, token),
    )


def _read_config(
    tokenizer_id: str, path: str | None, template: Callable[[], str | None]
) -> dict[str, Any] | None:
    """tokenizer_config.json at ``path``, plus ``template()``'s file when it has no template."""
    config: dict[str, Any] | None = None
    if path is not None:
        try:
            with open(path, encoding="utf-8") as fh:
                loaded = json.load(fh)
        except (OSError, ValueError) as exc:
            raise TokenizerLoadError(
                f"tokenizer_config.json of {tokenizer_id!r} is unreadable: {exc}"
            ) from exc
        if not isinstance(loaded, dict):
            raise TokenizerLoadError(f"tokenizer_config.json of {tokenizer_id!r} is not an object")
        config = loaded
    if config is None or not config.get("chat_template"):
        template_path = template()
        if template_path is not None:
            with open(template_path, encoding="utf-8") as fh:
                config = {**(config or {}), "chat_template": fh.read()}
    return config


def _existing(path: str) -> str | None:
    return path if os.path.isfile(path) else None


def _load_from_dir(directory: str) -> TinkerTokenizer:
    """A local model directory (a server serving a local checkpoint sends no tokenizer id):
    its ``tokenizer.json``, ``tokenizer_config.json`` and ``chat_template.jinja``."""
    tokenizer_file = os.path.join(directory, "tokenizer.json")
    if not os.path.isfile(tokenizer_file):
        raise TokenizerLoadError(
            f"the model name {directory!r} is a local directory without a tokenizer.json"
        )
    try:
        backend = Tokenizer.from_file(tokenizer_file)
    except Exception as exc:
        raise TokenizerLoadError(
            f"could not load {tokenizer_file!r}: {type(exc).__name__}: {exc}"
        ) from exc
    config = _read_config(
        directory,
        _existing(os.path.join(directory, "tokenizer_config.json")),
        lambda: _existing(os.path.join(directory, "chat_template.jinja")),
    )
    return TinkerTokenizer(backend, name_or_path=directory, config=config)


def _load_from_hub(tokenizer_id: str, revision: str | None) -> TinkerTokenizer:
    """The default loader: ``tokenizer.json`` plus ``tokenizer_config.json`` from the Hub."""
    token = _hf_token()
    at = f" at revision {revision!r}" if revision else ""
    try:
        backend = _from_pretrained(tokenizer_id, revision, token)
    except ImportError as exc:
        raise TokenizerLoadError(
            f"could not load tokenizer {tokenizer_id!r}{at}: downloading from the Hugging Face "
            f"Hub needs the huggingface_hub package (`pip install huggingface_hub`): {exc}"
        ) from exc
    except Exception as exc:
        raise TokenizerLoadError(
            f"could not load tokenizer {tokenizer_id!r}{at} from the Hugging Face Hub "
            f"(it needs a tokenizer.json; set HF_TOKEN for gated repositories): "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    config = _fetch_tokenizer_config(tokenizer_id, revision, token)
    return TinkerTokenizer(backend, name_or_path=tokenizer_id, config=config)


_Key = tuple[str, str | None]

_lock = threading.Lock()
_cache: OrderedDict[_Key, TinkerTokenizer] = OrderedDict()
_inflight: dict[_Key, Future[TinkerTokenizer]] = {}
_loader: TokenizerLoader = _load_from_hub
#: Test hook: called (outside the lock) when a caller joins a load already in flight.
_join_hook: Callable[[_Key], None] | None = None


def set_tokenizer_loader(loader: TokenizerLoader | None) -> TokenizerLoader:
    """Replace the Hub loader (tests, mirrors); None restores the default. Returns the old one.

    Cached tokenizers stay cached; call ``_reset_tokenizer_cache()`` to drop them.
    """
    global _loader
    with _lock:
        previous = _loader
        _loader = loader if loader is not None else _load_from_hub
    return previous


def _reset_tokenizer_cache() -> None:
    """Forget every cached tokenizer and in-flight load (tests). Waiters already blocked on an
    in-flight load still get its result."""
    global _lock, _cache, _inflight
    _lock = threading.Lock()
    _cache = OrderedDict()
    _inflight = {}


def _after_fork_in_child() -> None:
    # The parent's loading threads do not exist here: their in-flight entries would never
    # finish, and the lock may have been held at the fork. Cached tokenizers are still valid.
    global _lock, _cache, _inflight
    _lock = threading.Lock()
    _cache = OrderedDict(_cache)
    _inflight = {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _as_load_error(tokenizer_id: str, exc: BaseException) -> TokenizerLoadError:
    if isinstance(exc, TokenizerLoadError):
        return exc
    if isinstance(exc, Exception):
        error = TokenizerLoadError(
            f"could not load tokenizer {tokenizer_id!r}: {type(exc).__name__}: {exc}"
        )
    else:
        error = TokenizerLoadError(
            f"loading tokenizer {tokenizer_id!r} was interrupted ({type(exc).__name__})"
        )
    error.__cause__ = exc
    return error


def _get_or_load(key: _Key) -> TinkerTokenizer:
    tokenizer_id, revision = key
    lock = _lock
    with lock:
        cached = _cache.get(key)
        if cached is not None:
            _cache.move_to_end(key)
            return cached
        future = _inflight.get(key)
        owner = future is None
        if future is None:
            future = Future()
            _inflight[key] = future
        loader = _loader
        cache, inflight = _cache, _inflight
    if not owner:
        hook = _join_hook
        if hook is not None:
            hook(key)
        try:
            return future.result()
        except TokenizerLoadError as exc:
            # A fresh exception per waiter (one shared instance would collect every thread's
            # traceback); the shared failure is the cause.
            raise TokenizerLoadError(str(exc)) from exc
    try:
        if tokenizer_id.startswith(_BUILTIN_PREFIX):
            tokenizer = _build_builtin(tokenizer_id)
        elif os.path.isdir(tokenizer_id):
            tokenizer = _load_from_dir(tokenizer_id)
        else:
            tokenizer = loader(tokenizer_id, revision)
        if not isinstance(tokenizer, TinkerTokenizer):
            raise TypeError(f"tokenizer loader returned {type(tokenizer).__name__}")
    except BaseException as exc:
        error = _as_load_error(tokenizer_id, exc)
        with lock:
            if inflight.get(key) is future:
                del inflight[key]
        future.set_exception(error)
        if error is exc or not isinstance(exc, Exception):
            raise
        raise error from exc
    with lock:
        if inflight.get(key) is future:
            del inflight[key]
        cache[key] = tokenizer
        cache.move_to_end(key)
        while len(cache) > CACHE_SIZE:
            cache.popitem(last=False)
    future.set_result(tokenizer)
    return tokenizer


def load_tokenizer(
    name_or_id: str, *, tokenizer_id: str | None = None, revision: str | None = None
) -> TinkerTokenizer:
    """Return the (cached) tokenizer for a model name or tokenizer id.

    ``tokenizer_id`` is the server's ``model_data.tokenizer_id`` (it wins, cut at ``:``).
    ``revision`` pins a Hub branch/tag/commit (default: ``main``; ignored for built-in ids).
    Raises TokenizerLoadError when the id cannot be loaded (never cached: the next call retries).
    """
    resolved = resolve_tokenizer_id(name_or_id, tokenizer_id)
    _check_loadable(resolved)
    key: _Key = (resolved, None if resolved.startswith(_BUILTIN_PREFIX) else revision)
    return _get_or_load(key)
