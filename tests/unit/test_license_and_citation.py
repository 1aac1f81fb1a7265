"""LICENSE is the Apache License 2.0 that pyproject.toml declares, word for word, with no other project's copyright
line; CITATION.cff is valid Citation File Format 1.2.0 for this project and cites both papers it implements."""

from __future__ import annotations

import datetime
import hashlib
import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
APACHE_2_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"  # https://www.apache.org/licenses/LICENSE-2.0.txt
PAPERS = {"2604.12160": "PubSwap", "2509.08721": "SAPO"}  # the README's arXiv links


def _citation() -> dict:
    return yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))


def test_license_is_the_apache_2_text_pyproject_declares():
    data = (ROOT / "LICENSE").read_bytes()
    assert hashlib.md5(data).hexdigest() == APACHE_2_MD5  # noqa: S324 (a checksum, not security)
    text = data.decode()
    assert "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert re.findall(r"Copyright \S+", text) == ["Copyright License.", "Copyright [yyyy]"]  # the template's only
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"


def test_citation_has_the_required_cff_keys():
    cff = _citation()
    assert cff["cff-version"] == "1.2.0"
    assert {"cff-version", "message", "title", "authors"} <= cff.keys()
    assert cff["title"] == "pubswap-flwr" and cff["license"] == "Apache-2.0" and cff["type"] == "software"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert cff["version"] == project["version"]
    assert cff["authors"] and all(isinstance(a, dict) and ({"name"} <= a.keys() or {"family-names"} <= a.keys())
                                  for a in cff["authors"])


@pytest.mark.parametrize("arxiv_id", sorted(PAPERS))
def test_citation_references_each_paper_the_readme_cites(arxiv_id):
    references = [ref for ref in _citation()["references"]
                  if any(i.get("value") == f"arXiv:{arxiv_id}" for i in ref.get("identifiers", []))]
    assert len(references) == 1, f"one reference with arXiv:{arxiv_id}"
    [ref] = references
    assert {"type", "title", "authors"} <= ref.keys() and ref["type"] == "article"
    assert PAPERS[arxiv_id] in ref["title"] or PAPERS[arxiv_id] == "SAPO"
    assert ref["url"] == f"https://arxiv.org/abs/{arxiv_id}" and f"arxiv.org/abs/{arxiv_id}" in (
        ROOT / "README.md").read_text()
    assert all({"given-names", "family-names"} <= a.keys() for a in ref["authors"])
    assert ref["year"] == 2000 + int(arxiv_id[:2])  # an arXiv id starts with the year and month it was submitted
    assert isinstance(ref["date-published"], datetime.date)
    assert ref["date-published"].strftime("%y%m") == arxiv_id[:4]
