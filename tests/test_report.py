"""Judging (hpcstack.validate.judge: sanity, performance references) and rendering
(hpcstack.validate.render: JSON, markdown, PNG) of the validation report, on made-up records."""

from __future__ import annotations

import json

import pytest

from hpcstack.validate.judge import (FigureOutcome, Reference, RunOutcome, Verdict, build_report, judge,
                                     lookup_references, scaling_efficiency)
from hpcstack.validate.render import to_markdown, write_report

pytestmark = pytest.mark.unit


def records(img_per_rank: float, ranks: int, ok: bool = True, reasons=(), transport: str = "gloo") -> list[dict]:
    """Records as the training program writes them (only the fields the report reads)."""
    out = [{"record": "config", "world_size": ranks, "transport": transport}]
    out += [{"record": "throughput", "rank": r, "img_per_sec_mean": img_per_rank, "img_per_sec_ci95": 1.0}
            for r in range(ranks)]
    out.append({"record": "throughput_total", "img_per_sec": img_per_rank * ranks,
                "img_per_sec_ci95": 2.0, "world_size": ranks})
    out.append({"record": "result", "ok": ok, "reasons": list(reasons)})
    return out


def run(backend: str, nodes: int, img_per_rank: float, *, tasks: int = 1, **kw) -> RunOutcome:
    defaults = dict(job_id=str(100 + nodes), job_state="COMPLETED", job_exit_code="0:0", exit_status=0)
    defaults.update({k: kw.pop(k) for k in list(kw) if k in defaults})
    return RunOutcome(backend, nodes, nodes * tasks, records=records(img_per_rank, nodes * tasks, **kw),
                      **defaults)


REFS = {
    "x:gpu": {"*": {"throughput_per_rank": [300, -0.1, None, "img/s"]},
              "2": {"scaling_efficiency": [0.9, -0.1, 0.12, ""]}},
    "x:*": {"*": {"throughput_per_rank": [1, None, None, "img/s"], "throughput_total": [1, None, None, "img/s"]}},
}


def report(runs, refs=REFS, **kw):
    return build_report(runs, site="x", partition="gpu", recipe="pytorch/2.3.1-gpu", references=refs, **kw)


# ----------------------------------------------------------------------------- references

def test_reference_bounds_are_relative_and_open_where_null():
    assert Reference(300, -0.1, None, "img/s").bounds() == pytest.approx((270, None))
    assert Reference(0.9, -0.1, 0.12, "").bounds() == pytest.approx((0.81, 1.008))


def test_reference_check_names_the_figure_the_bound_and_the_miss():
    msg = Reference(300, -0.1, None, "img/s").check("throughput_per_rank", 243.0)
    assert msg.startswith("throughput_per_rank 243.0 img/s is 27.0 img/s (10.0 %) below the lower bound 270.0 img/s")
    assert "reference 300.0 img/s, -10 %" in msg
    assert Reference(300, -0.1, None, "img/s").check("t", 270.0) is None
    assert "above the upper bound" in Reference(0.9, -0.1, 0.1, "").check("scaling_efficiency", 1.2)


def test_lookup_prefers_site_partition_and_node_count_over_wildcards():
    refs = lookup_references(REFS, "x", "gpu", 2)
    assert refs["throughput_per_rank"].value == 300          # x:gpu "*" beats x:* "*"
    assert refs["throughput_total"].value == 1               # only in x:*
    assert refs["scaling_efficiency"].value == 0.9           # x:gpu "2"
    assert "scaling_efficiency" not in lookup_references(REFS, "x", "gpu", 1)
    assert lookup_references(REFS, "y", "gpu", 1) == {}


def test_scaling_efficiency_definition():
    assert scaling_efficiency(180.0, 100.0, 2) == pytest.approx(0.9)
    with pytest.raises(ValueError):
        scaling_efficiency(1.0, 0.0, 2)


# ----------------------------------------------------------------------------- verdicts

def test_all_within_references_passes_with_efficiency_per_backend():
    rep = report([run("horovod", 1, 310), run("horovod", 2, 300), run("ddp", 1, 320), run("ddp", 2, 304)])
    assert rep["ok"] is True and rep["failures"] == []
    by = {(r["backend"], r["nodes"]): r for r in rep["runs"]}
    assert by[("horovod", 2)]["figures"]["scaling_efficiency"]["value"] == pytest.approx(600 / 620)
    assert by[("ddp", 2)]["figures"]["scaling_efficiency"]["value"] == pytest.approx(0.95)
    assert by[("ddp", 1)]["figures"]["scaling_efficiency"]["value"] == pytest.approx(1.0)
    assert rep["scaling"]["horovod"]["2"]["img_per_sec"] == pytest.approx(600)


