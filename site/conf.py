"""Sphinx configuration of the course's website (`make site`): every lesson and exercise rendered
from the outputs stored in the notebooks, which are never executed here (myst-nb's execution
mode "off"). notebooks/ and exercises/ are links to the repository's folders, so the site shows
exactly what a learner opens. CONTRIBUTING.md says why Sphinx with myst-nb.
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

project = "mpcourse"
html_title = "Mixed-precision training, from the bits up"
author = "the mpcourse authors"
extensions = ["myst_nb", "course_site", "accessible_html", "figures"]
templates_path = ["_templates"]
root_doc = "index"
exclude_patterns = ["_build", "**/.ipynb_checkpoints"]

# Render what is stored; run nothing (the outputs were checked by nbval already).
nb_execution_mode = "off"
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
# Widgets need a live kernel: the site loads no widget JavaScript (nothing from a CDN); figures.py
# shows each widget as a still view of the state the notebook saved.
nb_ipywidgets_js = {}
# Notebooks start with '# Lesson NN' and use '##' below it, as Sphinx expects; a lesson's
# '<details>' answers are raw HTML, which MyST passes through.
suppress_warnings = ["myst.header"]

html_theme = "furo"
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_show_sourcelink = False
# MathJax 3 served with the site (its files come from the django-static-mathjax package, which
# holds them and nothing else), so that the pages need no network: the course reads offline, and
# the browser test runs without one.
mathjax_path = "mathjax/tex-chtml.js"
html_favicon = "_static/favicon.svg"
html_scaled_image_link = False  # a plot shown larger than its file is not a link to the file
