# Shared by scripts/fresh-machine and scripts/container-image (sourced, not run): the minbase
# Debian 12 root filesystem they start from, kept between runs, the hard-linked copy of the
# end-to-end stack's caches they share with the host, and buildah's storage driver.

# hpcstack_rootfs ROOT: make sure ROOT holds the root filesystem tar of this week (Debian's point
# releases and security updates come in; apt-get update inside gets the rest), anew when the
# mmdebstrap command changes; set ROOTFS to its path. Older ones (and what an interrupted run
# left) are removed. The caller holds ROOT's lock (scripts/fresh-machine's flock on ROOT/lock).
# Prints "::: mmdebstrap …" phases when it builds one (about 1 minute, 170 MB).
hpcstack_rootfs() {
  local root=$1 key start
  local -a cmd=(mmdebstrap --quiet --variant=minbase bookworm)
  key=$(date +%G-w%V)-$(printf '%s\n' "${cmd[*]}" | sha256sum | cut -c1-8)
  ROOTFS=$root/rootfs-bookworm-minbase-$key.tar
  if [ ! -f "$ROOTFS" ]; then
    echo "::: mmdebstrap ${cmd[*]} -> $ROOTFS"
    start=$SECONDS
    rm -rf "$root"/rootfs-*
    "${cmd[@]}" --format=tar "$ROOTFS.new"
    mv "$ROOTFS.new" "$ROOTFS"
    echo "::: mmdebstrap: $((SECONDS - start)) s"
  fi
}

# hpcstack_link_cache FROM TO: hard-link the cache FROM (uv's wheels, Horovod's builds, sources)
# into TO, keeping files already there; a copy where FROM is on another filesystem. Nothing is
# written to FROM.
hpcstack_link_cache() {
  local from=$1 to=$2 start=$SECONDS
  mkdir -p "$to"
  if [ -d "$from" ]; then
    echo "::: cache: hard links from $from"
    # a second try, then a copy (another filesystem); a file that vanished while copied (a
    # temporary file of an install running beside) is left out: the install fetches what is missing
    cp -al --no-clobber "$from/." "$to/" 2>/dev/null || cp -al --no-clobber "$from/." "$to/" 2>/dev/null \
      || cp -a --no-clobber "$from/." "$to/" \
      || echo "::: cache: some files of $from changed while copied and were left out"
    echo "::: cache: $((SECONDS - start)) s"
  else
    echo "::: cache: no $from (the install downloads everything)"
  fi
}

# hpcstack_storage_driver ROOT: buildah's storage driver for a storage under ROOT: "overlay"
# where the kernel's overlay file system mounts on ROOT's file system (as root: an image's layers
# and a container share the files below them), else "vfs", which copies the whole file system
# for every layer and every container (on 2 cores, minutes for the 7 GB PyTorch image: `buildah
# from` alone about 2 minutes). $STORAGE_DRIVER (buildah's own variable) chooses instead.
hpcstack_storage_driver() {
  local root=$1 probe driver=vfs
  if [ -n "${STORAGE_DRIVER:-}" ]; then
    echo "$STORAGE_DRIVER"
    return 0
  fi
  mkdir -p "$root"
  probe=$(mktemp -d "$root/.overlay-probe-XXXXXX")
  mkdir "$probe/lower" "$probe/upper" "$probe/work" "$probe/merged"
  if mount -t overlay hpcstack-probe -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" \
       "$probe/merged" 2>/dev/null; then
    umount "$probe/merged"
    driver=overlay
  fi
  rm -rf "$probe"
  echo "$driver"
}
