"""mkdocs hooks: README.md (the repository's front page) is the site's front page too.

The README links to ``docs/<page>.md`` (right on GitHub); on the site the pages sit next to the
front page, so those links lose their ``docs/`` prefix. Pages link back to ``../README.md``, which
on the site is ``index.md``.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent


def on_files(files, config):
    readme = (ROOT / "README.md").read_text()
    files.append(File.generated(config, "index.md", content=re.sub(r"\]\(docs/", "](", readme)))
    return files


def on_page_markdown(markdown, page, config, files):
    return markdown.replace("](../README.md", "](index.md")
