"""Fixtures shared by the Python tests."""
import pytest


@pytest.fixture
def report(capsys):
    """print() that reaches the terminal even when pytest captures output."""
    def _print(*args):
        with capsys.disabled():
            print(*args, flush=True)
    return _print
