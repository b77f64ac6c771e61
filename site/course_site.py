"""The course's additions to the Sphinx site: per-page links, cross-references, downloads, MathJax.

- Above each lesson and exercise: "Open in Colab", "Open in Kaggle" and "Download the notebook",
  made from the repository URL in pyproject.toml by `mpcourse.hosted` (the same links the title
  cell carries in JupyterLab, which the site drops so that they are not shown twice).
- Cross-references: where the prose says "lesson 05" (or "lessons 04"), and where it names an
  exercise or lesson file in code (`exercises/ex06_mixed_precision_step.ipynb`), the words link
  to that page.
- Each page's notebook is copied beside it, which the download link fetches.
- MathJax is copied from the django-static-mathjax package, so the site needs no network.
"""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from docutils import nodes

ROOT = Path(__file__).resolve().parents[1]


def _load_hosted():
    """mpcourse.hosted by its path: the site builds without torch, which `import mpcourse` loads."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("mpcourse_hosted", ROOT / "mpcourse" / "hosted.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


hosted = _load_hosted()
FOLDERS = ("notebooks", "exercises")
LESSON_WORDS = re.compile(r"\b([Ll]essons? )(\d\d)\b")
MATHJAX_FOLDERS = ("output/chtml", "input/tex", "ui", "a11y")
NOTEBOOK_FILE = re.compile(r"^(?:(notebooks|exercises)/)?((?:ex)?\d\d_[A-Za-z0-9_]+)\.ipynb$")


def _pages(env) -> dict[str, str]:
    """Each lesson's number ("05") and each notebook's file stem, to its docname."""
    pages = {}
    for docname in env.found_docs:
        folder, _, stem = docname.partition("/")
        if folder in FOLDERS:
            pages[stem] = docname
            if folder == "notebooks":
                pages[stem[:2]] = docname
    return pages


def _drop_stamped_links(app, doctree) -> None:
    """The title cell's 'Open in Colab' line: the bar above the page says it already."""
    for paragraph in list(doctree.findall(nodes.paragraph)):
        first = paragraph.children[0] if paragraph.children else None
        if isinstance(first, nodes.reference) and first.astext() == "Open in Colab":
            paragraph.parent.remove(paragraph)


def _link(app, fromdocname: str, docname: str, child: nodes.Node) -> nodes.reference:
    uri = app.builder.get_relative_uri(fromdocname, docname)
    reference = nodes.reference("", "", internal=True, refuri=uri, classes=["course-xref"])
    reference += child
    return reference


def _cross_reference(app, doctree, fromdocname: str) -> None:
    """Link 'lesson NN' in prose and notebook file names in code to their pages."""
    pages = _pages(app.env)
    for literal in list(doctree.findall(nodes.literal)):
        match = NOTEBOOK_FILE.match(literal.astext())
        if match and match.group(2) in pages and not isinstance(literal.parent, nodes.reference):
            literal.parent.replace(literal, _link(app, fromdocname, pages[match.group(2)], literal.deepcopy()))
    for text in list(doctree.findall(nodes.Text)):
        parent = text.parent
        if isinstance(parent, (nodes.reference, nodes.literal, nodes.literal_block, nodes.raw,
                               nodes.FixedTextElement)) or not LESSON_WORDS.search(text):
            continue
        pieces, last = [], 0
        for match in LESSON_WORDS.finditer(text):
            target = pages.get(match.group(2))
            if target is None or target == fromdocname:
                continue
            pieces += [nodes.Text(text[last:match.start()]),
                       _link(app, fromdocname, target, nodes.Text(match.group(0)))]
            last = match.end()
        if pieces:
            pieces.append(nodes.Text(text[last:]))
            index = parent.index(text)
            parent.remove(text)
            for offset, piece in enumerate(pieces):
                parent.insert(index + offset, piece)


def links_bar(repo, docname: str) -> str:
    """The HTML bar of links above a lesson or exercise page."""
    path = f"{docname}.ipynb"
    name = Path(path).name
    target = hosted.link_target(path)
    return (f'<div class="course-links"><a href="{repo.colab(target)}">Open in Colab</a>'
            f'<a href="{repo.kaggle(target)}">Open in Kaggle</a>'
            f'<a href="{name}" download>Download the notebook</a></div>\n')


def _add_links_bar(app, pagename, templatename, context, doctree) -> None:
    if pagename.split("/")[0] in FOLDERS and "body" in context:
        context["body"] = links_bar(app.config.course_repository, pagename) + context["body"]


def _copy_files(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    for docname in app.env.found_docs:
        if docname.split("/")[0] in FOLDERS:
            shutil.copy(Path(app.srcdir) / f"{docname}.ipynb", out / f"{docname}.ipynb")
    import mathjax  # django-static-mathjax: MathJax's own files, and no Django
    es5, target = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5", out / "_static" / "mathjax"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(es5 / "tex-chtml.js", target)
    for folder in MATHJAX_FOLDERS:  # the fonts, and what tex-chtml.js loads on demand
        shutil.copytree(es5 / folder, target / folder, dirs_exist_ok=True)


def setup(app):
    app.add_config_value("course_repository", hosted.repository(ROOT), "html")
    app.connect("doctree-read", _drop_stamped_links)
    app.connect("doctree-resolved", _cross_reference)
    app.connect("html-page-context", _add_links_bar)
    app.connect("build-finished", _copy_files)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
