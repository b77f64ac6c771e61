"""The course's website (`make site`), built here from the stored outputs and opened page by page in
headless Chromium: every page loads without a console error, every picture renders, every link
within the site resolves (anchors included), the navigation follows the lesson order, each page
carries its Colab, Kaggle and download links, 'lesson NN' in the prose links that lesson, and the
search finds a page by a word in it."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import pytest

import site_build
from conftest import ROOT

sys.path.insert(0, str(ROOT / "site"))
from course_site import hosted  # noqa: E402  (the site's own copy of mpcourse.hosted)

from mpcourse.course import LESSONS  # noqa: E402

@pytest.fixture(scope="session")
def visited(site, server, browser_context):
    """Each page of the site, loaded once: its console errors, links, pictures and link bar."""
    return site_build.visit_all(browser_context, server, site)


def test_every_lesson_and_exercise_has_a_page(visited):
    for lesson in LESSONS:
        assert f"notebooks/{Path(lesson.notebook).stem}.html" in visited
    exercises = sorted(p.stem for p in (ROOT / "exercises").glob("*.ipynb"))
    assert exercises and all(f"exercises/{stem}.html" in visited for stem in exercises)


def test_every_page_loads_without_a_console_error(visited):
    failing = {name: page["errors"] for name, page in visited.items() if page["errors"]}
    assert not failing, failing


def test_every_picture_renders(visited):
    broken = {name: [i["src"] for i in page["images"] if not i["ok"]] for name, page in visited.items()}
    assert not {name: srcs for name, srcs in broken.items() if srcs}, broken
    assert sum(len(page["images"]) for page in visited.values()) >= 40, "the lessons' plots are on the pages"


def test_every_link_within_the_site_resolves(visited, site, server):
    missing = []
    for name, page in visited.items():
        for link in page["links"]:
            if not link.startswith(server):
                continue
            parsed = urlparse(link)
            target = site / unquote(parsed.path[1:])
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                missing.append(f"{name} -> {link}")
            elif parsed.fragment and target.suffix == ".html" and \
                    f'id="{parsed.fragment}"' not in target.read_text():
                missing.append(f"{name} -> {link} (no such anchor)")
    assert not missing, "\n".join(missing)


def test_the_navigation_follows_the_lesson_order(visited):
    order = [urlparse(link).path for link in visited["index.html"]["links"]]
    lessons = [f"/notebooks/{Path(lesson.notebook).stem}.html" for lesson in LESSONS]
    positions = [order.index(page) for page in lessons]
    assert positions == sorted(positions)
    first_exercise = min(i for i, path in enumerate(order) if path.startswith("/exercises/"))
    assert positions[-1] < first_exercise, "lessons first, then the exercises"


def test_each_page_links_to_colab_kaggle_and_its_notebook(visited, site, server):
    repo = hosted.repository(ROOT)
    for name, page in visited.items():
        if not name.startswith(("notebooks/", "exercises/")):
            continue
        notebook = name.removesuffix(".html") + ".ipynb"
        bar = dict(page["bar"])
        assert bar.get("Open in Colab") == repo.colab(notebook), name
        assert bar.get("Open in Kaggle") == repo.kaggle(notebook), name
        download = site / urljoin(name, bar["Download the notebook"])
        title = json.loads(download.read_text())["cells"][0]["source"][0]  # the page's own notebook
        assert title == json.loads((ROOT / notebook).read_text())["cells"][0]["source"][0], name


def test_lessons_named_in_the_prose_link_to_their_pages(visited):
    xrefs = visited["notebooks/06_training_lab.html"]["xrefs"]
    assert ["lesson 05", "05_loss_scaling.html"] in [[text.lower(), href] for text, href in xrefs]
    assert ["exercises/ex06_mixed_precision_step.ipynb", "../exercises/ex06_mixed_precision_step.html"] in xrefs


def test_search_finds_a_lesson_by_a_word_in_it(server, browser_context):
    page = browser_context.new_page()
    page.set_default_timeout(site_build.PAGE_TIMEOUT_S * 1000)
    page.goto(server + "search.html?q=GradScaler")
    # Sphinx lists results as it finds them and writes "Search finished" once all are in
    page.wait_for_function("(document.querySelector('#search-results .search-summary') || {}).textContent"
                           "?.includes('Search finished')")
    found = page.eval_on_selector_all("#search-results ul.search li a", "links => links.map(a => a.href)")
    page.close()
    assert any(re.search(r"/notebooks/05_loss_scaling\.html", link) for link in found), found
