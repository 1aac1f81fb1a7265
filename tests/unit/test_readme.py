"""The README front door (issue #37 item 5): short, cites both papers, shows the two commands CI and users run and a
mermaid diagram, and every relative link and #anchor in README.md and docs/*.md resolves under GitHub's slug rules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAIN_JOB_COMMAND = "bash scripts/setup.sh && . .venv/bin/activate && pubswap run --nodes 4"
TEST_COMMAND = "bash scripts/setup.sh && .venv/bin/python -m pytest"
PAPER_LINKS = ("https://arxiv.org/abs/2604.12160", "https://arxiv.org/abs/2509.08721")  # PubSwap, SAPO
MAX_README_LINES = 200

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+(?:\([^()\s]*\))?)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto: ...


def fenced_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(info string, lines) of every fenced code block, in order."""
    blocks, current, info = [], None, ""
    for line in text.splitlines():
        if FENCE.match(line):
            if current is None:
                info, current = line.strip().lstrip("`~").strip(), []
            else:
                blocks.append((info, current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code spans blanked out."""
    out, in_fence = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            out.append((number, re.sub(r"(`+).*?\1", "", line)))
    return out


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lowercase, punctuation but '-' and '_' removed, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, with GitHub's -1, -2 ... suffixes for repeated headings."""
    seen: dict[str, int] = {}
    result = set()
    for _number, line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        result.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return result


def broken_links(path: Path) -> list[str]:
    """'file:line: target (why)' for each relative link or #anchor in a markdown file that does not resolve."""
    problems = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            target = target.strip("<>")
            if EXTERNAL.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{number}: {target}"
            if not resolved.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and resolved.suffix != ".md":
                problems.append(f"{where} (an anchor into a file that is not markdown)")
            elif anchor and anchor not in anchors(resolved):
                problems.append(f"{where} (no heading with anchor #{anchor} in {resolved.name})")
    return problems


def test_readme_is_a_front_door_of_at_most_200_lines():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= MAX_README_LINES


def test_readme_cites_both_papers_with_their_arxiv_links():
    text = README.read_text(encoding="utf-8")
    for link in PAPER_LINKS:
        assert f"]({link})" in text, f"README.md does not link {link}"
    assert "PubSwap" in text and "Sharing is Caring" in text


@pytest.mark.parametrize("command", [MAIN_JOB_COMMAND, TEST_COMMAND])
def test_readme_shows_the_two_commands_verbatim_in_code_blocks(command):
    block_lines = [line.strip() for _info, lines in fenced_blocks(README.read_text(encoding="utf-8")) for line in lines]
    assert command in block_lines


def test_ci_runs_exactly_the_readme_test_command():
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = [line.split("#", 1)[0].strip() for line in lines if not line.lstrip().startswith("#")]
    assert TEST_COMMAND in commands


def test_readme_has_a_mermaid_diagram():
    diagrams = [lines for info, lines in fenced_blocks(README.read_text(encoding="utf-8")) if info == "mermaid"]
    assert diagrams, "no ```mermaid block in README.md"
    first = next(line.strip() for line in diagrams[0] if line.strip())
    assert first.split()[0] in {"sequenceDiagram", "flowchart", "graph"}
    assert "participant" in "\n".join(diagrams[0]) or "-->" in "\n".join(diagrams[0])


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(page):
    problems = broken_links(page)
    assert not problems, "\n".join(problems)


def test_github_slugs():
    assert github_slug("Stopping a run or the local SuperLink") == "stopping-a-run-or-the-local-superlink"
    assert github_slug("Loading a trained adapter or exporting a model") == \
        "loading-a-trained-adapter-or-exporting-a-model"
    assert github_slug("`model.name` and snake_case (#25)!") == "modelname-and-snake_case-25"
    assert github_slug("A real model: SmolLM2-135M-Instruct (#25)") == "a-real-model-smollm2-135m-instruct-25"
    assert github_slug("See [the guide](docs/guide.md)") == "see-the-guide"


def test_the_link_check_finds_a_missing_file_a_missing_anchor_and_accepts_good_links(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## Same\n\n## Same\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[ok](other.md) [ok](other.md#same-1) [ok](#page) [web](https://example.org/x#y)\n"
                    "`[in code](nowhere.md)`\n\n```\n[in a block](nowhere.md)\n```\n"
                    "[gone](missing.md) [bad](other.md#not-a-heading) [bad](#nowhere) [bad](other.md#same-2)\n")
    problems = broken_links(page)
    assert [problem.split(": ", 1)[1] for problem in problems] == [
        "missing.md (no such file)",
        "other.md#not-a-heading (no heading with anchor #not-a-heading in other.md)",
        "#nowhere (no heading with anchor #nowhere in page.md)",
        "other.md#same-2 (no heading with anchor #same-2 in other.md)",
    ]
    assert all(problem.startswith(f"{page}:9: ") for problem in problems)
