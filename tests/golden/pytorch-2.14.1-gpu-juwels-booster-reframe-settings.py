# ReFrame site configuration for the hpcstack site juwels-booster (its validation partition).
# Written by hpcstack @VERSION@: hpcstack validate pytorch/2.14.1-gpu --site juwels-booster --emit reframe DIR
# A site with a ReFrame configuration of its own adds this system to it instead (or, to its own
# partition, these prepare_cmds, the 'gpu' resource, the 'hpcstack' environment and the 'general' entry).
# https://reframe-hpc.readthedocs.io/en/stable/config_reference.html

site_configuration = {
    'systems': [
        {
            'name': 'juwels-booster',
            'descr': 'JUWELS Booster, 4x A100-40GB per node, Stages/GCC/ParaStationMPI/CUDA/NCCL modules, Lmod',
            # any host: pick the system with `reframe --system juwels-booster:booster` where the
            # login nodes' names are not known here
            'hostnames': ['.*'],
            'modules_system': 'lmod',
            'partitions': [
                {
                    'name': 'booster',
                    'descr': 'Slurm partition booster of juwels-booster',
                    'scheduler': 'slurm',
                    'launcher': 'srun',
                    'access': ['--partition=booster'],
                    'environs': ['hpcstack'],
                    'max_jobs': 4,
                    # --nodes=N in the job script, as hpcstack's jobs have
                    'sched_options': {'use_nodes_option': True},
                    # the batch shell gets `module` from the tool's init, and the site's module roots
                    'prepare_cmds': [
                        'source /usr/share/lmod/lmod/init/bash',
                        'module load Stages/2024',
                        'module load GCC/12.3.0',
                        'module load ParaStationMPI/5.9.2-1',
                        'module use /p/project/PROJECT/hpcstack/modulefiles',
                    ],
                    'resources': [
                        {'name': 'gpu', 'options': ['--gres=gpu:{num_gpus_per_node}']},
                    ],
                },
            ],
        },
    ],
    'general': [
        {
            # ReFrame loads a test's modules in its own process first (`module show` and `module
            # load`, to resolve conflicts), which needs the site's module roots on the caller's
            # MODULEPATH (a cron job or a CI runner has none). Off, it only writes `module load`
            # into the job script, after prepare_cmds put every root of the site on MODULEPATH;
            # the jobs start clean (--export=NONE), so there is nothing to conflict with.
            'resolve_module_conflicts': False,
            'target_systems': ['juwels-booster'],
        },
    ],
    'environments': [
        {
            # the site's compilers (the check runs an installed program and compiles nothing)
            'name': 'hpcstack',
            'target_systems': ['juwels-booster'],
            'cc': 'mpicc',
            'cxx': 'mpicxx',
            'ftn': 'mpifort',
        },
    ],
}
