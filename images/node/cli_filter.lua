-- hp's cli_filter (CliFilterPlugins=cli_filter/lua; served to every node with slurm.conf).
-- One rule: a batch job whose script runs `srun --auto-resume=N` gets Slurm's --no-kill,
-- so that it keeps running when one of its nodes is lost and the step can run again in
-- the same job (hp_auto_resume.so). Every other submission is left as it is.

local MAX_SCRIPT = 1048576

local function script_text(options)
	local wrap = options["wrap"]
	if wrap ~= nil and wrap ~= "" then
		return wrap
	end
	local argv = options["argv"]
	local path = argv and argv[1]
	if path == nil or path == "" then
		return nil -- a script on stdin: the job can be given --no-kill by hand
	end
	local f = io.open(path, "r")
	if f == nil then
		return nil
	end
	local text = f:read(MAX_SCRIPT)
	f:close()
	return text
end

function slurm_cli_setup_defaults(options, early_pass)
	return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, pack_offset)
	if options["type"] ~= "sbatch" then
		return slurm.SUCCESS
	end
	local text = script_text(options)
	if text ~= nil and string.find(text, "%-%-auto%-resume") and options["no-kill"] ~= "set" then
		options["no-kill"] = "set"
	end
	return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, job_id, step_id)
	return slurm.SUCCESS
end
