-- Cirrus's submit rules, as its documentation states them (https://github.com/EPCCed/cirrus-docs,
-- docs/user-guide/gpu.md and batch.md at 59428bce, the parent of commit 7cdc0d5 "Remove references
-- to GPUs"); the wording of the messages is the twin's.
--   * every job names a budget (--account);
--   * GPU jobs must not give --ntasks or --cpus-per-task to sbatch: "Such a job submission will
--     be rejected" (gpu.md, "Submitting jobs to the GPU nodes"): give them to srun;
--   * --mem is not refused: gpu.md does not list it among the rejected options (only --ntasks and
--     --cpus-per-task), and batch.md ("Resource Limits") says only that "you cannot specify the
--     memory for a job using the --mem options to Slurm (e.g. --mem, --mem-per-cpu,
--     --mem-per-gpu)": memory comes with the primary resource, the GPUs here. Whether Cirrus
--     refused such a job or ignored the option is not stated (unverified), so the twin, which
--     enforces only what the documentation says is rejected, lets it through.

local function unset(v, novals)
   if v == nil then return true end
   for _, nv in ipairs(novals) do if v == nv then return true end end
   return false
end

local function is_gpu_job(job_desc)
   if job_desc.partition == "gpu" then return true end
   for _, f in ipairs({"tres_per_node", "tres_per_task", "tres_per_job", "tres_per_socket"}) do
      local v = job_desc[f]
      if v ~= nil and string.find(v, "gpu", 1, true) then return true end
   end
   return false
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   if job_desc.account == nil or job_desc.account == "" then
      slurm.log_user("Cirrus: every job must name a budget code: --account=<budget> (#SBATCH --account)")
      return slurm.ESLURM_INVALID_ACCOUNT
   end
   if is_gpu_job(job_desc) then
      local bad = {}
      if not unset(job_desc.num_tasks, {slurm.NO_VAL, 0}) then
         table.insert(bad, "--ntasks")
      end
      if not unset(job_desc.cpus_per_task, {slurm.NO_VAL16, 0}) then
         table.insert(bad, "--cpus-per-task")
      end
      if #bad > 0 then
         slurm.log_user("Cirrus GPU jobs: " .. table.concat(bad, ", ") ..
            " will be rejected as sbatch (#SBATCH) options: give --ntasks and --cpus-per-task" ..
            " to srun")
         return slurm.ERROR
      end
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

return slurm.SUCCESS