def test_figure_below_reference_fails_naming_backend_nodes_and_figure():
    rep = report([run("horovod", 1, 310), run("horovod", 2, 200)])
    assert rep["ok"] is False
    perf = [f for f in rep["failures"] if f.startswith("performance:")]
    assert any("horovod on 2 node(s) (job 102): throughput_per_rank 200.0 img/s is 70.0 img/s" in f for f in perf), perf
    assert any("scaling_efficiency 0.645 is 0.165 (20.4 %) below the lower bound 0.810" in f for f in perf), perf
    r1 = next(r for r in rep["runs"] if r["nodes"] == 1)
    assert r1["ok"] is True


def test_program_reasons_fail_sanity_and_skip_performance():
    rep = report([run("ddp", 1, 310, ok=False, reasons=["final loss 1.5 not below threshold 0.01"],
                       exit_status=1, job_state="FAILED", job_exit_code="1:0")])
    r = rep["runs"][0]
    assert rep["ok"] is False and r["ok"] is False
    assert "final loss 1.5 not below threshold 0.01" in r["sanity"]
    assert "exit status 1" in r["sanity"]
    assert r["figures"]["throughput_per_rank"]["message"] == "not measured: sanity failed"


def test_job_that_died_names_job_id_and_state():
    dead = RunOutcome("horovod", 2, 2, "4711", "TIMEOUT", "0:15", None, [], "/o/slurm-4711.out", ["last line"])
    rep = report([dead], jobs=[{"job_id": "4711", "nodes": 2, "state": "TIMEOUT", "exit_code": "0:15",
                                "output": "/o/slurm-4711.out", "output_tail": ["last line"]}])
    assert rep["ok"] is False
    assert rep["failures"][0] == "job 4711 (2 node(s)) ended TIMEOUT with exit code 0:15; see /o/slurm-4711.out"
    assert "did not finish: job 4711 ended TIMEOUT (exit code 0:15)" in rep["failures"][1]
    md = to_markdown(rep)
    assert "Last lines of job 4711" in md and "last line" in md and md.rstrip().endswith("**FAIL**")


def test_wrong_rank_count_and_missing_transport_fail_sanity():
    r = run("horovod", 2, 300, tasks=4, transport="horovod-mpi")
    r.ranks = 4
    rep = report([r], required_transport="nccl")
    reasons = rep["runs"][0]["sanity"]
    assert any("ran on 8 ranks, expected 4" in x for x in reasons), reasons
    assert any("does not use nccl" in x for x in reasons), reasons


def test_efficiency_needs_a_one_node_run():
    rep = report([run("horovod", 2, 300)])
    fig = rep["runs"][0]["figures"]["scaling_efficiency"]
    assert fig["value"] is None and fig["ok"] is None
    assert "needs a 1-node run" in fig["message"]
    assert rep["ok"] is True


def test_judging_gives_outcome_objects_and_the_document_is_their_dict():
    verdict = judge([run("horovod", 1, 310), run("horovod", 2, 200)], site="x", partition="gpu",
                    recipe="pytorch/2.3.1-gpu", references=REFS)
    assert isinstance(verdict, Verdict) and verdict.system == "x:gpu" and verdict.ok is False
    two = verdict.runs[1]
    fig = two.figures["throughput_per_rank"]
    assert isinstance(fig, FigureOutcome) and fig.value == pytest.approx(200) and fig.ok is False
    assert fig.reference == Reference(300, -0.1, None, "img/s")
    assert two.ok is False and verdict.runs[0].ok is True
    doc = verdict.to_dict()
    assert list(doc) == ["ok", "site", "system", "recipe", "generated", "output_dir", "settings", "jobs",
                         "runs", "scaling", "failures"]
    assert doc["runs"][1]["figures"]["throughput_per_rank"]["bounds"] == pytest.approx([270, None])
    assert doc["failures"] == verdict.failures and json.loads(json.dumps(doc)) == doc


