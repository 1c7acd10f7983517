"""The hint of ``hpcstack lock`` when a package needs a newer Python than ``PipWheels``'
``min_python``: it names the Python uv proposes, not a fixed one (uv's stderr as uv 0.9 writes it
for scipy 1.18.1 with ``--python-version 3.11``)."""

import pytest

from hpcstack.install.lockgen import UvCompileError, needed_python

pytestmark = pytest.mark.unit

SCIPY_311 = """  × No solution found when resolving dependencies for split (markers: python_full_version == '3.11.*'):
  ╰─▶ Because the requested Python version (>=3.11) does not satisfy Python>=3.12 and scipy==1.18.1 depends on Python>=3.12, we can conclude that scipy==1.18.1 cannot be used.
      And because only scipy<=1.18.1 is available and you require scipy==1.18.1, we can conclude that your requirements are unsatisfiable.

      hint: The `requires-python` value (>=3.11) includes Python versions that are not supported by your dependencies (e.g., scipy==1.18.1 only supports >=3.12). Consider using a more restrictive `requires-python` value (like >=3.12).
"""


def test_the_hint_names_the_python_uv_proposes():
    error = UvCompileError("1.0.pypi.lock", SCIPY_311, "1.0", "3.11")
    last = error.lines()[-1]
    assert "PipWheels('1.0', min_python=\"3.12\")" in last, last
    assert "Python >= 3.11" in last and "older release" in last, last
    assert error.lines()[0] == "uv pip compile failed for 1.0.pypi.lock:"


def test_without_uvs_proposal_the_hint_names_the_next_minor_version():
    assert needed_python(["hint: The `requires-python` value (>=3.10) includes …"], "3.10") == "3.11"
    assert needed_python(["… (like >=3.13)."], "3.10") == "3.13"


def test_no_hint_where_uv_does_not_speak_of_requires_python():
    error = UvCompileError("1.0.pypi.lock", "error: Failed to fetch: https://pypi.org/simple/x/\n", "1.0", "3.10")
    assert not any("min_python" in line for line in error.lines())
