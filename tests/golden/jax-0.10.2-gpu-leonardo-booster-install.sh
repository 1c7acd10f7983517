# hpcstack install jax/0.10.2-gpu for site leonardo-booster: build.batch_job is set, so the build runs in one Slurm job step on partition lrd_all_serial
# 1. on this node (the network): the bundle of what the install needs
#    a private stage directory, 0700, made through the gate: /leonardo_work/PROJECT/hpcstack/.hpcstack/stage/bundle-jax-0.10.2-gpu
hpcstack bundle jax/0.10.2-gpu --site leonardo-booster -o /leonardo_work/PROJECT/hpcstack/.hpcstack/stage/bundle-jax-0.10.2-gpu   # without hpcstack's own wheel
# 2. the rest, in the job step: no network; its output here; its exit status is the install's (hpcstack install --on-login-node builds on this node instead)
srun --partition=lrd_all_serial --nodes=1 --ntasks=1 --cpus-per-task=4 --time=04:00:00 --mem=30800M --job-name=hpcstack-build --quit-on-interrupt --mpi=none --export=ALL,HPCSTACK_BATCH_BUILD=1 /opt/hpcstack/tool/bin/python -I -u -m hpcstack install jax/0.10.2-gpu --site leonardo-booster --from /leonardo_work/PROJECT/hpcstack/.hpcstack/stage/bundle-jax-0.10.2-gpu --jobs 4
