"""docs/architecture.md stays true: every file, folder, module and `file.py:name` it names exists, it names every
import contract of pyproject.toml, its "add a mode" recipe touches exactly the files config/catalog.py's docstring
lists (and every file test_catalog's messages name), it shows the messages of test_catalog's checks, and README.md
and docs/guide.md link to it."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from pubswap_flwr.config import catalog

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pubswap_flwr"
PAGE = ROOT / "docs" / "architecture.md"
TEST_CATALOG = ROOT / "tests" / "unit" / "test_catalog.py"

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
FILE_NAME = re.compile(r"(?<![\w/.<>*-])((?:[\w<>*.-]+/)*[\w<>*-][\w<>*.-]*\.(?:py|md|toml|json))(?![\w/])")
FILE_AND_NAME = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.py):([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)")
DOTTED_MODULE = re.compile(r"pubswap_flwr(?:\.[A-Za-z_]\w*)+")
PLACEHOLDER = re.compile(r"<[^<>/]+>|\{[^{}/]+\}")


def _spaced(text: str) -> str:
    return " ".join(text.split())


def _prose_and_diagrams(text: str) -> tuple[str, list[str]]:
    """The page without its fenced blocks, and the blocks' contents."""
    return FENCE.sub("", text), [body for _, body in FENCE.findall(text)]


def _code_spans(prose: str) -> list[str]:
    return [_spaced(body) for _, body in CODE_SPAN.findall(prose)]


def _pattern(path: str) -> str:
    """A path with its placeholders (`<mode>`, `{name}`) as glob wildcards."""
    return PLACEHOLDER.sub("*", path)


def _matches(path: str) -> list[Path]:
    """What a path the page names stands for: relative to the repository root, else to the package, else (a file
    name without its folders, or folders below the package's) anywhere in the package; placeholders match any name."""
    pattern = _pattern(path).rstrip("/")
    want_dir = path.endswith("/")
    for found in (sorted(ROOT.glob(pattern)), sorted(PACKAGE.glob(pattern)), sorted(PACKAGE.glob(f"**/{pattern}"))):
        found = [p for p in found if p.is_dir() == want_dir]
        if found:
            return found
    return []


def _canonical(path: str) -> str:
    """A path as relative to the repository root, placeholders as '*' (for comparing two texts' file lists)."""
    pattern = _pattern(path)
    if sorted(ROOT.glob(pattern)):
        return pattern
    if sorted(PACKAGE.glob(pattern)):
        return f"pubswap_flwr/{pattern}"
    return f"(nowhere) {pattern}"


def _is_path(span: str) -> bool:
    return (" " not in span and "://" not in span
            and (span.endswith("/") and re.fullmatch(r"[\w<>.-]+(?:/[\w<>.-]+)*/", span) is not None
                 or FILE_NAME.fullmatch(span) is not None))


def missing_names(text: str) -> list[str]:
    """Every file, folder or dotted module the page names (in code spans, or as a .py file in a diagram) that does
    not exist."""
    prose, diagrams = _prose_and_diagrams(text)
    spans = _code_spans(prose)
    paths = [span for span in spans if _is_path(span)]
    paths += [name for body in diagrams for name in FILE_NAME.findall(body.replace("<br/>", " "))]
    missing = sorted({path for path in paths if not _matches(path)})
    for module in {span for span in spans if DOTTED_MODULE.fullmatch(span)}:
        as_path = ROOT / module.replace(".", "/")
        if not (as_path.with_suffix(".py").is_file() or (as_path / "__init__.py").is_file()):
            missing.append(module)
    return missing


def _defined(path: Path, name: str) -> bool:
    """Whether module `path` defines `name` at its top level, or `Class.attribute` in a class body."""
    first, _, attribute = name.partition(".")

    def names(body: list[ast.stmt]) -> dict[str, ast.stmt]:
        out: dict[str, ast.stmt] = {}
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out[node.name] = node
            elif isinstance(node, ast.Assign):
                out.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out[node.target.id] = node
        return out

    found = names(ast.parse(path.read_text()).body).get(first)
    if found is None or not attribute:
        return found is not None
    return isinstance(found, ast.ClassDef) and attribute in names(found.body)