def test_judging_never_imports_rendering():
    import ast

    import hpcstack.validate.judge as judge_module

    tree = ast.parse(open(judge_module.__file__).read())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and ("render" in m or "matplotlib" in m or m == "json")}, imported


# ----------------------------------------------------------------------------- files

def test_write_report_gives_json_markdown_and_png(tmp_path):
    rep = report([run("horovod", 1, 310), run("horovod", 2, 300), run("ddp", 1, 320), run("ddp", 2, 150)],
                 settings={"model": "tiny", "batch_size": 16})
    paths = write_report(rep, tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["ok"] is False
    md = (tmp_path / "report.md").read_text()
    assert "| backend | nodes | ranks | job | img/s total | img/s per rank | scaling efficiency |" in md
    assert "| horovod | 2 | 2 | 102 | 600.0 ✓ | 300.0 ✓ | 96.8 % ✓ | PASS | PASS |" in md
    assert "| ddp | 2 | 2 | 102 | 300.0 ✓ | 150.0 ✗ | 46.9 % ✗ | PASS | FAIL |" in md
    assert "- 2 node(s), scaling_efficiency: 0.900 (-10 %, +12 %): accepted 0.810 .. 1.008" in md
    png = (tmp_path / "scaling.png").read_bytes()
    assert paths["plot"] == str(tmp_path / "scaling.png") and png[:8] == b"\x89PNG\r\n\x1a\n"


def test_nothing_to_plot_writes_no_png(tmp_path):
    dead = RunOutcome("ddp", 1, 1, "9", "CANCELLED", "0:0", None)
    paths = write_report(report([dead]), tmp_path)
    assert "plot" not in paths and not (tmp_path / "scaling.png").exists()


# ----------------------------------------------------------------------------- references with the recipe

def _validation(site_name: str):
    from hpcstack.recipe import load_recipe
    from hpcstack.site import load_site
    from hpcstack.install.components.validation import validation_of

    site = load_site(site_name)
    recipe = load_recipe("pytorch/2.3.1-gpu", site)
    return site, recipe, validation_of(recipe)


def test_cirrus_references_come_from_the_published_v100_figures():
    site, recipe, spec = _validation("cirrus")
    refs = lookup_references(spec.references, "cirrus", site.slurm["partition"], 2)
    assert refs["throughput_per_rank"] == Reference(367.0, -0.25, 0.15, "img/s")   # NVIDIA, 1 V100 FP32
    assert refs["throughput_total"].value == 2855.0                                # NVIDIA, 8 V100 FP32
    assert refs["scaling_efficiency"].value == 0.9                                 # Horovod docs
    text = (recipe.directory / "2.3.1-gpu.validation.yaml").read_text()
    assert "DeepLearningExamples" in text and "Horovod docs" in text
    assert spec.workload(site, "gpu")["model"] == "resnet50" and spec.workload(site, "gpu")["device"] == "cuda"


def test_localhost_references_are_only_lower_bounds():
    site, _, spec = _validation("localhost")
    assert spec.workload(site, "debug")["model"] == "tiny"              # no GPUs: the cpu workload
    for nodes in (1, 2):
        refs = lookup_references(spec.references, "localhost", "debug", nodes).values()
        assert refs
        for ref in refs:  # one-sided, catching a broken run only: a floor for rates, a ceiling for times
            if ref.unit == "s":
                assert ref.lower is None and ref.upper is not None
            else:
                assert ref.upper is None and ref.lower is not None


@pytest.mark.parametrize("refs, expected", [
    ({"cirrus-gpu": {}}, "references.cirrus-gpu: unknown key (expected '<site>:<partition>'"),
    ({"x:gpu": {"two": {}}}, "references.x:gpu.two: unknown key (expected a node count or '*')"),
    ({"x:gpu": {2: {"img_per_sec": [1, None, None, "img/s"]}}}, "references.x:gpu.2.img_per_sec: unknown key"),
    ({"x:gpu": {"*": {"throughput_total": [1, 0.1, None, "img/s"]}}},
     "references.x:gpu.*.throughput_total.1: 0.1 is greater than the maximum of 0"),
    ({"x:gpu": {"1": {"throughput_total": [1, None, None]}}}, "references.x:gpu.1.throughput_total: [1, None, None] is too short"),
])
def test_bad_references_give_one_line_with_the_key_path(tmp_path, refs, expected):
    import yaml

    from conftest import REPO
    from hpcstack.errors import ConfigError
    from hpcstack.install.components.validation import Validation

    data = yaml.safe_load((REPO / "recipes" / "pytorch" / "2.3.1-gpu.validation.yaml").read_text())
    data["references"] = refs
    (tmp_path / "v.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        Validation("v.yaml").load(tmp_path)
    problems = err.value.problems
    assert len(problems) == 1 and expected in problems[0], problems
    assert problems[0].startswith(f"{tmp_path / 'v.yaml'}: references.")


# ----------------------------------------------------------------------------- collectives check

def collectives_record(ok: bool = True, failures=(), backend: str = "horovod") -> dict:
    """A ``collectives`` record as the training program writes it."""
    return {"record": "collectives", "backend": backend, "device": "cpu", "ok": ok, "checks": 410,
            "ops": ["allreduce_sum"] * 12, "dtypes": ["float32"] * 5, "sizes": ["1"] * 9,
            "skipped": [{"op": "broadcast", "dtype": "bfloat16", "reason": "no bfloat16 ops"}],
            "failures": list(failures), "failed_checks": len(failures), "seconds": 3.46}


BAD = ("horovod allreduce_average float32 size 4913 on rank 1: element 4912 is 0, want 7 "
       "(1 of 4913 elements wrong)")


def with_collectives(r: RunOutcome, record: dict) -> RunOutcome:
    r.records.insert(1, record)
    return r


def test_failed_collectives_check_is_a_sanity_failure_naming_the_message():
    bad = with_collectives(run("horovod", 1, 310, ok=False, exit_status=1,
                               reasons=[f"collectives check: 1 wrong result(s): {BAD}"]),
                           collectives_record(False, [BAD]))
    rep = report([bad])
    r = rep["runs"][0]
    assert rep["ok"] is False and r["ok"] is False
    # named once, from the collectives record (not again from the result's reasons)
    assert [x for x in r["sanity"] if "collectives" in x] == [f"collectives check failed: {BAD}"]
    assert f"sanity: horovod on 1 node(s) (job 101): collectives check failed: {BAD}" in rep["failures"]
    assert r["collectives"]["ok"] is False and r["collectives"]["failures"] == [BAD]


def test_collectives_failure_is_named_even_without_a_result_record():
    r = with_collectives(run("ddp", 1, 310, exit_status=1), collectives_record(False, [BAD]))
    r.records = [x for x in r.records if x["record"] != "result"]
    sanity = report([r])["runs"][0]["sanity"]
    assert sanity[:2] == ["exit status 1", f"collectives check failed: {BAD}"]


def test_passing_collectives_check_is_recorded_and_not_a_failure():
    rep = report([with_collectives(run("horovod", 1, 310), collectives_record())])
    c = rep["runs"][0]["collectives"]
    assert rep["ok"] is True
    assert (c["ran"], c["ok"], c["checks"], c["ops"], c["dtypes"], c["sizes"]) == (True, True, 410, 12, 5, 9)
    assert c["seconds"] == pytest.approx(3.46)


def test_markdown_and_png_have_one_collectives_line_per_run(tmp_path):
    rep = report([with_collectives(run("horovod", 1, 310), collectives_record()),
                  with_collectives(run("ddp", 1, 310, ok=False, exit_status=1),
                                   collectives_record(False, [BAD.replace("horovod", "ddp")], "ddp")),
                  run("horovod", 2, 300)])
    md = to_markdown(rep)
    assert "Collectives check (exact results" in md
    assert ("- horovod on 1 node(s): 410 checks (12 ops x 5 dtypes x 9 sizes) in 3.5 s: PASS; "
            "skipped 1 op/dtype pairs: no bfloat16 ops") in md
    assert ("- ddp on 1 node(s): 410 checks (12 ops x 5 dtypes x 9 sizes) in 3.5 s: FAIL: ddp "
            "allreduce_average float32 size 4913 on rank 1: element 4912 is 0, want 7") in md
    assert "- horovod on 2 node(s): not run" in md
    from hpcstack.validate.render import collectives_caption
    assert collectives_caption(rep["runs"]) == ("collectives ddp: FAIL (1N 410 checks 3.5 s)\n"
                                                "collectives horovod: PASS (1N 410 checks 3.5 s)")
    paths = write_report(rep, tmp_path)
    assert (tmp_path / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "plot" in paths
    assert json.loads((tmp_path / "report.json").read_text())["runs"][0]["collectives"]["ran"] is True


def test_a_report_from_before_the_check_still_renders():
    rep = report([run("horovod", 1, 310)])
    del rep["runs"][0]["collectives"]
    assert "- horovod on 1 node(s): not run" in to_markdown(rep)


# ----------------------------------------------------------------------------- digits classifier

def classifier_record(accuracy: float, threshold: float = 0.95, ranks: int = 1) -> dict:
    return {"record": "classifier", "test_accuracy": accuracy, "test_accuracy_per_rank": [accuracy] * ranks,
            "threshold": threshold, "test_images": 359, "train_images": 1438, "epochs": 20,
            "params_identical": True, "seconds": 4.2}


def with_classifier(r: RunOutcome, accuracy: float, threshold: float = 0.95) -> RunOutcome:
    r.records.insert(-1, classifier_record(accuracy, threshold, r.ranks))
    return r


def test_accuracy_below_the_threshold_is_a_sanity_failure_naming_it_once():
    reason = "test accuracy 0.8120 below the threshold 0.95 (359 test images, 20 epoch(s))"
    bad = with_classifier(run("ddp", 2, 300, ok=False, exit_status=1, reasons=[reason]), 0.812)
    rep = report([with_classifier(run("ddp", 1, 310), 0.986), bad])
    assert rep["ok"] is False
    one, two = rep["runs"]
    assert one["ok"] is True and one["classifier"]["ok"] is True
    # named once, from the classifier record (not again from the result's reasons)
    assert [x for x in two["sanity"] if "accuracy" in x] == [
        "test accuracy 0.8120 below the threshold 0.95 (digits classifier, 359 test images, 20 epoch(s))"]
    assert ("sanity: ddp on 2 node(s) (job 102): test accuracy 0.8120 below the threshold 0.95 "
            "(digits classifier, 359 test images, 20 epoch(s))") in rep["failures"]
    assert two["classifier"] == {"ran": True, "ok": False, "test_accuracy": 0.812, "threshold": 0.95,
                                 "test_images": 359, "train_images": 1438, "epochs": 20, "seconds": 4.2}


def test_the_lowest_rank_accuracy_is_judged():
    r = with_classifier(run("horovod", 2, 300), 0.97)
    r.records[-2]["test_accuracy_per_rank"] = [0.97, 0.94]
    rep = report([r])
    assert rep["runs"][0]["classifier"]["test_accuracy"] == 0.94
    assert any("test accuracy 0.9400 below the threshold 0.95" in x for x in rep["runs"][0]["sanity"])


def test_accuracy_per_node_count_next_to_img_s_in_markdown_json_and_png(tmp_path):
    rep = report([with_classifier(run("horovod", 1, 310), 0.986),
                  with_classifier(run("horovod", 2, 300), 0.981),
                  with_classifier(run("ddp", 1, 320), 0.986)])
    assert rep["ok"] is True
    md = to_markdown(rep)
    assert "| img/s total | img/s per rank | test accuracy | scaling efficiency |" in md
    assert "| horovod | 2 | 2 | 102 | 600.0 ✓ | 300.0 ✓ | 0.981 (>= 0.95) ✓ |" in md
    assert rep["scaling"]["horovod"]["2"]["test_accuracy"] == 0.981
    assert rep["scaling"]["ddp"]["1"]["test_accuracy"] == 0.986
    from hpcstack.validate.render import accuracy_caption
    assert accuracy_caption(rep["runs"]) == ("test accuracy (>= 0.95): ddp 1N 0.986; "
                                             "horovod 1N 0.986, 2N 0.981")
    paths = write_report(rep, tmp_path)
    assert "plot" in paths and (tmp_path / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((tmp_path / "report.json").read_text())
    assert [r["classifier"]["test_accuracy"] for r in saved["runs"]] == [0.986, 0.986, 0.981]  # ddp, then horovod


def test_synthetic_workloads_have_no_accuracy_column():
    rep = report([run("horovod", 1, 310)])
    assert rep["runs"][0]["classifier"] == {"ran": False, "ok": None, "test_accuracy": None,
                                            "threshold": None, "test_images": 0, "train_images": 0,
                                            "epochs": 0, "seconds": None}
    assert "test accuracy" not in to_markdown(rep)
    assert rep["scaling"]["horovod"]["1"]["test_accuracy"] is None
