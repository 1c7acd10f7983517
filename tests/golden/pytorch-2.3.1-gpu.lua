-- pytorch/2.3.1-gpu: PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1
-- Written by hpcstack 0.1.0 from recipe pytorch/2.3.1-gpu for site cirrus.

help([[
pytorch/2.3.1-gpu: PyTorch with Horovod

  extend-venv-activate ~/myvenv
]])

whatis("Description: PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1")

family("pytorch")
whatis("Version: 2.3.1-gpu")
whatis("Packages: torch 2.3.1, horovod 0.28.1")
whatis("Keywords: pytorch, GPU")

depends_on("python/3.12.1-gpu")

if mode() == "load" and (os.getenv("VIRTUAL_ENV") or "") ~= "" then
    local venv = os.getenv("VIRTUAL_ENV")
    local activate = pathJoin(venv, "bin", "activate")
    local found, P = pcall(require, "posix")
    local checked = found and type(P) == "table" and P.open and P.read and P.close and P.O_NONBLOCK
    local text = ""
    if checked and venv:sub(1, 1) == "/" and activate:sub(1, 1) == "/" then
        local fd = P.open(activate, P.O_RDONLY + P.O_NONBLOCK)
        if fd then
            local ok, chunk = pcall(P.read, fd, 1048576)
            text = ok and type(chunk) == "string" and chunk or ""
            P.close(fd)
        end
    end
    if checked and not text:find("# >>> hpcstack pytorch/2.3.1-gpu >>>", 1, true) then
        local shown = venv:gsub("%c", "?")
        LmodMessage((("pytorch/2.3.1-gpu: the active venv @VENV@ is not extended; fix: extend-venv-activate @VENV@"):gsub("@VENV@", function() return shown end)))
    end
end

if mode() == "load" then
    local ok, verdict = pcall(function()
        if lfs.attributes("/sw/modules/.hpcstack-status.json", "mode") ~= "file" then return nil end
        local fh = io.open("/sw/modules/.hpcstack-status.json", "r")
        if not fh then return nil end
        local text = fh:read(65536) or ""
        fh:close()
        local needle = "\n\"pytorch/2.3.1-gpu\": \""
        local at = text:find(needle, 1, true)
        if not at then return nil end
        return text:match('^([^"\n]+)"', at + #needle)
    end)
    if ok and verdict then
        LmodMessage("pytorch/2.3.1-gpu: " .. verdict .. " (hpcstack status for details)")
    end
end

if mode() == "load" and os.getenv("SLURM_EXPORT_ENV") == "NONE" then
    setenv("SLURM_EXPORT_ENV", "ALL")
end

local root = "/sw/pytorch/2.3.1-gpu"
setenv("HPCSTACK_PYTORCH_ROOT", root)
prepend_path("PATH", "/sw/pytorch/2.3.1-gpu/bin")
prepend_path("PATH", "/sw/pytorch/2.3.1-gpu/venv/bin")
prepend_path("PYTHONPATH", "/sw/pytorch/2.3.1-gpu/venv/lib/python3.12/site-packages")
