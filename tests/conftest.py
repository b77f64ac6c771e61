import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run faster on one thread (no hand-off costs), above all on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
