"""Every Python example of the README and of docs/*.md runs, and the documentation site builds.

Each page's ```python blocks run in order, in one namespace, in a fresh temporary working
directory, as one test per page. A block whose first line is ``# not run: <reason>`` is
skipped (for what cannot run here: torchrun over nodes, an S3 bucket, a real download).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"#\s*not run:\s*\S")
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)$")


def python_blocks(markdown: str) -> list[tuple[int, str]]:
    """(first line number, source) of every fenced block whose info string starts with ``python``."""
    return fenced_blocks(markdown, ("python", "py"))


def fenced_blocks(markdown: str, languages: tuple[str, ...]) -> list[tuple[int, str]]:
    """(first line number, source) of every fenced block whose info string starts with one of ``languages``."""
    blocks: list[tuple[int, str]] = []
    lines = markdown.split("\n")
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        language = opening["info"].strip().split(" ")[0].split("{")[0].lower()
        body: list[str] = []
        i += 1
        while i < len(lines):
            closing = _FENCE.match(lines[i])
            if closing and closing["fence"].startswith(fence) and not closing["info"].strip():
                break
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        if language in languages:
            blocks.append((i - len(body) + 1, "\n".join(body) + "\n"))
        i += 1
    return blocks


def is_not_run(source: str) -> bool:
    """True for a block whose first line is ``# not run: <reason>``."""
    first = source.lstrip("\n").split("\n", 1)[0].strip()
    return bool(NOT_RUN.fullmatch(first) or NOT_RUN.match(first))


def run_page(markdown: str, name: str) -> int:
    """Run the page's runnable Python blocks in order in one namespace; returns how many ran."""
    namespace: dict[str, object] = {"__name__": "__main__"}
    ran = 0
    for line, source in python_blocks(markdown):
        if is_not_run(source):
            continue
        code = compile(source, f"{name}:{line}", "exec")
        exec(code, namespace)
        ran += 1
    return ran


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    markdown = page.read_text()
    monkeypatch.chdir(tmp_path)
    run_page(markdown, str(page.relative_to(ROOT)))  # under the suite's filterwarnings: a warning fails it


def test_every_skipped_block_gives_a_reason() -> None:
    for page in PAGES:
        for line, source in python_blocks(page.read_text()):
            first = source.lstrip("\n").split("\n", 1)[0]
            if "not run" in first:
                assert is_not_run(source), f"{page.name}:{line}: '# not run: <reason>' needs a reason"


def test_the_collector_and_the_runner_can_fail(tmp_path: Path) -> None:
    """Control: blocks are found (indented, tilde fences, other languages left out), and a failing block fails."""
    markdown = (
        "text\n\n```python\nx = 1\n```\n\n```bash\nexit 1\n```\n\n"
        "* item\n\n    ```python\n    y = x + 1\n    ```\n\n"
        "~~~python\n# not run: needs a cluster\nraise SystemExit(3)\n~~~\n\n"
        "```python\nassert y == 2\nraise RuntimeError('this example is broken')\n```\n"
    )
    blocks = python_blocks(markdown)
    assert [source.split("\n")[0] for _, source in blocks] == [
        "x = 1",
        "y = x + 1",
        "# not run: needs a cluster",
        "assert y == 2",
    ]
    assert [is_not_run(source) for _, source in blocks] == [False, False, True, False]
    with pytest.raises(RuntimeError, match="this example is broken"):
        run_page(markdown, "control.md")
    assert run_page(markdown.rsplit("```python", 1)[0], "control.md") == 2
    for page in PAGES:
        if page.name in ("README.md", "writing.md", "reading.md"):
            assert [b for b in python_blocks(page.read_text()) if not is_not_run(b[1])], f"{page.name}: no examples"


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        # no -q: mkdocs's --quiet drops its warnings before --strict counts them (a griffe warning about a
        # docstring passed here and failed the docs leg of CI)
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    assert (tmp_path / "site" / "api" / "index.html").is_file()


def test_api_reference_names_every_public_name() -> None:
    """docs/api.md renders every name of ``torchrecord.__all__`` (the errors on docs/errors.md)."""
    import torchrecord
    import torchrecord.errors

    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    errors_page = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    assert "::: torchrecord.errors" in errors_page
    missing = [
        name
        for name in torchrecord.__all__
        if name != "__version__" and name not in torchrecord.errors.__all__ and f"::: torchrecord.{name}\n" not in api
    ]
    assert not missing, f"docs/api.md lacks: {missing}"
