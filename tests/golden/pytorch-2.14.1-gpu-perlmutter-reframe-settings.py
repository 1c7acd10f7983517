# ReFrame site configuration for the hpcstack site perlmutter (its validation partition).
# Written by hpcstack @VERSION@: hpcstack validate pytorch/2.14.1-gpu --site perlmutter --emit reframe DIR
# A site with a ReFrame configuration of its own adds this system to it instead (or, to its own
# partition, these prepare_cmds, the 'gpu' resource, the 'hpcstack' environment and the 'general' entry).
# https://reframe-hpc.readthedocs.io/en/stable/config_reference.html

site_configuration = {
    'systems': [
        {
            'name': 'perlmutter',
            'descr': 'NERSC Perlmutter GPU nodes, 4x A100 per node (40 GB; 80 GB on 256 nodes), cudatoolkit + cray-mpich, Lmod',
            # any host: pick the system with `reframe --system perlmutter:gpu` where the
            # login nodes' names are not known here
            'hostnames': ['.*'],
            'modules_system': 'lmod',
            'partitions': [
                {
                    'name': 'gpu',
                    'descr': 'Slurm partition gpu of perlmutter',
                    'scheduler': 'slurm',
                    'launcher': 'srun',
                    'access': ['--qos=regular', '--constraint=gpu'],
                    'environs': ['hpcstack'],
                    'max_jobs': 4,
                    # --nodes=N in the job script, as hpcstack's jobs have
                    'sched_options': {'use_nodes_option': True},
                    # the batch shell gets `module` from the tool's init, and the site's module roots
                    'prepare_cmds': [
                        'source /opt/cray/pe/lmod/lmod/init/bash',
                        'module use /global/common/software/PROJECT/hpcstack/modulefiles',
                    ],
                    'resources': [
                        {'name': 'gpu', 'options': ['--gpus-per-node={num_gpus_per_node}']},
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
            'target_systems': ['perlmutter'],
        },
    ],
    'environments': [
        {
            # the site's compilers (the check runs an installed program and compiles nothing)
            'name': 'hpcstack',
            'target_systems': ['perlmutter'],
            'cc': 'cc',
            'cxx': 'CC',
            'ftn': 'ftn',
        },
    ],
}
