"""`make gpu-rehearsal`: chosen cells of a lesson, run at its GPU size on the CPU.

Each `rehearse_*.py` file names the cells of one lesson whose conclusion depends on the size and
runs them with the `run_cells` fixture in a fresh kernel, under `MPCOURSE_GPU_REHEARSAL=1`, so that
`mpcourse.machine.hardware.scaled` hands the lesson its CUDA sizes while DEVICE stays "cpu".
A failing assertion in a cell fails the rehearsal with the cell's traceback.
"""
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from mpcourse.machine.hardware import GPU_REHEARSAL_VARIABLE, rehearsing_gpu

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@pytest.fixture
def run_cells():
    """`_run_cells`; fails without the variable, where the lessons would take their CPU sizes."""
    if not rehearsing_gpu():
        pytest.fail(f"the GPU rehearsal needs {GPU_REHEARSAL_VARIABLE}=1 (run it as `make gpu-rehearsal`)")
    return _run_cells


def _run_cells(notebook: str, cell_ids: list[str], then: str = "", setup: str = "",
               timeout_s: int = 3600) -> list[str]:
    """Run the code `setup`, then the cells `cell_ids` of `notebooks/<notebook>` in the notebook's
    order, then the code `then` (a check on the kernel's state); return each cell's printed text."""
    nb = nbformat.read(NOTEBOOKS / notebook, as_version=4)
    known = {cell.get("id") for cell in nb.cells}
    missing = [cell_id for cell_id in cell_ids if cell_id not in known]
    if missing:
        raise ValueError(f"{notebook} has no cell {', '.join(missing)}")
    nb.cells = [cell for cell in nb.cells if cell.get("id") in cell_ids]
    if setup:
        nb.cells.insert(0, nbformat.v4.new_code_cell(setup))
    if then:
        nb.cells.append(nbformat.v4.new_code_cell(then))
    env = {**os.environ, GPU_REHEARSAL_VARIABLE: "1", "MPLBACKEND": "Agg"}
    client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    with client.setup_kernel(env=env):
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
    return ["".join(out.get("text", "") for out in cell.get("outputs", [])) for cell in nb.cells]
