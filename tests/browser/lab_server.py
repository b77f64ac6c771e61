"""Start JupyterLab for a browser test: localhost, a free port, a token, nothing written to the course.

The server's settings and state live in a throwaway folder. Autosave is off, so running a lesson
in the browser never rewrites the notebook on disk. Windowing stays at JupyterLab's default,
"contentVisibility": every cell is in the page (and can be checked), and the browser skips
painting the ones off screen.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

#: JupyterLab settings for a test run, keyed by plugin id.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension:plugin": {"autosave": False},
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "contentVisibility"},
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
}


@dataclass
class Lab:
    """A running JupyterLab: where it listens and how to talk to it."""
    url: str
    token: str
    process: subprocess.Popen
    log: Path
    root: Path       # the folder the server serves; notebooks are named relative to it

    def lab_url(self, notebook: str) -> str:
        return f"{self.url}/lab/tree/{notebook}?token={self.token}&reset"

    def api(self, path: str, method: str = "GET"):
        request = urllib.request.Request(f"{self.url}/api/{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def shut_down_kernels(self) -> None:
        """Stop the kernels running now, so the next lesson does not share the CPU or memory with
        them. The shutdowns (a few seconds each) finish in the background."""
        sessions = [session["id"] for session in self.api("sessions")]

        def shut_down() -> None:
            for session in sessions:
                try:
                    self.api(f"sessions/{session}", method="DELETE")
                except (urllib.error.URLError, ConnectionError):
                    return  # the server is stopping, and its kernels with it
        threading.Thread(target=shut_down, daemon=True).start()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lab(root_dir: Path, state_dir: Path, timeout_s: float = 120) -> Lab:
    """JupyterLab serving `root_dir` on 127.0.0.1, its config and settings under `state_dir`."""
    settings = state_dir / "lab-settings"
    for plugin, values in LAB_SETTINGS.items():
        package, name = plugin.split(":")
        path = settings / package / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(state_dir / "config"),
               JUPYTER_DATA_DIR=str(state_dir / "data"), JUPYTER_RUNTIME_DIR=str(state_dir / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(state_dir / "workspaces"))
    port, token = free_port(), secrets.token_hex(16)
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root_dir}"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    log = state_dir / "jupyterlab.log"
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    lab = Lab(f"http://127.0.0.1:{port}", token, process, log, root_dir)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            lab.api("status")
            return lab
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.5)
    lab.stop()
    raise RuntimeError(f"JupyterLab did not answer within {timeout_s} s:\n{log.read_text()[-3000:]}")
