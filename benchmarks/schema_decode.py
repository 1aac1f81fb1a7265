"""Benchmark (#38 item 3, choosing the schema layer): decoding the hottest record that crosses the wire, a SAPO reply
of shared packets (what the server checks for every node every round, and what each node checks again of the relayed
pool), the way main does it and with a declared pydantic v2 model, side by side in one process.

    python benchmarks/schema_decode.py [--packets 24] [--completions 8] [--repeats 200]

Main: `json.loads` then `wire/validate.check_packets`: hand-written checks until 7c728d1 (the decision's run,
docs/results/schema-decode/2026-12-03.txt), since then the schema layer (wire/payloads.py: `msgspec.convert` of each
parsed packet into a declared Struct). pydantic: one `TypeAdapter` over the same bounds (lengths, the verifier's name,
1..L completions) validating the JSON text and building the same Packets; msgspec: a `Decoder` doing the same from the
text. Prints the median time per reply of each and the ratios; every decoder must accept the same payload and build
equal packets.
"""

# no `from __future__ import annotations`: msgspec resolves the local Structs' annotations at run time
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pubswap_flwr.algorithms.sapo_selection import Packet  # noqa: E402
from pubswap_flwr.schema import check_depth, check_utf8  # noqa: E402
from pubswap_flwr.tasks import TaskItem  # noqa: E402
from pubswap_flwr.tasks.verifiers import VERIFIERS  # noqa: E402
from pubswap_flwr.wire.payloads import Limits  # noqa: E402
from pubswap_flwr.wire.validate import check_packets  # noqa: E402


def payload(packets: int, completions: int) -> str:
    """A reply's JSON text: `packets` shared rollouts of `completions` completions each, sized like SmolLM2's."""
    rows = []
    for index in range(packets):
        item = TaskItem(f"node1-{index}", "chain_sum", f"Calculate {index} + 17 - 4 + {index * 3}.", str(index + 13),
                        "exact", metadata={"difficulty": {"num_terms": 4}},
                        provenance={"generator": "chain_sum", "config": {"min_terms": 2}, "seed": 7, "index": index})
        texts = [f"<think>{index} plus 17 is {index + 17}; minus 4 ...</think> <answer>{index + 13 + k}</answer>"
                 for k in range(completions)]
        rows.append(Packet("00001-7", item, tuple(texts)).to_wire())
    return json.dumps({"packets": rows})


def decode_main(text: str, limits: Limits, completions: int) -> list[Packet]:
    packets, reasons = check_packets(json.loads(text), limits, completions)
    assert not reasons, reasons
    return packets


def walk_checks(item: dict, completions: tuple[str, ...], limits: Limits) -> None:
    """What check_packets checks beyond types and lengths, run as is after a declared model's decode: the metadata
    and provenance depth and size, and no lone surrogate in a completion (so the timings compare like with like)."""
    for key in ("metadata", "provenance"):
        check_depth(item[key], limits.max_depth, key)
        assert len(repr(item[key])) <= limits.max_metadata_chars
    for text in completions:
        check_utf8(text, "a completion")


def pydantic_decoder(limits: Limits, most: int):
    """A TypeAdapter with the bounds check_packets applies to the fields it types; walk_checks does the rest."""
    from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter

    def text(longest: int):
        return Annotated[str, StringConstraints(max_length=longest)]

    class Item(BaseModel):
        model_config = ConfigDict(extra="ignore", frozen=True)
        uid: text(256)
        task: text(256)
        question: Annotated[str, StringConstraints(min_length=1, max_length=limits.max_question_chars)]
        answer: text(limits.max_answer_chars) | None = None
        verifier: Literal[tuple(sorted(VERIFIERS))]  # type: ignore[valid-type]
        family: str | None = None
        metadata: dict[str, Any] = Field(default_factory=dict)
        provenance: dict[str, Any] = Field(default_factory=dict)

    class Shared(BaseModel):
        model_config = ConfigDict(extra="ignore", frozen=True)
        sender: str = ""
        item: Item
        completions: Annotated[list[text(limits.max_completion_chars)],
                               Field(min_length=1, max_length=most)]

    class Reply(BaseModel):
        packets: Annotated[list[Shared], Field(max_length=limits.max_packets)]

    adapter = TypeAdapter(Reply)

    def decode(text_: str) -> list[Packet]:
        packets = []
        for shared in adapter.validate_json(text_).packets:
            item = shared.item.model_dump()
            walk_checks(item, tuple(shared.completions), limits)
            packets.append(Packet("", TaskItem.from_dict(item), tuple(shared.completions)))
        return packets

    return decode


def msgspec_decoder(limits: Limits, most: int):
    try:
        import msgspec
    except ImportError:
        return None

    class Item(msgspec.Struct, frozen=True):
        uid: Annotated[str, msgspec.Meta(max_length=256)]
        task: Annotated[str, msgspec.Meta(max_length=256)]
        question: Annotated[str, msgspec.Meta(min_length=1, max_length=limits.max_question_chars)]
        verifier: Literal[tuple(sorted(VERIFIERS))]  # type: ignore[valid-type]
        answer: Annotated[str, msgspec.Meta(max_length=limits.max_answer_chars)] | None = None
        family: str | None = None
        metadata: dict[str, Any] = {}
        provenance: dict[str, Any] = {}

    class Shared(msgspec.Struct, frozen=True):
        item: Item
        completions: Annotated[list[Annotated[str, msgspec.Meta(max_length=limits.max_completion_chars)]],
                               msgspec.Meta(min_length=1, max_length=most)]
        sender: str = ""

    class Reply(msgspec.Struct):
        packets: Annotated[list[Shared], msgspec.Meta(max_length=limits.max_packets)]

    decoder = msgspec.json.Decoder(Reply)

    def decode(text_: str) -> list[Packet]:
        packets = []
        for shared in decoder.decode(text_).packets:
            item = msgspec.structs.asdict(shared.item)
            walk_checks(item, tuple(shared.completions), limits)
            packets.append(Packet("", TaskItem.from_dict(item), tuple(shared.completions)))
        return packets

    return decode


def median_seconds(decode, text: str, repeats: int) -> float:
    decode(text)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        decode(text)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--packets", type=int, default=24, help="packets in the reply (SAPO's 4 nodes x I = 8 -> 24)")
    parser.add_argument("--completions", type=int, default=8, help="completions per packet (L)")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    limits = Limits()
    text = payload(args.packets, args.completions)
    decoders = {"main (json.loads + check_packets)": lambda t: decode_main(t, limits, args.completions),
                "pydantic TypeAdapter": pydantic_decoder(limits, args.completions)}
    spec = msgspec_decoder(limits, args.completions)
    if spec is not None:
        decoders["msgspec Decoder"] = spec
    reference = [(p.item.to_dict(), p.completions) for p in decode_main(text, limits, args.completions)]
    for name, decode in decoders.items():
        got = [(p.item.to_dict(), p.completions) for p in decode(text)]
        assert got == reference, f"{name} built other packets than main"
    print(f"{args.packets} packets x {args.completions} completions, {len(text.encode()) / 1024:.0f} KiB of JSON; "
          f"load average {os.getloadavg()[0]:.2f}; median of {args.repeats}")
    times = {name: median_seconds(decode, text, args.repeats) for name, decode in decoders.items()}
    base = times["main (json.loads + check_packets)"]
    for name, seconds in times.items():
        print(f"  {name:38s} {seconds * 1e3:8.3f} ms  ({seconds / base:.2f}x main)")
    if spec is None:
        print("  msgspec: not installed (pip install msgspec to time it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
