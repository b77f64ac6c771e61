"""The README's commands: `make lab` serves the course, and bad set-ups get a clear message."""
import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from grading_budgets import program_backstop

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_lab_serves_lessons_and_exercises(tmp_path):
    port, token = _free_port(), secrets.token_hex(8)
    log = (tmp_path / "lab.log").open("w")
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    lab = subprocess.Popen(["make", "-C", str(ROOT), "lab", f"PORT={port}", f"TOKEN={token}"],
                           stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline, status = time.monotonic() + program_backstop(), None
        while time.monotonic() < deadline and lab.poll() is None:
            request = urllib.request.Request(f"http://127.0.0.1:{port}/api/status",
                                             headers={"Authorization": f"token {token}"})
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    status = response.status
                    break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(1)
        output = (tmp_path / "lab.log").read_text()
        assert status == 200, f"JupyterLab did not answer on port {port}:\n{output[-3000:]}"
        for folder, notebook in (("notebooks", "00_welcome.ipynb"), ("exercises", "ex00_bytes.ipynb")):
            with urllib.request.urlopen(urllib.request.Request(
                    f"http://127.0.0.1:{port}/api/contents/{folder}",
                    headers={"Authorization": f"token {token}"})) as r:
                listing = [item["name"] for item in json.loads(r.read())["content"]]
            assert notebook in listing, f"the lab does not serve {folder}/{notebook}: {folder}/ lists {listing}"
        url = f"http://127.0.0.1:{port}/lab/tree/notebooks/00_welcome.ipynb?token={token}"
        printed = time.monotonic() + program_backstop()  # it prints its URL just after it starts answering
        while url not in (tmp_path / "lab.log").read_text() and time.monotonic() < printed:
            time.sleep(1)
        assert url in (tmp_path / "lab.log").read_text(), "make lab must print the URL"
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=program_backstop())


def test_make_lab_refuses_an_old_python(tmp_path):
    fake = tmp_path / "python3.9"
    fake.write_text('#!/bin/sh\ncase "$*" in *sys.exit*) exit 1;; *) echo 3.9;; esac\n')
    fake.chmod(0o755)
    result = subprocess.run(["make", "-C", str(ROOT), "lab", f"PYTHON={fake}"], capture_output=True, text=True,
                            timeout=program_backstop())
    assert result.returncode != 0
    assert f"mpcourse needs Python 3.10 or newer, but PYTHON={fake} is 3.9" in result.stderr
    assert "PYTHON=python3.11" in result.stderr


def test_make_lab_names_a_missing_python():
    result = subprocess.run(["make", "-C", str(ROOT), "lab", "PYTHON=/nonexistent/python"], capture_output=True,
                            text=True, timeout=program_backstop())
    assert result.returncode != 0 and "is not found" in result.stderr
