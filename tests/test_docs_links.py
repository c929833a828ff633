"""Every relative link in README.md and docs/**/*.md resolves.

* A link's path (relative to the page it is on) names a file or folder that
  exists in the repository.
* A link's ``#anchor`` (to the same page or to another ``.md`` page) is the
  GitHub slug of one of that page's headings: the heading's text as rendered
  (code spans, links and emphasis reduced to their text), lower-cased,
  punctuation other than ``-`` and ``_`` removed, each space turned into
  ``-``; a repeated heading gets ``-1``, ``-2``, ... in order. Explicit
  ``<a id=...>`` / ``<a name=...>`` anchors count too.

Links inside fenced code blocks and code spans are not links; ``http(s):``,
``mailto:`` and other URLs with a scheme are not checked (no network).

Needs only the standard library and the repository checkout, not the
installed package: ``python tests/test_docs_links.py`` runs the same checks
without pytest (or ``python -m pytest tests/test_docs_links.py --noconftest``
where ``hinamoe`` is not installed yet).
"""

from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path
from urllib.parse import unquote

REPO_ROOT = Path(__file__).resolve().parent.parent

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
_HTML_ANCHOR = re.compile(r"""<a\s+[^>]*?(?:id|name)\s*=\s*["']([^"']+)["']""", re.I)
_REF_DEF = re.compile(r"^ {0,3}\[([^\]]+)\]:\s*(<[^>]*>|\S+)")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def doc_pages(root: Path = REPO_ROOT) -> list[Path]:
    """README.md and every Markdown page under docs/."""
    pages = [root / "README.md"]
    pages += sorted((root / "docs").rglob("*.md"))
    return [p for p in pages if p.is_file()]


def _strip_code(lines: list[str]) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    out, fence = [], None
    for i, line in enumerate(lines, 1):
        m = _FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                continue
            out.append((i, line))
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                and not line.strip()[len(m.group(1)):].strip():
            fence = None
    return out


def _rendered_text(s: str) -> str:
    """A heading's text as GitHub renders it (before slugging)."""
    s = re.sub(r"!\[([^\]]*)\]\([^)]*\)", r"\1", s)          # images -> alt
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)           # links -> text
    s = re.sub(r"\[([^\]]*)\]\[[^\]]*\]", r"\1", s)          # ref links -> text
    s = re.sub(r"<[^>]+>", "", s)                             # inline HTML
    s = re.sub(r"(`+)(.+?)\1", lambda m: m.group(2).strip(), s)  # code spans
    s = re.sub(r"(\*\*|__)(.+?)\1", r"\2", s)                # strong
    s = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"\1", s)  # emphasis
    return s


