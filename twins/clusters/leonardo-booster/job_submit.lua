-- Leonardo's submit rules, as CINECA's documentation states them; the wording of the messages is
-- the twin's (CINECA's own is unknown to the twin).
--   * every job names a project account: "You must have valid active projects to run batch
--     jobs" and "-A <account_name>" [booster: https://wiki.u-gov.it/confluence/display/SCAIUS/Booster+Section];
--   * lrd_all_serial, the default partition, has no GPUs [booster, the partitions table]: a job
--     that asks for GPUs there is refused (whether Slurm at CINECA refuses it or leaves it
--     pending is unverified).

local function wants_gpus(job_desc)
   for _, f in ipairs({"tres_per_node", "tres_per_task", "tres_per_job", "tres_per_socket"}) do
      local v = job_desc[f]
      if v ~= nil and string.find(v, "gpu", 1, true) then return true end
   end
   return false
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   if job_desc.account == nil or job_desc.account == "" then
      slurm.log_user("Leonardo: name your project account: -A <account_name> (saldo -b lists yours)")
      return slurm.ESLURM_INVALID_ACCOUNT
   end
   local partition = job_desc.partition
   if (partition == nil or partition == "lrd_all_serial") and wants_gpus(job_desc) then
      slurm.log_user("Leonardo: lrd_all_serial has no GPUs: ask for --partition=boost_usr_prod")
      return slurm.ERROR
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

return slurm.SUCCESS
