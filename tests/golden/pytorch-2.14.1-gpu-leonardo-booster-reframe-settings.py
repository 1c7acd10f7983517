# ReFrame site configuration for the hpcstack site leonardo-booster (its validation partition).
# Written by hpcstack @VERSION@: hpcstack validate pytorch/2.14.1-gpu --site leonardo-booster --emit reframe DIR
# A site with a ReFrame configuration of its own adds this system to it instead (or, to its own
# partition, these prepare_cmds, the 'gpu' resource, the 'hpcstack' environment and the 'general' entry).
# https://reframe-hpc.readthedocs.io/en/stable/config_reference.html

site_configuration = {
    'systems': [
        {
            'name': 'leonardo-booster',
            'descr': 'CINECA Leonardo Booster, 4x A100-64GB per node, Spack modules behind profile/deeplrn, Slurm accounts and QOS',
            # any host: pick the system with `reframe --system leonardo-booster:boost_usr_prod` where the
            # login nodes' names are not known here
            'hostnames': ['.*'],
            'modules_system': 'envmod',
            'partitions': [
                {
                    'name': 'boost_usr_prod',
                    'descr': 'Slurm partition boost_usr_prod of leonardo-booster',
                    'scheduler': 'slurm',
                    'launcher': 'srun',
                    'access': ['--partition=boost_usr_prod', '--qos=normal', '--mem=0'],
                    'environs': ['hpcstack'],
                    'max_jobs': 4,
                    # --nodes=N in the job script, as hpcstack's jobs have
                    'sched_options': {'use_nodes_option': True},
                    # the batch shell gets `module` from the tool's init, and the site's module roots
                    'prepare_cmds': [
                        'unset BASH_ENV',
                        'source /usr/share/Modules/init/bash',
                        'module load profile/deeplrn',
                        'module use /leonardo_work/PROJECT/hpcstack/modulefiles',
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
            'target_systems': ['leonardo-booster'],
        },
    ],
    'environments': [
        {
            # the site's compilers (the check runs an installed program and compiles nothing)
            'name': 'hpcstack',
            'target_systems': ['leonardo-booster'],
            'cc': 'mpicc',
            'cxx': 'mpicxx',
            'ftn': 'mpifort',
        },
    ],
}