def undefined_names(text: str) -> list[str]:
    """Every `file.py:name` on the page (prose or diagram) whose file does not define that name."""
    wrong = []
    for path, name in sorted(set(FILE_AND_NAME.findall(text))):
        files = [p for p in _matches(path) if p.suffix == ".py"]
        if not any(_defined(p, name) for p in files):
            wrong.append(f"{path}:{name}")
    return wrong


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    rest = text[start + len(heading) + 2:]
    following = re.search(r"^#{2,3} ", rest, re.MULTILINE)
    return rest[:following.start()] if following else rest


def _recipe_files(text: str, heading: str) -> set[str]:
    """The files a recipe touches: its bold code spans."""
    return {_canonical(path) for path in re.findall(r"\*\*`([^`]+)`\*\*", _section(text, heading))}


def _catalog_docstring_files() -> set[str]:
    """The files catalog.py's docstring says a new mode touches: the first file each item or clause of its list
    names ('this file' is the catalog)."""
    doc = catalog.__doc__
    listed = doc.split("To add a mode, touch these files:", 1)[1].split("tests/unit/test_catalog.py fails", 1)[0]
    files = set()
    for clause in re.split(r"\n(?=\d+\. |and, )|;", listed):
        named = FILE_NAME.findall(clause)
        if named:
            files.add(_canonical(named[0]))
        elif "this file" in clause:
            files.add(_canonical(str(Path(catalog.__file__).relative_to(ROOT))))
    return files


