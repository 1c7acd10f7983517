"""``hpcstack export pytorch/2.14.1-gpu --format easyconfig``: the Horovod-free recipe as an
EasyBuild easyconfig, with no recipe-specific code (reads PyPI's simple API for the file names:
integration). juwels-booster (an EasyBuild site) against the golden file
``tests/golden/pytorch-2.14.1-gpu-juwels-booster.eb`` (``HPCSTACK_UPDATE_GOLDEN=1`` regenerates
it); cirrus is refused by the GPU-architecture preflight (tests/test_pytorch_next_exports.py); perlmutter's site names its modules without
versions (``cudatoolkit``), which an easyconfig dependency cannot express: one line, exit 2, as
for pytorch/2.3.1-gpu.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import assert_golden, hpcstack

pytestmark = pytest.mark.integration

RECIPE = "pytorch/2.14.1-gpu"
GOLDEN = Path(__file__).parent / "golden"


def test_juwels_booster_easyconfig_matches_the_golden_file(tmp_path):
    out = tmp_path / "pytorch.eb"
    proc = hpcstack("export", RECIPE, "--site", "juwels-booster", "--format", "easyconfig", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    # no source build: no Horovod, no build environment, every extension a wheel from the lock
    assert "HOROVOD_" not in text and "horovodrun" not in text
    assert "('torch', '2.14.1'" in text and "('nvidia-nccl-cu13', '2.30.7'" in text
    assert "import torch; import torch.distributed" in text
    assert_golden(GOLDEN / "pytorch-2.14.1-gpu-juwels-booster.eb",
                  re.sub(r"hpcstack \d+\.\d+\.\d+\S*:", "hpcstack @VERSION@:", text))


def test_perlmutter_modules_without_versions_get_one_line(tmp_path):
    out = tmp_path / "pytorch.eb"
    proc = hpcstack("export", RECIPE, "--site", "perlmutter", "--format", "easyconfig", "-o", str(out))
    assert proc.returncode == 2 and not out.exists()
    # cudatoolkit is pinned (cudatoolkit/12.2); cray-mpich is the PE's default, without a version
    assert proc.stderr.strip() == ("error: module 'cray-mpich': an easyconfig dependency needs a "
                                   "version (NAME/VERSION)")
