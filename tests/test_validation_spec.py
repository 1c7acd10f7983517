"""A recipe's declared validation: its program, backends, figures, sanity and references, read
from its validation file and used by the job scripts, the judge and the report for any recipe
(here the mpi4py one, and files written by the tests)."""

from __future__ import annotations

import pytest
import yaml

from conftest import REPO
from hpcstack.errors import ConfigError
from hpcstack.recipe import load_recipe
from hpcstack.site import load_site
from hpcstack.validate.judge import RunOutcome, judge, startup_summary
from hpcstack.validate.render import to_markdown
from hpcstack.install.components.validation import Figure, Validation, validation_of

pytestmark = pytest.mark.unit

MPI4PY = REPO / "recipes" / "mpi4py" / "4.1.2.validation.yaml"


def spec_of(site="localhost"):
    s = load_site(site)
    return s, validation_of(load_recipe("mpi4py/4.1.2", s))


def test_the_program_gets_its_placeholders_and_options():
    site, spec = spec_of()
    argv = spec.program.argv(spec.workload(site, "debug"), prefix="/p", backend="mpi", output="o.jsonl",
                             threads=1, ranks=2, nodes=2)
    assert argv == ["/p/bin/mpi4py-validate", "--ring-bytes", "1", "--ring-loops", "1000",
                    "--pingpong-loops", "1000", "--pingpong-max-bytes", "4194304", "--output", "o.jsonl"]
    assert spec.program.executable("/p") == "/p/bin/mpi4py-validate"
    assert spec.backends == ["mpi"] and spec.local_backends == ["mpi"]
    assert spec.figures["latency"].unit == "us" and list(spec.figures) == ["latency", "bandwidth", "ring_time"]


@pytest.mark.parametrize("change, expected", [
    ({"backends": ["mpi", "nccl"]}, "backends.1: unknown backend 'nccl' (known: ddp, horovod, mpi)"),
    ({"program": {"command": ["{bin}/x", "{rank}"]}}, "program.command.1: '{rank}': unknown placeholder"),
    ({"references": {"x:y": {"1": {"speed": [1, None, None, "us"]}}}}, "references.x:y.1.speed: unknown key"),
    ({"workloads": {"cpu": {"ring_loops": 0}}}, "workloads.cpu.ring_loops: 0 is less than the minimum of 1"),
    ({"figures": {"f": {"record": "r"}}}, "figures.f:"),
])
def test_a_bad_validation_file_gives_one_line_naming_the_key(tmp_path, change, expected):
    data = yaml.safe_load(MPI4PY.read_text())
    data.update(change)
    (tmp_path / "v.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        Validation("v.yaml").load(tmp_path)
    problems = err.value.problems
    assert any(expected in p for p in problems), problems
    assert all(p.startswith(f"{tmp_path / 'v.yaml'}: ") for p in problems)


def records(latency, bandwidth, ranks):
    return ([{"record": "config", "world_size": ranks, "transport": "Open MPI v4.1.4"},
             {"record": "pingpong", "latency_us": latency, "bandwidth_mb_s": bandwidth},
             {"record": "ringtest", "time_per_loop_us": 3.0}]
            + [{"record": "startup", "rank": r, "imports_s": 0.2 + r, "first_step_s": 0.5 + r} for r in range(ranks)]
            + [{"record": "result", "ok": True, "reasons": []}])


def test_the_judge_and_report_use_the_declared_figures_and_startup():
    site, spec = spec_of()
    figures = {**spec.figures, "bandwidth_scaling": Figure("bandwidth_scaling", "", scaling_of="bandwidth",
                                                           label="bandwidth vs 1 node")}
    runs = [RunOutcome("mpi", 1, 1, "7", "COMPLETED", "0:0", 0, records(40.0, 1000.0, 1)),
            RunOutcome("mpi", 2, 2, "8", "COMPLETED", "0:0", 0, records(400.0, 1500.0, 2))]
    refs = {"localhost:debug": {"*": {"latency": [40.0, None, 1.0, "us"]}}}
    verdict = judge(runs, site="localhost", partition="debug", recipe="mpi4py/4.1.2", references=refs,
                    figures=figures, every_rank=spec.every_rank)
    one, two = verdict.runs
    assert one.ok and not two.ok
    assert two.figures["bandwidth_scaling"].value == pytest.approx(1500 / (2 * 1000))
    assert "latency 400.0 us is 320.0 us (400.0 %) above the upper bound 80.0 us" in verdict.failures[0]
    assert two.startup == {"ranks": 2, "imports_s": {"median": pytest.approx(0.7), "max": pytest.approx(1.2)},
                           "first_step_s": {"median": pytest.approx(1.0), "max": pytest.approx(1.5)}}
    doc = verdict.to_dict()
    assert doc["scaling"]["mpi"]["2"]["value"] == 1500.0 and doc["scaling"]["mpi"]["2"]["unit"] == "MB/s"
    md = to_markdown(doc)
    assert "| backend | nodes | ranks | job | latency 1 B | bandwidth 4 MiB | ring loop | bandwidth vs 1 node |" in md
    assert "- mpi on 2 node(s), 2 rank(s): imports done 0.70 s median, 1.20 s max" in md
    assert "Collectives check" not in md                       # the program has none


def test_a_rank_without_its_every_rank_record_fails_sanity():
    site, spec = spec_of()
    recs = [r for r in records(40.0, 1000.0, 2) if not (r["record"] == "startup" and r["rank"] == 1)]
    verdict = judge([RunOutcome("mpi", 1, 2, "7", "COMPLETED", "0:0", 0, recs)], site="localhost",
                    partition="debug", recipe="mpi4py/4.1.2", references={}, figures=spec.figures,
                    every_rank=spec.every_rank)
    assert verdict.failures == ["sanity: mpi on 1 node(s) (job 7): startup reported for ranks [0], expected 0..1"]
    assert startup_summary([]) is None
