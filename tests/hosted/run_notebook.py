"""Run a notebook's code cells in order in a new kernel, as Colab runs them (tests/hosted).

The kernel starts in WORKDIR, which does not hold the notebook (Colab's /content, Kaggle's
/kaggle/working), and learns nothing of the notebook's path: JPY_SESSION_NAME is left out of its
environment. A cell that fails does not stop the next, as when a learner runs each cell. Runs in
the bare Python under test, which has jupyter_client (ipykernel's) but no nbformat or nbclient.

    python run_notebook.py NOTEBOOK WORKDIR [PRELOAD]   prints one JSON list, a record per code cell

PRELOAD is code run before the first cell, e.g. `import ipywidgets`: a session that loaded a
package before the bootstrap cell upgraded it.
"""
from __future__ import annotations

import json
import os
import sys

from jupyter_client.manager import start_new_kernel

CELL_TIMEOUT_S = 1800  # the first cell installs the course: generous on a busy machine


def run(notebook: str, workdir: str, preload: str = "") -> list[dict]:
    with open(notebook, encoding="utf-8") as file:
        cells = [c for c in json.load(file)["cells"] if c["cell_type"] == "code"]
    env = {k: v for k, v in os.environ.items() if k != "JPY_SESSION_NAME"}
    manager, client = start_new_kernel(kernel_name="python3", cwd=workdir, env=env, startup_timeout=120)
    try:
        if preload:
            client.execute_interactive(preload, timeout=CELL_TIMEOUT_S)
        return [_run_cell(client, c["id"] if "id" in c else "", "".join(c["source"])) for c in cells]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _run_cell(client, cell_id: str, source: str) -> dict:
    record = {"id": cell_id, "source": source, "text": "", "error": None}

    def collect(message: dict) -> None:
        kind, content = message["msg_type"], message["content"]
        if kind == "stream":
            record["text"] += content["text"]
        elif kind in ("execute_result", "display_data"):
            record["text"] += content["data"].get("text/plain", "") + "\n"
        elif kind == "error":
            record["error"] = f"{content['ename']}: {content['evalue']}"
    client.execute_interactive(source, timeout=CELL_TIMEOUT_S, output_hook=collect)
    return record


if __name__ == "__main__":
    print(json.dumps(run(*sys.argv[1:])))
