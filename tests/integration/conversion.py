"""A packaged model's conversion that also hands back what it loaded from the GGUF file: the real-model tests
compare the converted folder's logits with that model (loading the GGUF again would take as long again)."""

from __future__ import annotations

from pathlib import Path

import pytest


def convert_recording(name: str, folder: Path) -> tuple:
    """packaged.convert of model `name` into `folder`; the (model, tokenizer) it loaded from the GGUF file, once."""
    from pubswap_flwr.policy import packaged

    loads = []
    load_from_gguf = packaged.load_from_gguf

    def recording(path, dtype=None):
        loads.append(load_from_gguf(path, dtype))
        return loads[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(packaged, "load_from_gguf", recording)
        packaged.convert(packaged.PACKAGED[name], folder)
    assert len(loads) == 1
    return loads[0]
