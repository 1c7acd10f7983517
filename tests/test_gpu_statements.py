"""What the docs say about the GPUs a PyTorch recipe serves is what its GPU-architecture record says.

Each recipe's ``<lock>.gpu-archs.json`` (read from the real wheels by ``hpcstack lock`` with
cuobjdump) is the truth: the lowest compute capability on which *every* library of *every*
recorded wheel runs (:meth:`hpcstack.install.gpuarch.WheelArchs.unsupported`). Every sentence of
the README, the recipe's page, the recipe's docstring and its validation file that says "compute
capability X … and newer" must give that X, and the T4 (7.5) and V100 (7.0) must be named as
refused where the record refuses them.
"""

from __future__ import annotations

import re

import pytest

from conftest import REPO
from hpcstack.install.gpuarch import cc_text, load_records

pytestmark = pytest.mark.unit

#: Per recipe, its GPU-architecture record and the files that state what it serves.
STATEMENTS = {
    "pytorch/2.14.1-gpu": ("recipes/pytorch/2.14.1-gpu.pypi.gpu-archs.json",
                           ["README.md", "docs/recipe-pytorch-next.md", "recipes/pytorch/2.14.1-gpu.py",
                            "recipes/pytorch/2.14.1-gpu.validation.yaml"]),
}

#: Compute capabilities (times ten) of the GPUs the docs speak of, lowest first.
CAPABILITIES = (50, 60, 70, 75, 80, 86, 89, 90, 100, 120)


def lowest_served(record: str) -> int:
    """The lowest capability of :data:`CAPABILITIES` that every recorded wheel runs on in full
    (every newer one too)."""
    wheels = load_records(str(REPO / record)).values()
    assert wheels, record
    served = [cc for cc in CAPABILITIES if not any(w.unsupported([cc]) for w in wheels)]
    lowest = served[0]
    assert served == [cc for cc in CAPABILITIES if cc >= lowest], served  # nothing newer refused
    return lowest


@pytest.mark.parametrize("recipe", sorted(STATEMENTS))
def test_every_statement_of_the_lowest_compute_capability_matches_the_record(recipe):
    record, files = STATEMENTS[recipe]
    lowest = cc_text(lowest_served(record))
    stated = []
    for name in files:
        text = " ".join((REPO / name).read_text().split())  # sentences span lines
        for m in re.finditer(r"compute capability (\d+\.\d+)[^.;:]{0,40}? and newer", text):
            stated.append((name, m.group(1)))
    assert {n for n, _ in stated} == set(files), f"files that no longer state it: {set(files) - {n for n, _ in stated}}"
    wrong = [(n, v) for n, v in stated if v != lowest]
    assert wrong == [], f"the record ({record}) says {lowest} and newer"


def test_the_2_14_1_record_refuses_the_t4_and_the_v100():
    assert lowest_served(STATEMENTS["pytorch/2.14.1-gpu"][0]) == 80
