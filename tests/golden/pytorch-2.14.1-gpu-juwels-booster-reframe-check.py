# ReFrame check of the hpcstack stack pytorch/2.14.1-gpu on juwels-booster:booster.
# Written by hpcstack @VERSION@: hpcstack validate pytorch/2.14.1-gpu --site juwels-booster --emit reframe DIR
# It runs what `hpcstack validate pytorch/2.14.1-gpu --site juwels-booster` runs (the recipe's validation
# program, the same options, one Slurm job per node count and backend) and judges it the same way:
# sanity (result record ok, no wrong collective, every rank ran, nccl transport), then the
# performance references (value, lower, upper, unit) of the recipe's validation file.
#
#   reframe -C settings.py -c pytorch_2_14_1_gpu_check.py -r
#   reframe -C settings.py -c pytorch_2_14_1_gpu_check.py -S program_extra_opts=--an-option -r
#       (options added to the program's)
#   reframe -C settings.py -c pytorch_2_14_1_gpu_check.py -S references_file=refs.yaml -r
#       (the references of `hpcstack status --site juwels-booster --reframe-refs refs.yaml`, the
#        site's validation history, instead of the recipe's below)
#   This site charges jobs to a budget: add -J account=BUDGET (or export SBATCH_ACCOUNT=BUDGET)
#
# Workload: {'model': 'resnet50', 'image_size': 224, 'batch_size': 32, 'precision': 'fp32', 'device': 'cuda'}

import json
import os
import statistics

import reframe as rfm
import yaml
import reframe.utility.sanity as sn
import reframe.utility.typecheck as typ
import reframe.utility.udeps as udeps
from reframe.core.builtins import (parameter, performance_function, run_after, run_before,
                                   sanity_function, variable)

#: The program's command line per backend (hpcstack.validate.workload.Program.argv).
PROGRAM = {
    'ddp': [
        '/p/project/PROJECT/hpcstack/pytorch/2.14.1-gpu/bin/hpcstack-train-benchmark',
        '--backend', 'ddp',
        '--model', 'resnet50',
        '--image-size', '224',
        '--batch-size', '32',
        '--precision', 'fp32',
        '--device', 'cuda',
        '--threads', '24',
        '--output', 'records.jsonl',
    ],
}

#: Performance references per node count: figure -> (value, lower, upper, unit), tolerances
#: relative to the value (None: unbounded), from the recipe's validation file for juwels-booster:booster.
REFERENCES = {
    1: {
        'throughput_per_rank': (938.0, -0.35, 0.15, 'img/s'),
        'throughput_total': (3752.0, -0.35, 0.15, 'img/s'),
    },
    2: {
        'throughput_per_rank': (938.0, -0.35, 0.15, 'img/s'),
        'throughput_total': (7248.0, -0.35, 0.15, 'img/s'),
        'scaling_efficiency': (0.9, -0.1, 0.12, ''),
    },
}

#: The stack, as `hpcstack status --reframe-refs` names it.
STACK = 'pytorch/2.14.1-gpu'

#: Node counts (one test each); scaling efficiency is against the 1-node test.
NODES = [1, 2]

#: The program's JSON-lines records, in the stage directory.
RECORDS = 'records.jsonl'


@sn.deferrable
def figure(path, record, field, per_rank=False, over_ranks=None):
    """A figure of the program's JSON-lines records: ``field`` of the first ``record`` (divided
    by its world_size where ``per_rank``), or the max or median of ``field`` over every such
    record (``over_ranks``: one per rank), as hpcstack.validate.workload.Figure reads it."""
    values = []
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get('record') == record and rec.get(field) is not None:
                if over_ranks:
                    values.append(float(rec[field]))
                    continue
                return float(rec[field]) / (int(rec['world_size']) if per_rank else 1)
    if values:
        return max(values) if over_ranks == 'max' else statistics.median(values)
    raise sn.SanityError(f'no {record!r} record with {field!r} in {path}')


def references_from(path, system):
    """The references of STACK on ``system`` in the YAML of `hpcstack status --reframe-refs`
    (stack -> system -> node count -> figure -> [value, lower, upper, unit]), as REFERENCES
    holds them. Raises ValueError where the file names no references of STACK on ``system``."""
    with open(path) as f:
        doc = yaml.safe_load(f) or {}
    by_nodes = (doc.get(STACK) or {}).get(system)
    if not isinstance(by_nodes, dict):
        raise ValueError(f'{path}: no references of {STACK} on {system}')
    return {int(n): {name: tuple(ref) for name, ref in figures.items()} for n, figures in by_nodes.items()}


