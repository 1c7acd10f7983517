#%Module1.0
##
## pytorch/2.3.1-gpu: PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1
## Written by hpcstack 0.1.0 from recipe pytorch/2.3.1-gpu for site cirrus.
##
proc ModulesHelp { } {
    puts stderr {pytorch/2.3.1-gpu: PyTorch with Horovod}
    puts stderr ""
    puts stderr {  extend-venv-activate ~/myvenv}
}

module-whatis {Description: PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1}

conflict pytorch
module-whatis {Version: 2.3.1-gpu}
module-whatis {Packages: torch 2.3.1, horovod 0.28.1}
module-whatis {Keywords: pytorch, GPU}

depends-on python/3.12.1-gpu

if {[module-info mode load] && [info exists ::env(VIRTUAL_ENV)] && $::env(VIRTUAL_ENV) ne ""} {
    set hpcstack_extended 0
    set hpcstack_activate [file join $::env(VIRTUAL_ENV) bin activate]
    if {[file pathtype $::env(VIRTUAL_ENV)] eq "absolute" && [string index $hpcstack_activate 0] eq "/"
            && [file isfile $hpcstack_activate] && [file readable $hpcstack_activate]
            && ![catch {open $hpcstack_activate {RDONLY NONBLOCK}} hpcstack_fh]} {
        catch {set hpcstack_extended [expr {[string first {# >>> hpcstack pytorch/2.3.1-gpu >>>} [read $hpcstack_fh 1048576]] >= 0}]}
        close $hpcstack_fh
    }
    if {!$hpcstack_extended} {
        regsub -all {[[:cntrl:]]} $::env(VIRTUAL_ENV) ? hpcstack_venv
        puts stderr [string map [list @VENV@ $hpcstack_venv] {pytorch/2.3.1-gpu: the active venv @VENV@ is not extended; fix: extend-venv-activate @VENV@}]
    }
}

if {[module-info mode load] && [string index {/sw/modules/.hpcstack-status.json} 0] eq "/"
        && [file isfile {/sw/modules/.hpcstack-status.json}]
        && ![catch {open {/sw/modules/.hpcstack-status.json} {RDONLY NONBLOCK}} hpcstack_sf]} {
    catch {
        set hpcstack_st [read $hpcstack_sf 65536]
        set hpcstack_at [string first "\n\"pytorch/2.3.1-gpu\": \"" $hpcstack_st]
        if {$hpcstack_at >= 0} {
            set hpcstack_st [string range $hpcstack_st [expr {$hpcstack_at + 23}] end]
            set hpcstack_end [string first "\"" $hpcstack_st]
            if {$hpcstack_end > 0} {
                set hpcstack_line {pytorch/2.3.1-gpu: }
                append hpcstack_line [string range $hpcstack_st 0 [expr {$hpcstack_end - 1}]] " (hpcstack status for details)"
                puts stderr $hpcstack_line
            }
        }
    }
    catch {close $hpcstack_sf}
}

if {[module-info mode load] && [info exists ::env(SLURM_EXPORT_ENV)] && $::env(SLURM_EXPORT_ENV) eq "NONE"} {
    setenv SLURM_EXPORT_ENV ALL
}

set root {/sw/pytorch/2.3.1-gpu}
setenv HPCSTACK_PYTORCH_ROOT $root
prepend-path PATH {/sw/pytorch/2.3.1-gpu/bin}
prepend-path PATH {/sw/pytorch/2.3.1-gpu/venv/bin}
prepend-path PYTHONPATH {/sw/pytorch/2.3.1-gpu/venv/lib/python3.12/site-packages}
