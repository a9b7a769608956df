"""The demo model's training text: the Python documentation, as plain prose.

Why this corpus: Debian ships the reStructuredText sources of the Python
documentation (package `python3.11-doc`), so it comes from a package registry
with no other download, and it is under the PSF License Version 2, a
permissive license. It is also the kind of text Longhaul is for: explaining
code and how to use it.

The sources are markup. This module keeps the prose: section titles, paragraphs,
list items and the descriptions under `.. function::`-style directives. It drops
code blocks, doctests, tables, comments and link targets, and turns inline
roles into their text (``:func:`open``` becomes ``open()``).

Each section becomes one example. Sections whose title is a question (the
FAQs) or that open with prose make chat exchanges too: the title, phrased as a
request, is the user's turn and the section's prose the assistant's.
"""

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

DEB_PACKAGE = "python3.11-doc"
SOURCES = "usr/share/doc/python3.11/html/_sources"
# Parts of the documentation that are mostly prose about using Python.
INCLUDED_PARTS = (
    "tutorial", "howto", "faq", "library", "reference", "using", "installing",
    "distributing", "extending", "c-api", "whatsnew",
)
INCLUDED_FILES = ("glossary.rst.txt",)
HEADING_CHARS = set("=-~^\"'*+#")
# A piece shorter than this adds little; longer sections are cut between paragraphs.
MIN_SECTION_CHARS = 120
MAX_SECTION_CHARS = 3000
# Directives whose indented body is prose worth keeping (the API descriptions).
PROSE_DIRECTIVES = {
    "function", "method", "class", "attribute", "data", "exception", "decorator",
    "classmethod", "staticmethod", "coroutinefunction", "coroutinemethod",
    "note", "warning", "seealso", "describe", "opcode", "envvar", "option",
    "impl-detail", "versionchanged", "versionadded", "deprecated", "glossary",
}

ROLE = re.compile(r":[\w:+-]+:`(~?)([^`<]*?)\s*(?:<[^`>]*>)?`")
LINK = re.compile(r"`([^`<]+?)\s*<[^`>]*>`__?")
LITERAL = re.compile(r"``([^`]+)``")
PLAIN_REF = re.compile(r"`([^`]+)`_*")
EMPHASIS = re.compile(r"\*\*?([^*\s][^*]*?)\*?\*")
SUBST = re.compile(r"\|[\w-]+\|")
SPACES = re.compile(r"\s+")
# A field-list item or directive option (`:param x: ...`, `:noindex:`), not
# an inline role (`:exc:`OverflowError``) that starts a line.
FIELD = re.compile(r"^:[\w ,.-]+:(?:\s+|$)")


@dataclass
class Section:
    source: str
    title: str
    paragraphs: list


def fetch_sources(work: Path) -> Path:
    """Downloads and unpacks the Debian package (no install, no root needed)."""
    debs = list(work.glob(f"{DEB_PACKAGE}_*.deb"))
    if not debs:
        subprocess.run(["apt-get", "download", DEB_PACKAGE], cwd=work, check=True)
        debs = list(work.glob(f"{DEB_PACKAGE}_*.deb"))
    root = work / "unpacked"
    if not (root / SOURCES).is_dir():
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(root)], check=True)
    return root / SOURCES


def inline(text: str) -> str:
    def role(m):
        name = m.group(2).strip()
        if m.group(1) == "~":
            name = name.split(".")[-1]
        return name
    text = ROLE.sub(role, text)
    text = LINK.sub(r"\1", text)
    text = LITERAL.sub(r"\1", text)
    text = PLAIN_REF.sub(r"\1", text)
    text = EMPHASIS.sub(r"\1", text)
    text = SUBST.sub("", text)
    text = text.replace("\\", "")
    return SPACES.sub(" ", text).strip()


def is_underline(line: str) -> bool:
    s = line.strip()
    return len(s) >= 3 and len(set(s)) == 1 and s[0] in HEADING_CHARS


