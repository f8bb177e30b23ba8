"""The report's two documents rendered from one list of sections (title, paragraphs, tables, images, code):
Markdown, and a self-contained HTML page (pictures inlined as PNG data URIs; no scripts, no external files).
Both come from the same sections, so they can never disagree."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Section:
    title: str
    text: list[str] = field(default_factory=list)  # paragraphs (plain text)
    tables: list[tuple[list[str], list[list[str]]]] = field(default_factory=list)
    images: list[tuple[str, Path]] = field(default_factory=list)  # (caption, png)
    code: list[str] = field(default_factory=list)


def markdown(title: str, sections: list[Section], out: Path, header: str = "") -> str:
    """report.md: the sections as Markdown, the pictures linked relative to `out`."""
    lines = [f"# {title}", ""] + ([header, ""] if header else [])
    for s in sections:
        lines += [f"## {s.title}", ""]
        for p in s.text:
            lines += [p, ""]
        for head, rows in s.tables:
            lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows] + [""]
        for cap, png in s.images:
            lines += [f"![{cap}]({png.relative_to(out)})", ""]
        for c in s.code:
            lines += ["```bash", c, "```", ""]
    return "\n".join(lines)


CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}"
    "th{background:#f3f3f3}pre{background:#f6f8fa;padding:.8em;overflow-x:auto;white-space:pre-wrap}"
    "img{max-width:100%}.error{color:#b00020;font-weight:bold}.machine{color:#555}"
)


def html_page(title: str, sections: list[Section], header: str = "") -> str:
    """report.html: the sections as one self-contained page (pictures inlined as PNG data URIs, no scripts)."""
    e = html.escape
    parts = [
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{e(title)}</title>"
        f"<style>{CSS}</style></head><body><h1>{e(title)}</h1>"
    ]
    if header:
        parts.append(f"<p class='machine'>{e(header)}</p>")
    for s in sections:
        parts.append(f"<h2>{e(s.title)}</h2>")
        parts += [f"<p>{e(p)}</p>" for p in s.text]
        for head, rows in s.tables:
            parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
            for row in rows:
                cls = " class='error'" if row and row[0] == "error" else ""
                parts.append(f"<tr{cls}>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>")
            parts.append("</table>")
        for cap, png in s.images:
            data = base64.b64encode(png.read_bytes()).decode()
            parts.append(
                f"<figure><img alt='{e(cap)}' src='data:image/png;base64,{data}'>"
                f"<figcaption>{e(cap)}</figcaption></figure>"
            )
        parts += [f"<pre><code>{e(c)}</code></pre>" for c in s.code]
    parts.append("</body></html>")
    return "\n".join(parts)
