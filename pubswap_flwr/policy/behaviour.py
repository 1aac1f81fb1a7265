"""Whether a donor's sampling behaviour (token ids + log-probs) is usable by this receiver for importance weights:
same tokenizer (by fingerprint), ids in its vocabulary that decode to exactly the text that was verified."""

from __future__ import annotations

import hashlib
import json

from ..rollouts import Behaviour

_FINGERPRINTS: dict[int, str] = {}


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the vocabulary and special tokens: equal fingerprints mean comparable token ids."""
    key = id(tokenizer)
    if key not in _FINGERPRINTS:
        vocab = sorted(tokenizer.get_vocab().items())
        text = json.dumps([vocab, tokenizer.eos_token_id, tokenizer.pad_token_id], ensure_ascii=False)
        _FINGERPRINTS[key] = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    return _FINGERPRINTS[key]


def accept_behaviour(tokenizer, text: str, behaviour: Behaviour | None,
                     max_tokens: int) -> tuple[Behaviour | None, str]:
    """(the behaviour, "") when this receiver can use it, else (None, why not). The ids must decode to `text`
    because the reward was verified on the text: ids that say something else would train on unverified tokens."""
    if behaviour is None:
        return None, "no behaviour sent"
    if len(behaviour.ids) > max_tokens:
        return None, f"{len(behaviour.ids)} tokens, over generation.max-new-tokens = {max_tokens}"
    vocab = len(tokenizer)
    if any(i >= vocab for i in behaviour.ids):
        return None, f"a token id is outside this tokenizer's {vocab} ids"
    if tokenizer.decode(list(behaviour.ids), skip_special_tokens=True) != text:
        return None, "the ids do not decode to the verified text"
    return behaviour, ""
