"""Lesson 08 §5 at its GPU size. Its five two-process runs at d_model 256 and 100 steps cannot
finish on two CPU cores in reasonable time, so the rehearsal checks the size branch the cell takes
there: the bounds measured at the CPU size are not applied to the GPU configuration, and why is
printed. (tests/test_gpu_yardsticks.py holds the same against the old code.)"""


def test_section5_bounds_follow_the_size(run_cells):
    printed = run_cells("08_distributed.ipynb", ["c8059197"], then="""
check = drift_bounds(GPU_CONFIG)
print(check.reason)
assert check.bounds is None and drift_bounds(CPU_CONFIG).bounds is not None
assert CONFIG is CPU_CONFIG   # on a CPU the processes run at the CPU size, rehearsal or not
""")
    assert "only the order is checked" in printed[-1]