def slugify(heading: str) -> str:
    """GitHub's anchor for a heading (without the duplicate suffix)."""
    text = _rendered_text(heading).strip().lower()
    kept = []
    for ch in text:
        if ch in "-_ ":
            kept.append(ch)
        elif unicodedata.category(ch)[0] in "LNM":
            kept.append(ch)
        # every other character (punctuation, symbols) is dropped
    return "".join(kept).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a link may name on ``page``."""
    lines = page.read_text(encoding="utf-8").splitlines()
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in _strip_code(lines):
        for m in _HTML_ANCHOR.finditer(line):
            out.add(m.group(1))
        m = _ATX.match(line)
        if not m:
            continue
        text = re.sub(r"[ \t]+#+[ \t]*$", "", m.group(2) or "")
        slug = slugify(text)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _link_targets(line: str) -> list[str]:
    """Targets of the inline links and images on one line (code spans skipped)."""
    line = re.sub(r"(`+).+?\1", "", line)
    targets = []
    i = 0
    while True:
        j = line.find("](", i)
        if j < 0:
            break
        k, depth = j + 2, 1
        while k < len(line) and depth:
            if line[k] == "(":
                depth += 1
            elif line[k] == ")":
                depth -= 1
            k += 1
        if depth == 0:
            inner = line[j + 2:k - 1].strip()
            if inner.startswith("<") and ">" in inner:
                inner = inner[1:inner.index(">")]
            else:
                inner = inner.split()[0] if inner.split() else ""
            targets.append(inner)
        i = j + 2
    return targets


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link on ``page``."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out = []
    for no, line in _strip_code(lines):
        m = _REF_DEF.match(line)
        if m:
            out.append((no, m.group(2).strip("<>")))
            continue
        out.extend((no, t) for t in _link_targets(line))
    return out


def broken_links(pages: list[Path] | None = None, root: Path = REPO_ROOT) -> list[str]:
    """One line per link that does not resolve: page:line: target (why)."""
    pages = doc_pages(root) if pages is None else pages
    cache: dict[Path, set[str]] = {}
    problems = []
    for page in pages:
        rel = page.relative_to(root)
        for no, target in links(page):
            if not target or _SCHEME.match(target) or target.startswith("//"):
                continue
            path_part, _, anchor = target.partition("#")
            path_part = unquote(path_part.split("?")[0])
            if path_part.startswith("/"):
                dest = (root / path_part.lstrip("/")).resolve()
            elif path_part:
                dest = (page.parent / path_part).resolve()
            else:
                dest = page.resolve()
            where = f"{rel}:{no}: {target}"
            try:
                dest.relative_to(root)
            except ValueError:
                problems.append(f"{where} (points outside the repository)")
                continue
            if not dest.exists():
                problems.append(f"{where} (no such file)")
                continue
            if anchor:
                if dest.suffix.lower() != ".md" or not dest.is_file():
                    problems.append(f"{where} (anchor on a file that is not Markdown)")
                    continue
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if unquote(anchor) not in cache[dest]:
                    problems.append(f"{where} (no heading with anchor #{anchor})")
    return problems


# ------------------------------------------------------------------ tests


def test_docs_pages_exist():
    pages = doc_pages()
    names = {p.relative_to(REPO_ROOT).as_posix() for p in pages}
    assert "README.md" in names
    assert "docs/README.md" in names, "docs/README.md (the handbook's index) is missing"


def test_relative_links_and_anchors_resolve():
    problems = broken_links()
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_slugs_follow_github():
    assert slugify("Method & noise") == "method--noise"
    assert slugify("QMoE (4- and 8-bit experts)") == "qmoe-4--and-8-bit-experts"
    assert slugify("`avx2` tier, 2 threads (2026-12-01)") == "avx2-tier-2-threads-2026-12-01"
    assert slugify("The HiNa micro-kernel (MoE)") == "the-hina-micro-kernel-moe"
    assert slugify("snake_case stays") == "snake_case-stays"
    assert slugify("[a link](x.md) in **bold**") == "a-link-in-bold"


def test_checker_catches_broken_links(tmp_path):
    """The checker fails on a missing file, a missing anchor and a duplicate's suffix."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "# Top\n\n## Same\n\n## Same\n\n"
        "[ok](docs/page.md#a-heading) [ok](#same-1) [ok](docs/)\n"
        "[bad file](docs/missing.md) [bad anchor](docs/page.md#nope)\n"
        "[bad dup](#same-2) `[in code](missing.md)`\n\n"
        "```\n[in a fence](missing.md)\n```\n",
        encoding="utf-8")
    (tmp_path / "docs" / "page.md").write_text("# A heading\n\n[up](../README.md#top)\n",
                                               encoding="utf-8")
    problems = broken_links(root=tmp_path)
    assert len(problems) == 3, problems
    assert any("docs/missing.md (no such file)" in p for p in problems)
    assert any("#nope" in p for p in problems)
    assert any("#same-2" in p for p in problems)


if __name__ == "__main__":
    found = broken_links()
    for p in found:
        print(p)
    print(f"{len(doc_pages())} pages checked, {len(found)} broken links")
    sys.exit(1 if found else 0)
