#!/usr/bin/env bash
# Stages the root file system of the holdfast container image: the binary and nothing else it does not need.
#
#   deploy/docker/rootfs.sh BINARY OUTDIR
#
# OUTDIR (created; it must not exist or be empty) receives:
#   /holdfast                        BINARY, with its debug information stripped when `strip` is there
#   the shared libraries `ldd BINARY` lists, each at the path ldd names, symlinks resolved (a copy of the
#   file, not a link), the program interpreter (/lib64/ld-linux-x86-64.so.2) among them
#   /etc/passwd, /etc/group          root and `nonroot` (65532:65532), the user the image runs as
#   /etc/nsswitch.conf               `hosts: files dns`, so that getaddrinfo reads /etc/hosts and then asks
#                                    the resolver Docker writes to /etc/resolv.conf (glibc 2.34 and later
#                                    have the files and dns NSS modules inside libc: nothing to dlopen)
#   /data, /tmp                      empty, owned by 65532:65532 (when run as root; otherwise the image
#                                    build sets the owner, see cluster/image.sh), /tmp with mode 1777
#
# Both images use it: cluster/image.sh (the image CI tests, from a binary built on this machine) and the
# build stage of deploy/docker/Dockerfile, so the runtime layout is the one CI tests. The binary must be
# dynamically linked against glibc (the default for x86_64-unknown-linux-gnu), or statically linked (then
# there is nothing to copy).
set -euo pipefail

if (($# != 2)); then
    echo "usage: $0 BINARY OUTDIR" >&2
    exit 2
fi
binary=$1
out=$2
NONROOT_ID=65532

[[ -f $binary && -x $binary ]] || { echo "rootfs.sh: $binary is not an executable file" >&2; exit 1; }
if [[ -e $out ]] && [[ -n $(ls -A "$out") ]]; then
    echo "rootfs.sh: $out exists and is not empty" >&2
    exit 1
fi
mkdir -p "$out"

# The binary.
cp "$binary" "$out/holdfast"
if command -v strip >/dev/null; then
    # Debug information only: the symbols stay, so a panic's backtrace still names functions.
    strip --strip-debug "$out/holdfast"
fi
chmod 0755 "$out/holdfast"

# Its shared libraries. ldd prints `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` for a library,
# `/lib64/ld-linux-x86-64.so.2 (0x…)` for the interpreter, and `linux-vdso.so.1 (0x…)` for the vDSO, which
# the kernel provides (no path: skipped).
if ldd_out=$(ldd "$binary" 2>&1); then
    libs=$(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$ldd_out" | sort -u)
else
    case $ldd_out in
        *"not a dynamic executable"* | *"statically linked"*) libs="" ;;
        *) echo "rootfs.sh: ldd $binary failed: $ldd_out" >&2; exit 1 ;;
    esac
fi
if grep -q "not found" <<<"$ldd_out"; then
    echo "rootfs.sh: $binary needs libraries that are missing here:" >&2
    grep "not found" <<<"$ldd_out" >&2
    exit 1
fi
for lib in $libs; do
    mkdir -p "$out$(dirname "$lib")"
    # -L: copy what the link points to, under the name the loader looks for.
    cp -L "$lib" "$out$lib"
    chmod 0755 "$out$lib"
done

# Users, groups, name resolution.
mkdir -p "$out/etc"
cat >"$out/etc/passwd" <<PASSWD
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:${NONROOT_ID}:${NONROOT_ID}:nonroot:/data:/sbin/nologin
PASSWD
cat >"$out/etc/group" <<GROUP
root:x:0:
nonroot:x:${NONROOT_ID}:
GROUP
cat >"$out/etc/nsswitch.conf" <<'NSS'
passwd: files
group: files
hosts: files dns
NSS
chmod 0644 "$out/etc/passwd" "$out/etc/group" "$out/etc/nsswitch.conf"

# Where the node keeps its state (a volume) and a scratch directory.
mkdir -p "$out/data" "$out/tmp"
chmod 0755 "$out/data"
chmod 1777 "$out/tmp"
if ((EUID == 0)); then
    chown -R 0:0 "$out"
    chown "$NONROOT_ID:$NONROOT_ID" "$out/data" "$out/tmp"
fi

echo "rootfs.sh: staged $out:"
(cd "$out" && find . -type f -printf '  /%P (%s bytes)\n' | sort)