def _check_messages() -> dict[str, list[str]]:
    """Each `test_every_*` check of test_catalog.py: its assert messages, an f-string's fields as '*'."""

    def text(node: ast.expr) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(v.value if isinstance(v, ast.Constant) else "*" for v in node.values)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return text(node.left) + text(node.right)
        return "*"  # a message computed at run time (a name, a call): any text

    checks = {}
    for node in ast.parse(TEST_CATALOG.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_every_"):
            checks[node.name] = [text(a.msg) for a in ast.walk(node) if isinstance(a, ast.Assert) and a.msg]
    return checks


# -- the page -------------------------------------------------------------------------------------------------------
def test_every_file_folder_and_module_the_page_names_exists():
    missing = missing_names(PAGE.read_text())
    assert not missing, f"docs/architecture.md names files, folders or modules that do not exist: {missing}"


def test_every_function_or_class_the_page_names_is_defined_in_the_file_it_names():
    text = PAGE.read_text()
    assert len(set(FILE_AND_NAME.findall(text))) >= 40  # the data flow names its steps this way
    wrong = undefined_names(text)
    assert not wrong, f"docs/architecture.md names `file.py:name`s that file does not define: {wrong}"


def test_the_checks_find_a_missing_file_a_missing_name_and_a_placeholder_that_matches_nothing():
    page = ("`pubswap_flwr/server/runner.py` and `pubswap_flwr/nowhere.py`, `node/warm/`, `nowhere/`, "
            "`tests/golden/<run>.json`, "
            "`tests/golden/<run>.yaml.json`, `pubswap_flwr.config.catalog`, `pubswap_flwr.protocols.nowhere`, "
            "`python -m tests.golden.runs write <run>`\n```mermaid\nflowchart TB\n  a[\"gone.py\"]\n```\n"
            "server/runner.py:Runner._rounds server/runner.py:Runner._nothing rounds/exchange.py:Exchange "
            "protocols/pubswap.py:segmentt")
    assert missing_names(page) == ["gone.py", "nowhere/", "pubswap_flwr/nowhere.py", "tests/golden/<run>.yaml.json",
                                   "pubswap_flwr.protocols.nowhere"]
    assert undefined_names(page) == ["protocols/pubswap.py:segmentt", "server/runner.py:Runner._nothing"]


def test_the_page_names_every_import_contract_of_pyproject():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    text = _spaced(PAGE.read_text())
    unnamed = [c["name"] for c in contracts if _spaced(c["name"]) not in text]
    assert len(contracts) >= 5 and not unnamed, f"docs/architecture.md does not name import contracts {unnamed}"


def _module_of(span: str) -> str | None:
    """The dotted module a path the page names stands for (`protocols/base.py` -> pubswap_flwr.protocols.base)."""
    if not _is_path(span) or PLACEHOLDER.search(span):
        return None
    name = span.rstrip("/").removesuffix(".py").removeprefix("pubswap_flwr/")
    return f"pubswap_flwr.{name.replace('/', '.')}"


def _contract_row(text: str, name: str) -> str:
    """The last cell of the page's table row whose cell is the contract's name."""
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if line.startswith("|") and _spaced(name) in (_spaced(c) for c in cells):
            return cells[-2]
    raise AssertionError(f"docs/architecture.md has no table row naming contract {name!r}")


LAYERS_CONTRACTS = [c for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
                    if c["type"] == "layers"]


@pytest.mark.parametrize("contract", LAYERS_CONTRACTS, ids=lambda c: c["name"][:40])
def test_the_page_lists_every_module_of_each_layers_contract_in_its_order(contract):
    layers = [[m.strip() for m in re.split(r"[:|]", layer)] for layer in contract["layers"]]
    layer_of = {module: i for i, layer in enumerate(layers) for module in layer}
    row = _contract_row(PAGE.read_text(), contract["name"])
    named = list(dict.fromkeys(m for m in map(_module_of, _code_spans(row)) if m in layer_of))
    assert sorted(set(layer_of) - set(named)) == [], "docs/architecture.md's row of this contract leaves modules out"
    order = [layer_of[m] for m in named]
    assert order == sorted(order), f"docs/architecture.md lists this contract's modules out of order: {named}"


# -- the "add a mode" recipe against the catalog's docstring and test_catalog -----------------------------------------
def test_the_add_a_mode_recipe_touches_exactly_the_files_the_catalog_docstring_lists():
    listed = _catalog_docstring_files()
    assert {"pubswap_flwr/protocols/*.py", "pubswap_flwr/config/catalog.py", "docs/protocols.md"} <= listed
    recipe = _recipe_files(PAGE.read_text(), "### A mode")
    assert recipe == listed, (f"docs/architecture.md's 'A mode' recipe (its bold files) differs from catalog.py's "
                              f"list: only the page has {sorted(recipe - listed)}, only catalog.py "
                              f"{sorted(listed - recipe)}")


def test_the_add_a_mode_recipe_touches_every_file_test_catalogs_checks_name():
    named = set()
    for messages in _check_messages().values():
        for message in messages:
            named |= {_canonical(path) for path in FILE_NAME.findall(message)}
            if "catalog entry" in message:
                named.add(_canonical(str(Path(catalog.__file__).relative_to(ROOT))))
    assert {"tests/golden/*.json", "docs/protocols.md", "pubswap_flwr/config/catalog.py"} <= named
    assert named <= _recipe_files(PAGE.read_text(), "### A mode")


def shown(message: str, text: str) -> bool:
    """Whether `text` quotes `message`, its '*' fields filled with any short text."""
    if not message.strip("* "):
        return True  # a message computed at run time: nothing to quote
    pattern = "[^`|]{0,80}?".join(re.escape(_spaced(part)) for part in message.split("*"))
    return re.search(pattern, _spaced(text)) is not None


def test_the_page_shows_the_message_of_every_check_of_test_catalog():
    checks = _check_messages()
    assert len([m for messages in checks.values() for m in messages]) >= 10
    text = PAGE.read_text()
    unshown = {name: message for name, messages in checks.items() for message in messages if not shown(message, text)}
    assert not unshown, f"docs/architecture.md does not show these test_catalog messages: {unshown}"


def test_a_message_counts_as_shown_only_whole():
    message = "mode *: golden run * has no file tests/golden/*.json (record it)"
    assert shown(message, "`mode 'x': golden run 'x' has no file tests/golden/x.json (record it)`")
    assert not shown(message, "`mode 'x': golden run 'x' lacks the file tests/golden/x.json (record it)`")
    assert not shown(message, "mode 'x': golden run 'x' has no file, and tests/golden/x.json (record it)")


@pytest.mark.parametrize("doc, section", [("README.md", "## Where to go next"), ("docs/guide.md", "## Package layout")])
def test_the_page_is_linked_from_the_front_door_and_the_package_layout(doc, section):
    text = (ROOT / doc).read_text()
    linked = re.findall(r"\]\(((?:docs/)?architecture\.md)(?:#[\w-]+)?\)", _section(text, section))
    assert linked, f"{doc}'s section {section!r} does not link docs/architecture.md"
