-- JUWELS Booster's submit rule as the twin enforces it: a job names its compute project's
-- budget (--account). (JSC's own wording, and whether JUWELS refuses a job without one, are
-- unverified; users' job scripts all name one (third-party). JSC's batch system page:
-- https://apps.fz-juelich.de/jsc/hps/juwels/batchsystem.html.)

function slurm_job_submit(job_desc, part_list, submit_uid)
   if job_desc.account == nil or job_desc.account == "" then
      slurm.log_user("JUWELS Booster: name the budget of your compute project: --account=<budget> (#SBATCH --account)")
      return slurm.ESLURM_INVALID_ACCOUNT
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

return slurm.SUCCESS
