"""Lesson 04 §3 at its GPU size (DIM 256, 2,000 steps) on the CPU: the three fine-tuning runs and
the assertions against `forecast_fine_tune`. The two FP16 runs dominate (CPU FP16 matmuls)."""


def test_section3_at_the_gpu_size(run_cells):
    printed = run_cells("04_master_weights.ipynb", ["e6d62d3d", "2ea09a45", "15aa6367", "374d2a60"],
                        then="assert (DIM, STEPS, DEVICE) == (256, 2000, 'cpu')")
    assert "forecast for DIM 256, 2000 steps" in printed[2]