def indent_of(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def parse(path: Path, name: str) -> list:
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    sections, title, paras, buf = [], None, [], []
    skip_deeper_than = None  # drop lines indented past this (code, tables, comments)

    def flush_para():
        if buf:
            text = inline(" ".join(buf))
            if text.endswith("::"):
                text = text[:-1]
            if len(text) > 1 and not text.startswith(">>>"):
                paras.append(text)
            buf.clear()

    def flush_section():
        flush_para()
        if title and paras:
            sections.append(Section(name, title, list(paras)))
        paras.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if skip_deeper_than is not None:
            if not stripped or indent_of(line) > skip_deeper_than:
                i += 1
                continue
            skip_deeper_than = None
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if is_underline(line) and i + 2 < len(lines) and is_underline(lines[i + 2]):
            flush_section()  # overlined title
            title = inline(nxt)
            i += 3
            continue
        if stripped and not is_underline(line) and is_underline(nxt) and len(nxt.strip()) >= len(stripped) - 2:
            flush_section()
            title = inline(stripped)
            i += 2
            continue
        if not stripped:
            flush_para()
            i += 1
            continue
        if stripped.startswith(".. "):
            flush_para()
            m = re.match(r"\.\. ([\w:-]+)::\s*(.*)", stripped)
            kind = m.group(1).split(":")[-1] if m else None
            if kind in PROSE_DIRECTIVES:
                # Keep the body, one level in; the signature line itself is code.
                i += 1
                while i < len(lines) and FIELD.match(lines[i].strip()):
                    i += 1
                continue
            skip_deeper_than = indent_of(line)
            i += 1
            continue
        if stripped.startswith((">>>", "...", "+-", "===", "|")) or stripped.startswith("$ "):
            flush_para()
            skip_deeper_than = indent_of(line) - 1 if stripped.startswith(">>>") else None
            i += 1
            continue
        if buf and buf[-1].endswith("::"):
            pass
        if stripped.endswith("::") and not stripped.startswith(":"):
            buf.append(stripped)
            flush_para()
            skip_deeper_than = indent_of(line)
            i += 1
            continue
        if re.match(r"^([*-]|\d+\.|#\.) ", stripped):
            flush_para()
            stripped = re.sub(r"^([*-]|\d+\.|#\.) ", "", stripped)
        if FIELD.match(stripped):
            flush_para()
            stripped = FIELD.sub("", stripped)
            if not stripped:
                i += 1
                continue
        buf.append(stripped)
        i += 1
    flush_section()
    return sections


def section_chunks(section: Section) -> list:
    """A section's prose in pieces of at most MAX_SECTION_CHARS, cut between paragraphs."""
    chunks, out, size = [], [], 0
    for p in section.paragraphs:
        if size + len(p) > MAX_SECTION_CHARS and out:
            chunks.append("\n\n".join(out))
            out, size = [], 0
        out.append(p)
        size += len(p)
    if out:
        chunks.append("\n\n".join(out))
    return chunks


def request_for(title: str) -> str:
    """The user's turn for a section: its title, asked."""
    title = title.rstrip(". ")
    if title.endswith("?"):
        return title
    return f"Explain {title[0].lower() + title[1:] if title[:2] != title[:2].upper() else title}."


def load_sections(work: Path) -> list:
    root = fetch_sources(work)
    files = sorted(p for part in INCLUDED_PARTS for p in (root / part).rglob("*.rst.txt"))
    files += [root / f for f in INCLUDED_FILES]
    sections = []
    for f in files:
        for s in parse(f, str(f.relative_to(root))):
            for text in section_chunks(s):
                if len(text) >= MIN_SECTION_CHARS:
                    sections.append(Section(s.source, s.title, text))
    return sections


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        secs = load_sections(Path(d))
        total = sum(len(s.paragraphs) for s in secs)
        print(f"{len(secs)} sections, {total / 1e6:.1f} M characters")
        import random
        for s in random.Random(1).sample(secs, 4):
            print(f"--- {s.source}: {request_for(s.title)}\n{s.paragraphs[:600]}\n")
