"""What each site-config key means: the words of the site-config reference.

:data:`hpcstack.site.SCHEMA` says what a key may hold (type, allowed values, pattern); this
module says what it is for, its default when left out, and what reads it. The documentation
site's reference page (``docs/hooks/reference.py``) joins the two with an example from the
shipped site configs and the recipes that use each key. A key of the schema missing here fails
that build (``mkdocs build --strict``; ``tests/test_docs_reference.py`` checks it without MkDocs);
a description written as the schema's own ``description`` (and ``default``) keyword takes
precedence over this table.

``used_by`` names what reads the key: ``"install"`` (the install machinery, so every recipe),
``"validate"`` (``hpcstack validate`` and its ReFrame check: recipes with a ``Validation``
component), ``"export"`` (``hpcstack export --format docker|apptainer``: every recipe), or the
class names of the recipe components that read it (``HorovodBuild``, ``PipWheels`` …).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Sentinel default: the key is required.
REQUIRED = "required"


@dataclass(frozen=True)
class Key:
    """One site-config key's documentation.

    Attributes:
        description (str): what it is for (Markdown).
        default (str | None): the value when the key is left out, as it reads in YAML
            (``"null"``, ``"uv"``), :data:`REQUIRED`, or None where no default applies.
        used_by (tuple[str, ...]): what reads it (see the module docstring).
    """

    description: str
    default: str | None = None
    used_by: tuple[str, ...] = ("install",)


_V = ("validate",)
_X = ("export",)

#: Key path (dot-separated, as in the error lines of :func:`hpcstack.site.check_config`) -> its documentation.
KEYS: dict[str, Key] = {
    "name": Key("The site's name: the file's stem when the site is given by name (`--site cirrus` "
                "reads `site-configs/cirrus.yaml`). A build records it, and an install for another "
                "site into the same install root is refused.", REQUIRED),
    "extends": Key("The site this config overlays, by name (found on the same search path as "
                   "`--site`, and checked by the same trust rule): the base's config, merged with "
                   "this file's keys. Mappings merge key by key at every depth; a list or a scalar "
                   "replaces the base's; a key set to `null` is removed, so its default applies "
                   "(`build: {env: {CUDA_PATH: null}}` drops one variable). A base may extend another; "
                   "a cycle or an unknown name is one error line. The overlay states its own `name`. "
                   "A site twin (`twins/site-configs/cirrus-twin.yaml`) is `extends: cirrus` and a "
                   "few keys; see docs/admin/sites.md, \"Overlays: `extends`\".", None),
    "description": Key("One line about the machine: shown by `hpcstack list` and in the ReFrame "
                       "configuration.", REQUIRED),
    "install_root": Key("Where stacks go: `<install_root>/<name>/<version>` (a link to the published "
                        "build), the builds beside it, and hpcstack's state, locks and stage dirs in "
                        "`<install_root>/.hpcstack/`. `--prefix` overrides it.", REQUIRED),
    "module_root": Key("Where modulefiles go: `<module_root>/<name>/<version>` (and `.lua` on Lua "
                       "sites). `--module-root` overrides it.", REQUIRED),
    "cache_dir": Key("Downloads, the wheel cache and the cache of source builds (Horovod wheels). "
                     "Unset, every site on the machine shares one cache: `$HPCSTACK_CACHE_DIR`, "
                     "else `/var/cache/hpcstack` for root, else `~/.cache/hpcstack` (entries are "
                     "keyed by content and build key, so sharing is safe); with `--prefix`, "
                     "`<prefix>/.hpcstack/cache`. Set it on the prefixes' "
                     "filesystem where the machine cache is not (uv hard-links wheels from it; "
                     "across filesystems it copies).",
                     "the machine cache (/var/cache/hpcstack for root)"),
    "stage_root": Key("Scratch directories of builds.", "<install_root>/.hpcstack/stage"),
    "modules": Key("The site's module tool, and the modules that make the build and run "
                   "environment.", REQUIRED),
    "modules.tool": Key("The module tool: `environment-modules` (4.x/5.x) or `lmod` (8.x). Each tool "
                        "reads only its syntaxes: Environment Modules Tcl, Lmod Lua and Tcl.", REQUIRED),
    "modules.syntax": Key("The modulefile syntax hpcstack writes (and the default-version file: "
                          "`.version` or `.modulerc.lua`); `lua` needs `tool: lmod`.", REQUIRED),
    "modules.command": Key("Path of `modulecmd.tcl` or `lmod`, when neither `$MODULES_CMD`/`$LMOD_CMD` "
                           "nor the distribution's path finds it.", "null"),
    "modules.init": Key("Per shell, the module tool's init script: `extend-venv-activate` sources it "
                        "where `module` is missing, Jupyter kernels and ReFrame jobs source the "
                        "`bash` one. Environment Modules: `/usr/share/modules/init/<shell>` (Debian), "
                        "`/usr/share/Modules/init/<shell>` (RHEL); Lmod: "
                        "`/usr/share/lmod/lmod/init/<shell>` (`csh` for csh and tcsh).", "{}"),
    "modules.init.bash": Key("Init script for bash (also for Slurm batch scripts and ReFrame jobs)."),
    "modules.init.zsh": Key("Init script for zsh."),
    "modules.init.csh": Key("Init script for csh and tcsh."),
    "modules.init.fish": Key("Init script for fish."),
    "modules.init.sh": Key("Init script for POSIX sh."),
    "modules.use": Key("Directories put on `MODULEPATH` (`module use`) to find the base, build and "
                       "runtime modules. The emitted ReFrame configuration carries them too.", "[]"),
    "modules.base": Key("The cluster Python module the stack's venv is built on, e.g. "
                        "`python/3.12.1-gpu`; the modulefile `depends-on` it.", REQUIRED),
    "modules.profiles": Key("The site's module profiles: modules loaded first, in this order, before "
                            "`hierarchy` and `base`, each making a domain's modules visible (CINECA "
                            "Leonardo: `[profile/deeplrn]`; the base profile, loaded at login, is not "
                            "listed). Everywhere the hierarchy is loaded they come before it: the "
                            "install, the stack's modulefile `depends-on` (first), validation jobs, "
                            "Jupyter kernels, ReFrame checks and `extend-venv-activate` (through the "
                            "modulefile); the stack's `module help` names them as the site's profiles.",
                            "[]"),
    "modules.hierarchy": Key("The site's module hierarchy: modules loaded, in this order, before `base`, "
                             "each making the next visible (JUWELS Booster: `[Stages/2024, GCC/12.3.0, "
                             "ParaStationMPI/5.9.2-1]`, under which `Python/3.11.3`, `CUDA` and `NCCL` "
                             "appear). The install loads them first, the stack's modulefile `depends-on` "
                             "them first, and validation jobs, Jupyter kernels and ReFrame checks load "
                             "them before they put the module root on `MODULEPATH` (a `Stages` module "
                             "resets it) and load the stack.", "[]"),
    "modules.build": Key("Modules loaded only to build (e.g. `cmake/3.25.2`).", "[]"),
    "modules.runtime": Key("Modules the stack's modulefile `depends-on` besides `base` (e.g. the MPI "
                           "and CUDA modules).", "[]"),
    "modules.env": Key("Variables every stack's modulefile sets for its users (`setenv`; `module "
                       "help` lists them), e.g. a launcher default the way users launch on this "
                       "machine: `SLURM_MPI_TYPE: pmix` where Slurm's `MpiDefault` is none. A "
                       "user's own value set after `module load` wins; unloading restores the "
                       "previous one.", "{}", ("Modulefile",)),
    "python": Key("Facts about the base module's Python.", "{}"),
    "python.version": Key("`X.Y` of the base module's Python, when it cannot be asked (a dry run for "
                          "another machine); the lock file is chosen by it.", "null (probed)"),
    "toolchain": Key("The compilers and libraries of the build environment, after the site's modules "
                     "are loaded (hpccm's toolchain). Values may hold `${VAR}` references to that "
                     "environment.", "{}"),
    "toolchain.cc": Key("The C compiler (the MPI wrapper builds use).", "mpicc", ("HorovodBuild",)),
    "toolchain.cxx": Key("The C++ compiler.", "mpicxx", ("HorovodBuild",)),
    "toolchain.fc": Key("The Fortran compiler, if the site names one.", "null", ("HorovodBuild",)),
    "toolchain.cuda": Key("The CUDA toolkit; `null` on sites without NVIDIA GPUs (builds for CPUs "
                          "only).", "null", ("HorovodBuild", "PipWheels")),
    "toolchain.cuda.home": Key("The toolkit's directory (`nvcc` in its `bin/`).", REQUIRED,
                               ("HorovodBuild",)),
    "toolchain.cuda.version": Key("`X.Y` of that toolkit: lock files and builds are chosen by it.",
                                  REQUIRED, ("HorovodBuild", "PipWheels")),
    "toolchain.cuda.cc_list": Key("The GPUs' compute capabilities, e.g. `[70]` for V100; the preflight "
                                  "checks that `nvcc` compiles for each, and that the locked prebuilt "
                                  "CUDA wheels (torch) carry SASS or PTX that runs on each "
                                  "(docs/admin/install.md, \"GPU architectures of prebuilt wheels\").",
                                  "[]", ("HorovodBuild", "CudaWheelArchs")),
    "toolchain.cuda.stubs": Key("Directory with `libcuda.so` stubs, for builds on a login node without "
                                "a GPU driver; used at build and sanity check only.", "null",
                                ("HorovodBuild",)),
    "toolchain.cuda.static_runtime": Key("The toolkit has `libcudart_static.a`; `false` links the "
                                         "shared runtime.", "true", ("HorovodBuild",)),
    "toolchain.nccl": Key("NCCL, for GPU collectives; `null` without.", "null", ("HorovodBuild",)),
    "toolchain.nccl.home": Key("NCCL's directory (`include/nccl.h`, `lib/libnccl.so`).", REQUIRED,
                               ("HorovodBuild",)),
    "build": Key("Settings of source builds.", "{}", ("HorovodBuild",)),
    "build.jobs": Key("Parallel build jobs (`MAKEFLAGS=-j<jobs>`).", "null (the core count)",
                      ("HorovodBuild",)),
    "build.env": Key("Variables for every build command.", "{}", ("HorovodBuild",)),
    "build.batch_job": Key("Build in one Slurm job step on a compute node instead of the login node, "
                           "for sites whose login nodes limit CPU time (CINECA's Leonardo: \"very short "
                           "test runs (not exceeding 10 minutes of CPU time)\", "
                           "https://docs.hpc.cineca.it/hpc/leonardo.html) and whose compute nodes may "
                           "have no internet. `hpcstack install` then makes the recipe's bundle on the "
                           "login node (the downloads; into `<stage_root>/bundle-<name>-<version>`, "
                           "0700), and runs the rest as `srun --partition=… --nodes=1 --ntasks=1 "
                           "--cpus-per-task=… --time=… [--qos] [--account] [srun_options] "
                           "--job-name=hpcstack-build` of the same hpcstack with `--from` that bundle, "
                           "its output on the terminal, its exit status the install's; Ctrl-C cancels "
                           "the step. `--from DIR` sends that bundle instead; `--on-login-node` builds "
                           "on the login node; `--dry-run` prints both steps. The step runs as the "
                           "installing account: Slurm must accept its jobs, and the compute nodes "
                           "must write the install root as it. See docs/admin/sites.md, \"Building in "
                           "a batch job\".", "null (build on the login node)"),
    "build.batch_job.partition": Key("The partition of the build's job step (`--partition`).", REQUIRED),
    "build.batch_job.time_limit": Key("`--time` of the step, `[D-]HH:MM:SS`: the whole build (a Horovod "
                                      "build takes tens of minutes).", REQUIRED),
    "build.batch_job.cpus_per_task": Key("`--cpus-per-task` of the step, and the build's parallel jobs "
                                         "(`--jobs`) unless given on the command line.", REQUIRED),
    "build.batch_job.qos": Key("`--qos` of the step.", "null (the partition's default)"),
    "build.batch_job.account": Key("`--account` of the step (the budget the build is charged to).",
                                   "null (the account's default)"),
    "build.batch_job.srun_options": Key("More srun options of the step, after hpcstack's own, each one "
                                        "long option (`--mem=16G`, `--constraint=…`); not the options "
                                        "hpcstack sets itself (`--partition`, `--time`, `--cpus-per-task`, "
                                        "`--qos`, `--account`, `--nodes`, `--ntasks`, `--job-name`, "
                                        "`--export`, `--quit-on-interrupt`, `--output`, `--error`, "
                                        "`--input`, `--pty`, `--jobid`) nor an abbreviation of one: one "
                                        "error line each, naming the key to use.", "[]"),
    "installer": Key("How packages get into the stack's venv.", "{}", ("PipWheels", "Venv")),
    "installer.backend": Key("`uv` or `pip` (the fallback).", "uv", ("PipWheels", "Venv")),
    "installer.wheel_cache": Key("The installer's cache; keep it on the prefixes' file system so uv "
                                 "hard-links instead of copying.", "null (<cache_dir>/uv)",
                                 ("PipWheels",)),
    "installer.link_mode": Key("uv's `--link-mode`; `symlink` is refused (a pruned cache would break "
                               "the stack).", "hardlink", ("PipWheels",)),
    "installer.compile_bytecode": Key("Compile `.pyc` at install time, so imports from a read-only "
                                      "stack write none; unchecked-hash (PEP 552), so the same files give "
                                      "the same bytes.", "true", ("PipWheels",)),
    "installer.optimization_levels": Key("Bytecode also for these optimisation levels (`1`: `python -O`, "
                                         "`2`: `-OO`), compiled after the last package is installed; without it "
                                         "a read-only stack compiles every module at each `python -O` start.",
                                         "[] (level 0 only)", ("PipWheels",)),
    "installer.build_cache": Key("Reuse a wheel built from source (Horovod) whose build key is "
                                 "unchanged.", "true", ("HorovodBuild",)),
    "installer.index_url": Key("The site's package index (a devpi, Nexus or Artifactory mirror the "
                               "login nodes reach), a PEP 503 \"simple\" URL: the lock's wheels come "
                               "from it (`--index-url`, in place of the lock's own index line) and "
                               "the recipes' sdists from its project pages (`<index_url>/<package>/`, "
                               "found by file name). The lock's and the recipe's sha256 still decide "
                               "which files are accepted; a bundle, when given, is the only source "
                               "instead (docs/lifecycle.md, \"A site mirror\").",
                               "null (the lock's indexes)", ("PipWheels", "SourceBuild")),
    "permissions": Key("Who owns an installed stack and who may write it, on top of hpcstack's own "
                       "rule (world-readable, nothing world-writable).", "{}"),
    "permissions.group": Key("A shared software group for the stack's files.", "null"),
    "permissions.admin_group": Key("Read for compatibility, and does not count: a file under check cannot "
                                   "name who may write it. The admin group, trusted as root is (its members' "
                                   "files, files it can write), comes from `admin_group` in "
                                   "`/etc/hpcstack/config.yaml` (root's alone) or `--admin-group`; a site that "
                                   "sets this key gets a `note:` saying so "
                                   "(docs/admin/security.md).", "null"),
    "permissions.mode": Key("A symbolic `chmod` mode applied after hpcstack's own, e.g. `g+rwX,g+s`.",
                            "null"),
    "layout": Key("How a published build lies on the file system: a `directory`, or `squashfs` "
                  "(the venv packed into one image, mounted read-only at its path).",
                  "directory (squashfs where `filesystem` is `parallel`)"),
    "filesystem": Key("The file system the install root lies on: `local`, or `parallel` (Lustre, GPFS, "
                      "BeeGFS, NFS shared by the compute nodes), which makes `layout: squashfs` the default "
                      "(every rank's imports would otherwise be round trips to its metadata server).", "local"),
    "squashfs": Key("Settings of `layout: squashfs`.", "{}"),
    "squashfs.compression": Key("`mksquashfs -comp`.", "lz4"),
    "squashfs.processors": Key("`mksquashfs -processors`.", "null (every core)"),
    "launcher": Key("How validation ranks start on this host (`hpcstack validate --local`).", REQUIRED, _V),
    "launcher.command": Key("A launcher of the registry in `hpcstack/validate/launchers.py`: `horovodrun`, "
                            "`mpirun`, `srun` or `torchrun`.", REQUIRED, _V),
    "launcher.ranks": Key("Ranks of the local validation run.", "2", _V),
    "launcher.env": Key("Variables for the launcher.", "{}", _V),
    "container": Key("The stack as a container image: the image is a machine of its own.", None, _X),
    "container.base_image": Key("A registry image to start from (`FROM`, `Bootstrap: docker`); one of "
                                "`base_image` and `rootfs`.", None, _X),
    "container.rootfs": Key("A root filesystem tar to start from (`FROM scratch` + `ADD`).", None, _X),
    "container.distro": Key("The image's distribution (its package manager).", None, _X),
    "container.python": Key("`X.Y` of the image's `python3`.", REQUIRED, _X),
    "container.packages": Key("Distribution packages by role.", "{}", _X),
    "container.packages.compilers": Key("Compilers and build tools.", "[]", _X),
    "container.packages.mpi": Key("MPI.", "[]", _X),
    "container.packages.modules": Key("The module tool.", "[]", _X),
    "container.packages.python": Key("Python, its headers and venv.", "[]", _X),
    "container.packages.other": Key("Anything else.", "[]", _X),
    "container.setup": Key("Shell commands run after hpcstack is in the image (`$HPCSTACK_DATA`: its "
                           "data directory).", "[]", _X),
    "container.site_changes": Key("Top-level keys of this site config that differ inside the image.",
                                  "{}", _X),
    "lifecycle": Key("A stack over the years: who still uses it (docs/lifecycle.md).", "{}", ("hpcstack usage",)),
    "lifecycle.usage_log": Key("Directory of the module usage log (opt-in): the hooks of `hpcstack module "
                               "usage-hook install` drop one file per load of this site's modules into its "
                               "`spool/` (mode 1733: users add, cannot list, read or remove); `hpcstack "
                               "usage` moves them into `usage.log` (root's alone) and reports; `module "
                               "deprecate` and `uninstall` read it. Unset: nothing is recorded.",
                               "null (no usage recorded)", ("hpcstack usage",)),
    "lifecycle.usage_users": Key("How `usage.log` names users: `name`, or `hash` (a salted SHA-256 of the "
                                 "name, the salt readable by root alone: users are counted, not named).",
                                 "name", ("hpcstack usage",)),
    "slurm": Key("The Slurm partition `hpcstack validate` submits to.", None, _V),
    "slurm.partition": Key("The partition (also names the node class of workloads and references).",
                           REQUIRED, _V),
    "slurm.qos": Key("`--qos`.", "null", _V),
    "slurm.account": Key("`--account`.", "null", _V),
    "slurm.account_required": Key("Jobs must name a budget: `hpcstack validate` asks for `--account`.",
                                  "false", _V),
    "slurm.gpus_per_node": Key("GPUs per node to request.", "0", _V),
    "slurm.gpu_request": Key("How GPUs are requested: `gres` (`--gres=gpu:N`), `gpus-per-node` "
                             "(`--gpus-per-node=N`) or `gpus-per-task` (`--gpus-per-task=1` with "
                             "`--ntasks-per-node` = `gpus_per_node` and `--ntasks`: Slurm binds each task "
                             "to its own GPU, sbatch(1)).", "gres", _V),
    "slurm.constraint": Key("`--constraint` (e.g. NERSC's `gpu`).", "null", _V),
    "slurm.partition_option": Key("`false`: no `--partition` line (the partition only names the node "
                                  "class).", "true", _V),
    "slurm.tasks_per_node": Key("Ranks per node.", "1", _V),
    "slurm.cpus_per_task": Key("Cores per rank (`--cpus-per-task`, the trainer's threads).", "1", _V),
    "slurm.time_limit": Key("`--time`, `[D-]HH:MM:SS`.", "00:30:00", _V),
    "slurm.exclusive": Key("`--exclusive`.", "false", _V),
    "slurm.launcher": Key("The launcher inside the job: `srun`, `mpirun` or `horovodrun`.", "srun", _V),
    "slurm.mpi": Key("The PMI plugin of `srun --mpi=` (`srun --mpi=list` prints the site's): `pmix` for "
                     "an Open MPI built with PMIx (localhost), `pmi2` for Intel MPI and MPICH (Intel MPI "
                     "also wants `I_MPI_PMI_LIBRARY` in `slurm.env`); null: Slurm's default.", "null", _V),
    "slurm.submit_as": Key("As root, submit as this user (`runuser -u USER -- sbatch`).", "null", _V),
    "slurm.output_root": Key("Where job scripts, output and the report go (`hpcstack-validate-*/`).",
                             "null (the current directory)", _V),
    "slurm.task_options": Key("Where the jobs give the shape of their tasks: `sbatch` (`#SBATCH "
                              "--ntasks-per-node`/`--cpus-per-task`) or `srun` (only `srun --ntasks "
                              "--ntasks-per-node --cpus-per-task`: Cirrus's GPU nodes reject a job that "
                              "gives them as `#SBATCH` options and allocate cores by the GPUs asked for). "
                              "With `srun`, use the `srun` launcher: `mpirun` would see one slot per node.",
                              "sbatch", _V),
    "slurm.srun_options": Key("Options every `srun` step of the jobs gets, after hpcstack's own, e.g. "
                              "`[--hint=nomultithread]` (one task per physical core where the nodes "
                              "count hardware threads, as Cirrus's GPU job examples give it).", "[]", _V),
    "slurm.login_only_paths": Key("Directories the login nodes have and the batch jobs do not (Cirrus: "
                                  "`[/home]`): `hpcstack validate` refuses a validation directory under "
                                  "one of them (the working directory where `output_root` is unset).",
                                  "[]", _V),
    "slurm.accounting": Key("`false`: no slurmdbd, so no `sacct`; ReFrame checks poll with `squeue`.",
                            "true", _V),
    "slurm.env": Key("Variables for the jobs.", "{}", _V),
    "slurm.mem": Key("Memory per node of every batch job hpcstack writes (`#SBATCH --mem=`; also in the "
                     "stack's `module help` example and the ReFrame export's `access`), where the site "
                     "shares nodes and wants jobs to say what they use. Slurm's syntax: an integer, in "
                     "megabytes unless a suffix `K`, `M`, `G` or `T` says otherwise (`64G`); `0` asks "
                     "for all of each node's memory. At most one of `mem`, `mem_per_cpu`, `mem_per_gpu` "
                     "(sbatch(1): \"The --mem, --mem-per-cpu and --mem-per-gpu options are mutually "
                     "exclusive\", https://slurm.schedmd.com/sbatch.html). Unset: no line, the "
                     "cluster's default (`DefMemPerNode`/`DefMemPerCPU` in slurm.conf).",
                     "null (the cluster's default)", _V + ("install",)),
    "slurm.mem_per_cpu": Key("Memory per allocated CPU (`#SBATCH --mem-per-cpu=`), as `mem` otherwise: "
                             "Slurm's syntax (`3800M`), at most one memory key, on every batch job "
                             "hpcstack writes (https://slurm.schedmd.com/sbatch.html).",
                             "null (the cluster's default)", _V + ("install",)),
    "slurm.mem_per_gpu": Key("Memory per allocated GPU (`#SBATCH --mem-per-gpu=`), as `mem` otherwise: "
                             "Slurm's syntax (`120G`), at most one memory key, on every batch job "
                             "hpcstack writes (https://slurm.schedmd.com/sbatch.html).",
                             "null (the cluster's default)", _V + ("install",)),
    "slurm.extra_options": Key("More `#SBATCH` options for every batch job hpcstack writes, written as "
                               "given after hpcstack's own lines (and appended to the `module help` "
                               "example and the ReFrame export's `access`): what the site needs and "
                               "hpcstack has no key for, e.g. `[--reservation=maint, --hint=nomultithread]`. "
                               "Each is one long option, `--name` or `--name=value` (sbatch(1), "
                               "https://slurm.schedmd.com/sbatch.html). Refused, one line each, when the "
                               "site is loaded: white space, quotes, backslashes, `#` or control "
                               "characters (sbatch reads `#SBATCH` lines itself, not a shell: the rule "
                               "of the job scripts' own values), a short option, and an option hpcstack "
                               "sets itself, or an abbreviation of one (sbatch takes unambiguous "
                               "prefixes): `--nodes`, `--ntasks`/`--ntasks-per-node`, `--cpus-per-task`, "
                               "`--gres`/`--gpus*`, `--account`, `--qos`, `--partition`, `--constraint`, "
                               "`--exclusive`, `--time`, `--output`/`--error`, `--chdir`, `--job-name`, "
                               "`--export`, `--mem*`; the line names the key to use instead "
                               "(`slurm.time_limit`, `slurm.mem` …).", "[]", _V + ("install",)),
    "gpu": Key("The GPU driver of the compute nodes, as `nvidia-smi` prints it there: what the "
               "install checks the wheels' CUDA against before anything is written. Give "
               "`driver_version`, `cuda_driver_api` or both; with neither, nothing is checked.",
               "{} (no check)"),
    "gpu.driver_version": Key("The NVIDIA driver of the compute nodes, `nvidia-smi`'s \"Driver "
                              "Version\" (`\"535.104.05\"`, quoted). An install, its `--dry-run` and an "
                              "export refuse when they resolve the plan, before any directory is made, "
                              "in one line naming this key, the driver and what the wheels need, a "
                              "lock whose wheels are "
                              "built for a CUDA this driver cannot run: the CUDA a pin states (`+cu121`, "
                              "`nvidia-cuda-runtime-cu12==12.1.105`, `cuda-toolkit==13.0.3`) needs, under "
                              "NVIDIA's minor version compatibility, CUDA 11.x >= 450.80.02, 12.x >= "
                              "525.60.13, 13.x >= 580 (580.65.06, the driver CUDA 13.0 GA requires) "
                              "(NVIDIA CUDA Toolkit release notes, \"CUDA "
                              "Toolkit and Minimum Required Driver Version for CUDA Minor Version "
                              "Compatibility\", https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/"
                              "index.html; the table is `MIN_DRIVER` in hpcstack/install/driver.py). A CUDA "
                              "the table does not know is a note, not a refusal. The check is no step of "
                              "the plan: stating or changing the driver leaves installed stacks up to "
                              "date. Unset: no check.",
                              "null (no check)"),
    "gpu.cuda_driver_api": Key("The newest CUDA the compute nodes' driver runs, `nvidia-smi`'s \"CUDA "
                               "Version\" (`\"12.2\"`, quoted: YAML reads 12.10 as the number 12.1). "
                               "Wheels built for CUDA `X.Y` need at least `X.0` (minor version "
                               "compatibility, from CUDA 11 on; same source as `gpu.driver_version`); "
                               "a lower one is refused before anything is written, one line naming this "
                               "key, the driver's CUDA and what the wheels need. Unset: no check.",
                               "null (no check)"),
    "network": Key("The fabric between the GPU nodes, and NVLink within one: what NCCL must pick in "
                   "the validation jobs. A GPU site's jobs run with `NCCL_DEBUG=INFO` and "
                   "`NCCL_DEBUG_FILE=<job dir>/nccl-%h-%p.log` (one file per rank), and the report "
                   "holds NCCL's choice to these keys: a silent fall-back to TCP sockets between "
                   "nodes fails the validation, quoting the log lines that show it; the NCCL "
                   "actually loaded (its version, its net plugin) is reported beside the one the "
                   "site's modules name (hpcstack/validate/transport.py).", "{} (no check)", _V),
    "network.fabric": Key("`infiniband`: NCCL must use its `NET/IB` transport (or the IB SHARP plugin, "
                          "`IBext`) and no `NET/Socket`; `slingshot`: HPE Slingshot through the "
                          "aws-ofi-nccl plugin, `NET/OFI` with libfabric provider `cxi` (NERSC, "
                          "https://docs.nersc.gov/systems/perlmutter/architecture/); `ethernet`: TCP "
                          "sockets are what the nodes have (reported, not checked); `none`: no check. "
                          "Sources: NCCL's environment and troubleshooting pages "
                          "(https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html: "
                          "`NCCL_DEBUG`, `NCCL_DEBUG_FILE`, `NCCL_NET`), the log lines in "
                          "tests/data/nccl-logs/README.md.", "none", _V),
    "network.nvlink": Key("The GPUs of a node are linked by NVLink: NCCL's channels between two GPUs "
                          "of one node must go peer to peer (`P2P/IPC`, `P2P/CUMEM`, `P2P/direct "
                          "pointer`), not through host shared memory (`SHM`) or the network. A P2P "
                          "channel proves peer access, not which link carries it.", "false", _V),
    "revalidation": Key("What follows a scheduled or manual validation recorded in the site's history "
                        "(`hpcstack schedule`, docs/admin/status.md): notifications of a stack's "
                        "verdict turning DEGRADED or FAILED, and the opt-in deprecation of a FAILED "
                        "stack (hpcstack/validate/actions.py). (Not `validation`: that key once held "
                        "the workload, now the recipe's.)", "{} (nothing but the history and the "
                        "status file)", _V),
    "revalidation.notify": Key("Apprise URLs (https://github.com/caronc/apprise, its wiki lists the "
                               "services: `mailto://`, `slack://`, `msteams://`, `matrix://`, "
                               "`json://` …) told, once, when a stack's verdict in a tier changes to "
                               "DEGRADED or FAILED: the stack, tier, verdict, since when and what "
                               "changed since the last OK run. A URL may hold a token: keep the site "
                               "config root's. A failure to send is one warning line.", "[]", _V),
    "revalidation.deprecate_on_failed": Key("When a stack's verdict turns FAILED, deprecate it with "
                                            "the lifecycle's own `hpcstack module deprecate` (its "
                                            "modulefile then warns on load; no date, so it stays "
                                            "loadable; `hpcstack module undeprecate` reverts it).",
                                            "false", _V),
    "revalidation.schedule": Key("The tiers' cron lines on this site (`smoke`, `full`, `probe`: "
                                 "cron's five time fields, in slurmctld's local time), over the "
                                 "recipe's `tiers` and hpcstack's defaults: a site's maintenance "
                                 "window or quiet hours are the site's (docs/admin/status.md).",
                                 "the recipe's, else smoke `0 3 * * *`, full `0 4 * * 0`, probe "
                                 "`30 */6 * * *`", _V),
    "revalidation.state_dir": Key("Where the validation history, the schedule's state, its jobs' "
                                  "output and the status file `module load` reads (status/<site>.json, "
                                  "instead of the module root's; users must be able to read it where "
                                  "they load modules) live. It must be a directory only root can change (every "
                                  "directory above it too: the file gate checks the chain, and never "
                                  "trusts a group that may write it) and that the compute nodes can "
                                  "write as root: the scheduled runs record from there. Set it where "
                                  "the admin group may write the install root (a 2775 project "
                                  "directory) or the nodes see it read-only (Perlmutter's "
                                  "/global/common/software).", "<install_root>/.hpcstack", _V),
    "revalidation.degraded": Key("How far a recorded run's medians may move from the baseline's "
                                 "before its verdict is DEGRADED (with the Mann-Whitney test's p < "
                                 "0.01): `throughput_drop` (a fraction) and `startup_rise` (a "
                                 "fraction). A site whose validation shares nodes with other work "
                                 "sets them wider than the noise it sees.",
                                 "throughput_drop 0.05, startup_rise 0.25", _V),
    "revalidation.degraded.throughput_drop": Key("The smallest drop of a run's median throughput, "
                                                 "against the baseline's, that reads DEGRADED (a "
                                                 "fraction, 0 to 1).", "0.05", _V),
    "revalidation.degraded.startup_rise": Key("The smallest rise of a run's median start-up per "
                                              "rank, against the baseline's, that reads DEGRADED "
                                              "(a fraction; 1.0 is twice as long).", "0.25", _V),
}