@rfm.simple_test
class HpcstackPytorch_2_14_1_gpu(rfm.RunOnlyRegressionTest):
    descr = "pytorch/2.14.1-gpu: the recipe's validation program on juwels-booster:booster"
    valid_systems = ['juwels-booster:booster']
    valid_prog_environs = ['hpcstack']
    # the stack's module with its module root: ReFrame looks the module up in its own process
    # (`module show`) before it submits, so the caller's MODULEPATH need not hold the root
    modules = [{'name': 'pytorch/2.14.1-gpu', 'path': '/p/project/PROJECT/hpcstack/modulefiles'}]
    num_nodes = parameter(NODES)
    backend = parameter(['ddp'])
    num_tasks_per_node = 4
    num_cpus_per_task = 24
    num_gpus_per_node = 4
    time_limit = '20m'
    exclusive_access = True
    env_vars = {
        'OMP_NUM_THREADS': '24',
        'SRUN_CPUS_PER_TASK': '24',
        'SLURM_EXPORT_ENV': 'ALL',
        'NCCL_DEBUG': 'WARN',
    }
    prerun_cmds = ['export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))']
    #: Options appended to the program's (a testing aid, or a workload setting).
    program_extra_opts = variable(typ.List[str], value=[])
    #: The YAML of `hpcstack status --reframe-refs` (the site's validation history) to take the
    #: references from instead of REFERENCES; empty: REFERENCES.
    references_file = variable(str, value='')
    #: A transport the run must use ('nccl' on a CUDA site whose stack's GPU collectives must use NCCL), else None.
    required_transport = variable(str, type(None), value='nccl')
    tags = set(['hpcstack', 'pytorch'])

    @run_after('init')
    def set_shape(self):
        self.num_tasks = self.num_nodes * self.num_tasks_per_node
        self.executable = PROGRAM[self.backend][0]
        references = (references_from(self.references_file, 'juwels-booster:booster') if self.references_file
                      else REFERENCES)
        self.reference = {'juwels-booster:booster': references.get(self.num_nodes, {})}
        if self.num_gpus_per_node:
            self.extra_resources = {'gpu': {'num_gpus_per_node': self.num_gpus_per_node}}
        if self.num_nodes > 1 and 1 in NODES:
            # scaling efficiency is against the 1-node run of the same backend
            self.depends_on(self.single_node_test(), udeps.by_env)

    @run_before('run')
    def set_launch(self):
        self.executable_opts = PROGRAM[self.backend][1:] + list(self.program_extra_opts)
        self.job.launcher.options = []
        # a clean job environment, as hpcstack's own jobs: the module loads give the stack
        self.job.options += ['--export=NONE']

    def single_node_test(self):
        cls = type(self)
        variant = cls.get_variant_nums(num_nodes=lambda n: n == 1,
                                       backend=lambda b: b == self.backend)[0]
        return cls.variant_name(variant)

    def records(self):
        return os.path.join(self.stagedir, RECORDS)

    @sanity_function
    def validate_run(self):
        records = self.records()
        checks = [
            sn.assert_found(r'"record": "result", "ok": true', records,
                            msg='the program reported failure (its result record is not ok)'),
            sn.assert_eq(sn.extractsingle(r'"record": "config", .*?"world_size": (\d+)', records, 1, int),
                         self.num_tasks, msg='ran on {0} ranks, expected {1}'),
            sn.assert_not_found(r'"record": "collectives", "backend": "[^"]*", "device": '
                                r'"[^"]*", "ok": false', records,
                                msg='the collectives check found a wrong result'),
        ]
        checks.append(sn.assert_eq(sn.count(sn.extractall('"record": "throughput", "rank": (\\d+)',
                                                          records, 1)),
                                   self.num_tasks, msg='throughput reported by {0} ranks, expected {1}'))
        if self.required_transport:
            checks.append(sn.assert_found(r'"record": "config", .*?"transport": "[^"]*'
                                          + self.required_transport, records,
                                          msg=f'the transport is not {self.required_transport}'))
        return sn.all(checks)

    @run_before('performance')
    def single_node_has_no_scaling(self):
        if self.num_nodes == 1 or 1 not in NODES:
            self.perf_variables.pop('scaling_efficiency', None)

    @performance_function('img/s')
    def throughput_total(self):
        return figure(self.records(), 'throughput_total', 'img_per_sec', False)

    @performance_function('img/s')
    def throughput_per_rank(self):
        return figure(self.records(), 'throughput_total', 'img_per_sec', True)

    @performance_function('')
    def scaling_efficiency(self):
        single = self.getdep(self.single_node_test())
        base = ('throughput_total', 'img_per_sec', False)
        return (figure(self.records(), *base)
                / (self.num_nodes * figure(os.path.join(single.stagedir, RECORDS), *base)))

    @performance_function('s')
    def startup_max(self):
        return figure(self.records(), 'startup', 'first_step_s', False, over_ranks='max')
