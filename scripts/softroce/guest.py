#!/usr/bin/env python3
"""Run a command against real ibverbs (Soft-RoCE) inside a throwaway QEMU guest.

The host kernel of the project's machines has no RDMA, and its /dev/kvm cannot run
a stock kernel, so this boots Debian's kernel under TCG with a busybox initramfs.
The guest has no disk image: it mounts the host's /usr /etc /opt /var /root /home
/srv read-only over virtio-9p (with tmpfs overlays so tools can write), the project
directory read-write at the same path, then creates six Soft-RoCE devices on three
veth pairs (rxe0 on sr0 = 192.0.2.1, rxe1 on sr1 = 192.0.2.2; rxe2 on sr2 =
198.51.100.1, rxe3 on sr3 = 198.51.100.2: a second port each, for rails, dual-stack
with 2001:db8:2::1 and ::2 as well; rxe4 on
sr4 = 2001:db8:5::1, rxe5 on sr5 = 2001:db8:5::2: a network with IPv6 alone) and runs
the command in a chroot. Host-built binaries, the project's Python and pytest run unchanged.

    guest.py prepare              # download + unpack the kernel, build the initramfs
    guest.py run --check          # built-in self-test (ibv_devices, GIDs, pingpong, pyverbs)
    guest.py run -- CMD ARGS...   # run CMD in the project directory inside the guest
    guest.py status               # what is installed / prepared, without side effects

The command's stdout and stderr come back on this script's stdout and stderr, and
its exit code is this script's exit code (124: guest timed out, 125: the guest
failed before or instead of reporting the command's exit code). Harness messages,
including the timings, go to stderr prefixed with "[softroce]".

Standard library only; see README.md next to this file for the pitfalls.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import hashlib
import lzma
import os
import re
import secrets
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Dict, List, Optional, Tuple

# ---------------------------------------------------------------------------------
# Constants

# The guest's fixed network and device layout; tests may read these back from the
# RCOLL_SOFTROCE_* variables exported in the guest.
ADDR0, ADDR1 = "192.0.2.1", "192.0.2.2"   # TEST-NET-1: never routed anywhere real
# A second pair, for a rank with two ports (rails): rxe2 on sr2 and rxe3 on sr3,
# with IPv6 addresses too (a dual-stack network).
ADDR2, ADDR3 = "198.51.100.1", "198.51.100.2"   # TEST-NET-2
ADDR2_6, ADDR3_6 = "2001:db8:2::1", "2001:db8:2::2"
# A third pair with IPv6 addresses only (the documentation prefix): rxe4 on sr4, rxe5 on sr5.
ADDR4, ADDR5 = "2001:db8:5::1", "2001:db8:5::2"
DEVICES = ("rxe0", "rxe1", "rxe2", "rxe3", "rxe4", "rxe5")

# Host directories the chroot sees. All get a tmpfs overlay: writes (apt lock files,
# ~/.cache, /etc/hostname, ...) must succeed without ever reaching the host.
HOST_DIRS = ("/usr", "/etc", "/opt", "/var", "/root", "/home", "/srv")

# Modules the initramfs must insmod itself, before the host's module tree is
# reachable (it arrives over 9p, which needs these). Dependencies are resolved from
# modules.dep; anything built into the kernel is skipped.
BOOT_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")

# Environment passed from the caller into the guest command (names and prefixes).
PASS_ENV_NAMES = ("PATH", "PYTHONPATH", "HOME", "VIRTUAL_ENV", "LANG", "LC_ALL",
                  "LC_CTYPE", "TZ", "USER", "LOGNAME", "PYENV_ROOT", "PYENV_VERSION")
PASS_ENV_PREFIXES = ("RCOLL_", "PYTHON", "PYTEST_")
# PYTEST_CURRENT_TEST names the *host* test that is running us; the guest's pytest
# must not inherit it.
NO_PASS_ENV = ("PYTEST_CURRENT_TEST",)

QEMU = "qemu-system-x86_64"
QEMU_BASE_ARGS = ["-accel", "tcg,thread=multi", "-cpu", "max", "-machine", "q35",
                  "-smp", "2", "-m", "3072", "-nodefaults", "-display", "none",
                  "-no-reboot"]
# 9p round trips are expensive under TCG; a large msize cuts their number for
# reads of big files (.so, wheels). 512000 is the most the 6.1 virtio transport
# accepts (it clamps larger values, with a warning per mount).
MSIZE = 512000

EXIT_TIMEOUT = 124
EXIT_HARNESS = 125

# Host tool -> Debian package providing it (for "install X" messages).
TOOL_PACKAGES = {
    QEMU: "qemu-system-x86",
    "busybox": "busybox-static",
    "apt-get": "apt",
    "apt-cache": "apt",
    "dpkg-deb": "dpkg",
    "depmod": "kmod",
    "modprobe": "kmod",
    "ip": "iproute2",
    "rdma": "iproute2",
    "ss": "iproute2",
    "ibv_devices": "ibverbs-utils",
    "ibv_devinfo": "ibverbs-utils",
    "ibv_rc_pingpong": "ibverbs-utils",
}
RXE_PROVIDER_GLOB = "/usr/lib/*/libibverbs/librxe-rdmav*.so"


def log(msg: str) -> None:
    print(f"[softroce] {msg}", file=sys.stderr, flush=True)


class HarnessError(Exception):
    """A problem with the harness or the host setup (not with the guest command)."""


# ---------------------------------------------------------------------------------
# Paths and host checks

def default_cache_dir() -> Path:
    env = os.environ.get("RCOLL_SOFTROCE_CACHE")
    if env:
        return Path(env).expanduser().absolute()
    return Path.home() / ".cache" / "rcoll-softroce"


def check_share_path(path: str, what: str) -> None:
    # QEMU's -virtfs option parser splits on ',' and the 9p mount code on ':'
    # and whitespace; such paths cannot be shared reliably.
    if any(c in path for c in " \t\n:,"):
        raise HarnessError(f"{what} {path!r} contains a space, colon or comma; "
                           "9p shares cannot use it (pick another directory)")


def missing_tools(tools) -> List[str]:
    """['tool (apt install pkg)', ...] for each tool not on PATH (plus sbin dirs)."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    out = []
    for tool in tools:
        if shutil.which(tool, path=path) is None:
            out.append(f"{tool} (apt-get install {TOOL_PACKAGES.get(tool, '?')})")
    return out


def static_busybox() -> Optional[str]:
    """Path of a statically linked busybox, or None: the initramfs has no libc."""
    for cand in ("/bin/busybox", "/usr/bin/busybox", shutil.which("busybox")):
        if cand and os.path.isfile(cand) and not elf_has_interp(cand):
            return cand
    return None


def elf_has_interp(path: str) -> bool:
    with open(path, "rb") as f:
        data = f.read(1 << 16)
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return True  # not a 64-bit ELF: treat as unusable
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        ptype, = struct.unpack_from("<I", data, phoff + i * phentsize)
        if ptype == 3:  # PT_INTERP: dynamically linked
            return True
    return False


def host_problems(for_check: bool = False) -> List[str]:
    """Missing pieces for booting the guest and setting up Soft-RoCE in it."""
    problems = missing_tools([QEMU, "modprobe", "ip", "rdma"])
    if static_busybox() is None:
        problems.append("static busybox (apt-get install busybox-static)")
    import glob
    if not glob.glob(RXE_PROVIDER_GLOB):
        problems.append("libibverbs rxe provider (apt-get install ibverbs-providers)")
    if for_check:
        problems += missing_tools(["ibv_devices", "ibv_devinfo", "ibv_rc_pingpong", "ss"])
        if not os.path.exists("/usr/bin/python3") or subprocess.run(
                ["/usr/bin/python3", "-c", "import pyverbs"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
            problems.append("pyverbs for /usr/bin/python3 (apt-get install python3-pyverbs)")
    return problems


# ---------------------------------------------------------------------------------
# prepare: kernel, modules, initramfs

class Cache:
    def __init__(self, root: Path):
        self.root = root
        self.debs = root / "debs"
        self.kernels = root / "kernel"
        self.runs = root / "runs"
        self.current = root / "current-kernel"

    def kdir(self, ver: str) -> Path:
        return self.kernels / ver

    def modules_dir(self, ver: str) -> Path:
        return self.kdir(ver) / "root" / "lib" / "modules" / ver

    def initramfs(self, ver: str) -> Path:
        return self.kdir(ver) / "initramfs.cpio"

    def vmlinux(self, ver: str) -> Path:
        return self.kdir(ver) / "vmlinux"

    def vmlinuz(self, ver: str) -> Path:
        return self.kdir(ver) / "root" / "boot" / f"vmlinuz-{ver}"

    def current_version(self) -> Optional[str]:
        try:
            ver = self.current.read_text().strip()
        except FileNotFoundError:
            return None
        return ver if (self.modules_dir(ver) / "modules.dep").exists() else None


def resolve_kernel_package() -> str:
    """Newest Debian kernel package, as the linux-image-amd64 metapackage names it."""
    if missing_tools(["apt-cache"]):
        raise HarnessError("apt-cache not found: cannot find a kernel package; "
                           "pass --kernel-package or use a prepared cache")
    out = subprocess.run(["apt-cache", "depends", "linux-image-amd64"],
                         capture_output=True, text=True)
    m = re.search(r"Depends:\s*(linux-image-\d\S*-amd64)\b", out.stdout)
    if not m:
        raise HarnessError("apt-cache depends linux-image-amd64 named no kernel "
                           f"package (run apt-get update?): {out.stdout}{out.stderr}")
    return m.group(1)


def obtain_kernel(cache: Cache, package: str) -> str:
    """Download and unpack `package`, run depmod; returns the kernel version."""
    ver = package[len("linux-image-"):]
    if (cache.modules_dir(ver) / "modules.dep").exists():
        log(f"kernel {ver}: already unpacked in {cache.kdir(ver)}")
        return ver
    probs = missing_tools(["apt-get", "dpkg-deb", "depmod"])
    if probs:
        raise HarnessError("missing: " + ", ".join(probs))
    cache.debs.mkdir(parents=True, exist_ok=True)
    debs = sorted(cache.debs.glob(f"{package}_*.deb"))
    if not debs:
        log(f"downloading {package} with apt-get download ...")
        t0 = time.monotonic()
        # apt-get download runs as root here and warns that _apt cannot access the
        # cache directory; harmless.
        r = subprocess.run(["apt-get", "download", package], cwd=cache.debs,
                           capture_output=True, text=True)
        debs = sorted(cache.debs.glob(f"{package}_*.deb"))
        if r.returncode != 0 or not debs:
            raise HarnessError(f"apt-get download {package} failed:\n{r.stdout}{r.stderr}")
        log(f"downloaded {debs[-1].name} ({debs[-1].stat().st_size >> 20} MiB) "
            f"in {time.monotonic() - t0:.1f}s")
    deb = debs[-1]
    kdir = cache.kdir(ver)
    tmp = kdir / "root.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.monotonic()
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp)], check=True)
    if not (tmp / "lib" / "modules" / ver).is_dir():
        raise HarnessError(f"{deb.name} has no lib/modules/{ver}")
    # The rename makes the unpacked tree appear atomically: an interrupted prepare
    # leaves only root.partial, which the next prepare discards.
    shutil.rmtree(kdir / "root", ignore_errors=True)
    tmp.rename(kdir / "root")
    log(f"unpacked {deb.name} in {time.monotonic() - t0:.1f}s")
    subprocess.run([shutil.which("depmod", path="/usr/sbin:/sbin:" + os.environ.get("PATH", "")),
                    "-b", str(kdir / "root"), ver], check=True)
    log(f"depmod {ver}: done")
    deb.unlink()  # the unpacked tree is the cache; the .deb re-downloads in seconds
    return ver


def extract_vmlinux(vmlinuz: Path) -> Tuple[Optional[bytes], str]:
    """Uncompressed ELF kernel from a bzImage, as scripts/extract-vmlinux does.

    Booting the ELF through PVH skips the in-guest decompression, which costs
    seconds under TCG. Returns (elf, how) or (None, why not)."""
    data = vmlinuz.read_bytes()
    decoders = [
        (b"\xfd7zXZ\x00", "xz", lambda d: lzma.LZMADecompressor(lzma.FORMAT_XZ).decompress(d)),
        (b"\x1f\x8b\x08", "gzip", lambda d: zlib.decompressobj(31).decompress(d)),
    ]
    for magic, name, decode in decoders:
        pos = data.find(magic)
        while pos >= 0:
            try:
                elf = decode(data[pos:])
            except (lzma.LZMAError, zlib.error, EOFError):
                elf = b""
            if elf[:4] == b"\x7fELF":
                if not elf_has_pvh_note(elf):
                    return None, "kernel ELF has no PVH entry note (CONFIG_PVH off)"
                return elf, f"{name} payload at offset {pos}"
            pos = data.find(magic, pos + 1)
    return None, "no xz/gzip payload found (zstd/lz4 kernels are booted compressed)"


def elf_has_pvh_note(elf: bytes) -> bool:
    # QEMU boots an ELF kernel only through the Xen PVH entry point
    # (XEN_ELFNOTE_PHYS32_ENTRY = 18 in a "Xen" note).
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    for i in range(phnum):
        ptype, _, off, _, _, filesz = struct.unpack_from("<IIQQQQ", elf, phoff + i * phentsize)
        if ptype != 4:  # PT_NOTE
            continue
        pos, end = off, off + filesz
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, pos)
            name = elf[pos + 12:pos + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == 18:
                return True
            pos += 12 + ((namesz + 3) & ~3) + ((descsz + 3) & ~3)
    return False


def boot_modules(moddir: Path) -> List[Path]:
    """Module files for BOOT_MODULES and their dependencies, in load order."""
    def norm(name: str) -> str:
        return name.replace("-", "_")

    deps: Dict[str, List[str]] = {}
    path_of: Dict[str, str] = {}
    for line in (moddir / "modules.dep").read_text().splitlines():
        target, _, rest = line.partition(":")
        name = norm(os.path.basename(target).split(".ko")[0])
        path_of[name] = target
        deps[name] = [norm(os.path.basename(d).split(".ko")[0]) for d in rest.split()]
    builtin = {norm(os.path.basename(line).split(".ko")[0])
               for line in (moddir / "modules.builtin").read_text().split()}
    order: List[str] = []

    def visit(name: str) -> None:
        if name in order or name in builtin:
            return
        if name not in deps:
            raise HarnessError(f"kernel module {name} not found in {moddir}")
        for dep in deps[name]:
            visit(dep)
        order.append(name)

    for name in BOOT_MODULES:
        visit(norm(name))
    return [moddir / path_of[n] for n in order]


class Cpio:
    """Minimal writer of the "newc" cpio format the kernel unpacks as initramfs."""

    def __init__(self):
        self.parts: List[bytes] = []
        self.ino = 1

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev=(0, 0)) -> None:
        namez = name.encode() + b"\0"
        hdr = "070701" + "".join(f"{v:08x}" for v in (
            self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(namez), 0))
        self.ino += 1
        blob = hdr.encode() + namez
        blob += b"\0" * (-len(blob) % 4)
        blob += data + b"\0" * (-len(data) % 4)
        self.parts.append(blob)

    def dir(self, name: str) -> None:
        self._entry(name, 0o040755)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._entry(name, 0o100000 | mode, data)

    def chardev(self, name: str, major: int, minor: int) -> None:
        self._entry(name, 0o020600, rdev=(major, minor))

    def bytes(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        out = b"".join(self.parts)
        return out + b"\0" * (-len(out) % 512)


# Stage 0 of the guest's PID 1, baked into the initramfs. It only reaches the
# per-run directory shared by the host and hands over to the init.sh found there,
# so that changing the guest logic never needs a rebuilt initramfs.
INIT0 = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
while read -r m; do
    insmod "/modules/$m" || echo "softroce-init0: insmod $m failed"
done < /modules/order
i=0
until mount -t 9p -o trans=virtio,version=9p2000.L,msize=%(msize)d,cache=none rcollrun /share; do
    i=$((i + 1))
    if [ $i -ge 20 ]; then
        echo "softroce-init0: cannot mount the run directory (tag rcollrun)"
        poweroff -f
    fi
    sleep 0.2
done
exec sh /share/init.sh
""" % {"msize": MSIZE}


def build_initramfs(cache: Cache, ver: str, quiet: bool = False) -> None:
    busybox = static_busybox()
    if busybox is None:
        raise HarnessError("no static busybox: apt-get install busybox-static")
    mods = boot_modules(cache.modules_dir(ver))
    bb = Path(busybox).read_bytes()
    # Rebuild only when an input changed: busybox, module set, stage-0 script.
    stamp = hashlib.sha256(bb + INIT0.encode() + "\n".join(map(str, mods)).encode()).hexdigest()
    out = cache.initramfs(ver)
    stamp_file = out.with_suffix(".stamp")
    if out.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        if not quiet:
            log(f"initramfs: up to date ({out}, {out.stat().st_size >> 10} KiB)")
        return
    c = Cpio()
    for d in ("bin", "dev", "proc", "sys", "mnt", "mnt/lower", "mnt/upper", "share",
              "newroot", "tmp", "modules"):
        c.dir(d)
    # Without /dev/console in the archive the kernel starts init with no stdio.
    c.chardev("dev/console", 5, 1)
    c.file("bin/busybox", bb, 0o755)
    c.file("init", INIT0.encode(), 0o755)
    for m in mods:
        c.file(f"modules/{m.name}", m.read_bytes())
    c.file("modules/order", "".join(m.name + "\n" for m in mods).encode())
    # Uncompressed: decompressing in the guest would cost more than reading 6 MB.
    tmp = out.with_suffix(".partial")
    tmp.write_bytes(c.bytes())
    tmp.rename(out)
    stamp_file.write_text(stamp)
    log(f"initramfs: built {out} ({out.stat().st_size >> 10} KiB; modules: "
        + " ".join(m.stem for m in mods) + ")")


def prepare(cache: Cache, kernel_package: Optional[str] = None, refresh: bool = False,
            quiet: bool = False) -> str:
    """Idempotent: makes the cache ready to boot; returns the kernel version.

    quiet: report only what had to be done (`run` calls this every time, so that
    a changed busybox or stage-0 script is picked up; the no-op costs ~0.1 s)."""
    check_share_path(str(cache.root), "cache directory")
    cache.root.mkdir(parents=True, exist_ok=True)
    # Concurrent prepares (two pytest sessions) must not unpack into each other.
    with open(cache.root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ver = None if (kernel_package or refresh) else cache.current_version()
        if ver:
            if not quiet:
                log(f"kernel {ver}: cached in {cache.kdir(ver)}")
        else:
            package = kernel_package or resolve_kernel_package()
            log(f"kernel package: {package}")
            ver = obtain_kernel(cache, package)
        vmlinux = cache.vmlinux(ver)
        no_vmlinux = vmlinux.with_suffix(".unavailable")
        if vmlinux.exists():
            if not quiet:
                log(f"uncompressed kernel: {vmlinux}")
        elif no_vmlinux.exists():
            if not quiet:
                log(f"uncompressed kernel: unavailable ({no_vmlinux.read_text().strip()}); "
                    "booting vmlinuz")
        else:
            t0 = time.monotonic()
            elf, how = extract_vmlinux(cache.vmlinuz(ver))
            if elf is None:
                no_vmlinux.write_text(how + "\n")
                log(f"uncompressed kernel: {how}; booting vmlinuz")
            else:
                tmp = vmlinux.with_suffix(".partial")
                tmp.write_bytes(elf)
                tmp.rename(vmlinux)
                log(f"uncompressed kernel: extracted {vmlinux} ({how}, "
                    f"{len(elf) >> 20} MiB) in {time.monotonic() - t0:.1f}s")
        build_initramfs(cache, ver, quiet)
        if cache.current_version() != ver:
            cache.current.write_text(ver + "\n")
    return ver


def is_prepared(cache: Cache) -> bool:
    ver = cache.current_version()
    return bool(ver) and cache.initramfs(ver).exists()


# ---------------------------------------------------------------------------------
# Guest-side scripts

# Stage 1 of PID 1 (busybox sh, outside the chroot); config.sh and mounts come
# from the host, next to this file in the run directory.
INIT_SH = r"""
. /share/config.sh
say() { echo "@@rcoll-softroce:$NONCE:$*@@"; }
die() {
    echo "softroce-init: $*"
    say SETUP-FAILED
    sync
    poweroff -f; sleep 5; reboot -f
}
# Kernel messages would interleave with the harness's markers; keep only the
# severe ones on the console unless --verbose.
echo "$PRINTK" > /proc/sys/kernel/printk
say BOOTED

mount -t tmpfs -o mode=0755 newroot /newroot || die "tmpfs /newroot"
mount -t tmpfs -o mode=0755 upper /mnt/upper || die "tmpfs /mnt/upper"
ninep="trans=virtio,version=9p2000.L,msize=$MSIZE"
# Host trees are read-only shares under a tmpfs overlay; cache=loose is safe there
# because the host does not change them under a test, and it saves most of the 9p
# round trips that Python imports would cost. The project is shared read-write
# with cache=mmap: coherent writes, and shared mmap works.
mount_share() {
    tag=$1; dst=/newroot$2; mode=$3
    case $mode in
    overlay)
        mkdir -p "/mnt/lower/$tag" "/mnt/upper/$tag/u" "/mnt/upper/$tag/w" "$dst" &&
        mount -t 9p -o "ro,$ninep,cache=loose" "$tag" "/mnt/lower/$tag" &&
        mount -t overlay \
            -o "lowerdir=/mnt/lower/$tag,upperdir=/mnt/upper/$tag/u,workdir=/mnt/upper/$tag/w" overlay "$dst" ;;
    ro)
        mkdir -p "$dst" && mount -t 9p -o "ro,$ninep,cache=loose" "$tag" "$dst" ;;
    rw)
        mkdir -p "$dst" && mount -t 9p -o "$ninep,cache=mmap" "$tag" "$dst" ;;
    esac
}
# /tmp first: a project (or venv) under /tmp, as CI clones often are, is then
# mounted on top of it instead of being hidden by it.
mkdir -p /newroot/tmp && mount -t tmpfs -o mode=1777 tmp /newroot/tmp || die "tmpfs /tmp"
while read -r tag path mode; do
    mount_share "$tag" "$path" "$mode" || die "cannot mount $path ($tag, $mode)"
done < /share/mounts
for link in $SYMLINKS; do
    ln -s "${link#*=}" "/newroot/${link%%=*}"
done
mkdir -p /newroot/proc /newroot/sys /newroot/dev /newroot/tmp /newroot/run
mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -t devtmpfs devtmpfs /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777 shm /newroot/dev/shm
mount -t tmpfs -o mode=0755 run /newroot/run
mkdir -p /newroot/run/rcoll-softroce
cp /share/setup.sh /share/cmd.sh /share/check.sh /newroot/run/rcoll-softroce/ || die "copy scripts"
# The kernel asks for modules (veth, rxe, ...) through /proc/sys/kernel/modprobe,
# resolved in the initramfs, which has no modprobe: hand it to the host's.
printf '#!/bin/sh\nexec /bin/chroot /newroot /sbin/modprobe "$@"\n' > /bin/modprobe-chroot
chmod 755 /bin/modprobe-chroot
echo /bin/modprobe-chroot > /proc/sys/kernel/modprobe
hostname softroce-guest

env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin chroot /newroot /bin/sh /run/rcoll-softroce/setup.sh \
    || die "Soft-RoCE setup failed"
say READY

# The command's output goes to files in the run directory, which the host tails:
# no tty in between (no \r\n, no colours), stdout and stderr kept apart, and a
# leftover background process cannot hold up the shutdown.
env -i chroot /newroot /bin/sh /run/rcoll-softroce/cmd.sh </dev/null >/share/stdout 2>/share/stderr
rc=$?
echo "$rc" > /share/rc.partial && mv /share/rc.partial /share/rc
sync
say "RC=$rc"
poweroff -f
sleep 5
reboot -f
"""

def _crossing_batch(ends, prefix_len, host_len, addr_flags=""):
    """`ip -batch` lines for veth ends [(device, address, table), ...], taken in pairs: each end gets
    its address and comes up, and locally generated traffic to its pair's other address leaves through
    it (a rule and a table of its own), with the local table consulted only after those rules."""
    lines = [f"addr add {addr}/{prefix_len} dev {dev}{addr_flags}" for dev, addr, _ in ends]
    lines += [f"link set {dev} up" for dev, _, _ in ends]
    for i, (dev, addr, table) in enumerate(ends):
        other = ends[i ^ 1][1]
        lines.append(f"route add {other}/{host_len} dev {dev} src {addr} table {table}")
    for i, (_, _, table) in enumerate(ends):
        lines.append(f"rule add pref {table} iif lo to {ends[i ^ 1][1]} lookup {table}")
    lines += ["rule add pref 200 lookup local", "rule del pref 0 lookup local"]
    return "\n".join(lines)


# Runs in the chroot with the host's /bin/sh (dash). Recipe: /work/shared/softroce.md.
SETUP_SH = r"""set -eu
A0=%(a0)s A1=%(a1)s A2=%(a2)s A3=%(a3)s A4=%(a4)s A5=%(a5)s
# No udev in the guest: load what its rules would (uverbs for /dev/infiniband,
# rdma_ucm for librdmacm).
modprobe -a veth rdma_rxe ib_uverbs rdma_ucm
# Both addresses are local, so by default traffic between them short-cuts
# through lo and never reaches rxe. Two network namespaces are no way out:
# rdma_rxe on 6.1 listens on UDP 4791 only in the initial namespace. Instead,
# locally generated packets (iif lo) to either address are routed out of the
# *other* veth end, and the local table is consulted only after those rules, so
# the packet is delivered when it comes in on the peer. `to`-only rules: rules
# with `from` make rdma_cm resolve the wrong device. accept_local and no
# rp_filter: the packets arrive with a source address that is local.
ip link add sr0 type veth peer name sr1
ip link add sr2 type veth peer name sr3
ip link add sr4 type veth peer name sr5
for c in all default sr0 sr1 sr2 sr3; do
    echo 0 > /proc/sys/net/ipv4/conf/$c/rp_filter
    echo 1 > /proc/sys/net/ipv4/conf/$c/accept_local
done
# One `ip -batch` per family: every exec costs ~0.2 s under TCG. IPv6 has no
# rp_filter and takes local sources; nodad: its addresses are usable at once,
# not after duplicate detection.
ip -batch - <<EOF
link set lo up
%(ipv4_batch)s
EOF
ip -6 -batch - <<EOF
%(ipv6_batch)s
EOF
rdma link add rxe0 type rxe netdev sr0
rdma link add rxe1 type rxe netdev sr1
rdma link add rxe2 type rxe netdev sr2
rdma link add rxe3 type rxe netdev sr3
rdma link add rxe4 type rxe netdev sr4
rdma link add rxe5 type rxe netdev sr5

# GIDs are filled in asynchronously once the link is up; wait for the RoCE v2
# entries (IPv4 on rxe0 to rxe3, IPv6 on rxe2 to rxe5) and remember rxe0's
# index for the command.
roce_v2_index() {
    # $1: the device; $2: a pattern for the GID's text (IPv4-mapped addresses
    # are 0000:0000:0000:0000:0000:ffff:...). The table has 1024 entries;
    # `read` is a builtin, where `cat` would cost an exec (~0.2 s under TCG) per entry.
    d=/sys/class/infiniband/$1/ports/1
    for g in $(ls $d/gids | sort -n); do
        read -r gid < $d/gids/$g
        case $gid in
        $2)
            type=; read -r type < $d/gid_attrs/types/$g 2>/dev/null
            if [ "$type" = "RoCE v2" ]; then
                echo $g; return 0
            fi ;;
        esac
    done
    return 1
}
roce_v2_ipv4_index() { roce_v2_index $1 '0000:0000:0000:0000:0000:ffff:*'; }
roce_v2_ipv6_index() { roce_v2_index $1 '2001:0db8:*'; }
i=0
until idx0=$(roce_v2_ipv4_index rxe0) && idx1=$(roce_v2_ipv4_index rxe1) &&
      roce_v2_ipv4_index rxe2 >/dev/null && roce_v2_ipv4_index rxe3 >/dev/null &&
      roce_v2_ipv6_index rxe2 >/dev/null && roce_v2_ipv6_index rxe3 >/dev/null &&
      roce_v2_ipv6_index rxe4 >/dev/null && roce_v2_ipv6_index rxe5 >/dev/null; do
    i=$((i + 1))
    if [ $i -ge 150 ]; then
        echo "softroce-setup: no RoCE v2 IPv4 GID on rxe0..rxe3 or IPv6 GID on rxe2..rxe5 after 15 s" >&2
        exit 1
    fi
    sleep 0.1
done
[ "$idx0" = "$idx1" ] || echo "softroce-setup: note: GID index differs (rxe0 $idx0, rxe1 $idx1)"
cat > /run/rcoll-softroce/env.sh <<EOF
export RCOLL_SOFTROCE_GID_INDEX=$idx0
EOF
echo "softroce-setup: rxe0@sr0=$A0 rxe1@sr1=$A1 rxe2@sr2=$A2 rxe3@sr3=$A3 rxe4@sr4=$A4 rxe5@sr5=$A5," \
     "RoCE v2 IPv4 GID index $idx0"
""" % {"a0": ADDR0, "a1": ADDR1, "a2": ADDR2, "a3": ADDR3, "a4": ADDR4, "a5": ADDR5,
       "ipv4_batch": _crossing_batch([("sr0", ADDR0, 100), ("sr1", ADDR1, 101),
                                      ("sr2", ADDR2, 102), ("sr3", ADDR3, 103)], 24, 32),
       "ipv6_batch": _crossing_batch([("sr2", ADDR2_6, 102), ("sr3", ADDR3_6, 103),
                                      ("sr4", ADDR4, 104), ("sr5", ADDR5, 105)], 64, 128, " nodad")}

# The built-in self-test (`run --check`); dash in the chroot, host tools only.
CHECK_SH = r"""
pass=0; fail=0
T0=$(date +%%s.%%N)
# Section headers carry the time since the start, to see where a slow run went.
section() { echo "### $* (t=$(echo "$(date +%%s.%%N) $T0" | awk '{printf "%%.1f", $1 - $2}')s)"; }
ok()  { pass=$((pass + 1)); echo "CHECK PASS: $*"; }
bad() { fail=$((fail + 1)); echo "CHECK FAIL: $*"; }
A1=%(a1)s

section "ibv_devices"
out=$(ibv_devices 2>&1); echo "$out"
if echo "$out" | grep -qw rxe0 && echo "$out" | grep -qw rxe1; then
    ok "ibv_devices lists rxe0 and rxe1"
else
    bad "ibv_devices does not list rxe0 and rxe1"
fi

section "ibv_devinfo -d rxe0"
out=$(ibv_devinfo -d rxe0 2>&1); echo "$out"
if echo "$out" | grep -q PORT_ACTIVE; then ok "rxe0 port 1 is ACTIVE"; else bad "rxe0 port not ACTIVE"; fi

idx=
for dev in rxe0 rxe1; do
    d=/sys/class/infiniband/$dev/ports/1
    section "GID table of $dev port 1 (non-zero entries)"
    # 1024 entries: builtin `read`, not `cat` (an exec per entry is slow under TCG).
    for g in $(ls $d/gids | sort -n); do
        read -r gid < $d/gids/$g
        [ "$gid" = 0000:0000:0000:0000:0000:0000:0000:0000 ] && continue
        type="?"; read -r type < $d/gid_attrs/types/$g 2>/dev/null
        ndev="?"; read -r ndev < $d/gid_attrs/ndevs/$g 2>/dev/null
        echo "  gids/$g = $gid  type=$type  ndev=$ndev"
        case $gid in
        0000:0000:0000:0000:0000:ffff:*)
            if [ "$type" = "RoCE v2" ] && [ $dev = rxe0 ] && [ -z "$idx" ]; then idx=$g; fi ;;
        esac
    done
done
if [ -n "$idx" ]; then
    ok "rxe0 has a RoCE v2 IPv4 GID at index $idx"
else
    bad "rxe0 has no RoCE v2 IPv4 GID"; idx=1
fi

section "ibv_rc_pingpong -g $idx: server on rxe1, client on rxe0 -> $A1"
tx0=$(cat /sys/class/net/sr0/statistics/tx_packets)
rx1=$(cat /sys/class/net/sr1/statistics/rx_packets)
timeout 120 ibv_rc_pingpong -d rxe1 -g "$idx" > /tmp/pp-server.log 2>&1 &
spid=$!
# The client gives up at once if the server's TCP port is not open yet.
i=0
until ss -Hltn 'sport = :18515' 2>/dev/null | grep -q 18515 || [ $i -ge 150 ]; do
    i=$((i + 1)); sleep 0.1
done
timeout 120 ibv_rc_pingpong -d rxe0 -g "$idx" "$A1" > /tmp/pp-client.log 2>&1; crc=$?
wait $spid; src=$?
echo "--- server:"; cat /tmp/pp-server.log
echo "--- client:"; cat /tmp/pp-client.log
if [ $crc -eq 0 ] && [ $src -eq 0 ]; then
    ok "ibv_rc_pingpong rxe0 -> rxe1"
else
    bad "ibv_rc_pingpong (client rc=$crc, server rc=$src)"
fi
dtx=$(( $(cat /sys/class/net/sr0/statistics/tx_packets) - tx0 ))
drx=$(( $(cat /sys/class/net/sr1/statistics/rx_packets) - rx1 ))
echo "veth counters during the pingpong: sr0 tx +$dtx, sr1 rx +$drx packets"
if [ $dtx -ge 1000 ] && [ $drx -ge 1000 ]; then
    ok "RoCE traffic crossed the veth pair"
else
    bad "RoCE traffic did not cross the veth pair"
fi

section "pyverbs (/usr/bin/python3)"
out=$(/usr/bin/python3 -c \
    'import pyverbs.device as d; print(" ".join(sorted(x.name.decode() for x in d.get_device_list())))' 2>&1)
echo "$out"
if [ "$out" = "rxe0 rxe1 rxe2 rxe3 rxe4 rxe5" ]; then ok "pyverbs lists rxe0 to rxe5"
else bad "pyverbs device list"; fi

section "done"
echo "CHECK SUMMARY: $pass passed, $fail failed"
[ $fail -eq 0 ]
""" % {"a1": ADDR1}


# ---------------------------------------------------------------------------------
# run

def guest_env(extra: Dict[str, str], pass_names: List[str]) -> Dict[str, str]:
    env = {}
    for k, v in os.environ.items():
        if k in NO_PASS_ENV:
            continue
        if k in PASS_ENV_NAMES or k in pass_names or k.startswith(PASS_ENV_PREFIXES):
            env[k] = v
    env.setdefault("HOME", "/root")
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    # Output reaches the host through files: without this, Python block-buffers
    # it, and a guest that times out would lose everything it printed.
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra)
    env["RCOLL_SOFTROCE_GUEST"] = "1"
    env["RCOLL_SOFTROCE_DEVICES"] = ",".join(DEVICES)
    env["RCOLL_SOFTROCE_ADDRS"] = f"{ADDR0},{ADDR1},{ADDR2},{ADDR3},{ADDR4},{ADDR5}"
    return env


def host_symlinks() -> List[str]:
    """Top-level symlinks of the host (/bin -> usr/bin, ...), recreated in the chroot."""
    out = []
    for name in sorted(os.listdir("/")):
        p = os.path.join("/", name)
        if os.path.islink(p):
            target = os.readlink(p)
            if " " not in target and "=" not in name:
                out.append(f"{name}={target}")
    return out


def plan_mounts(project: str, modules_dir: Path, ver: str,
                extra_ro: List[str]) -> List[Tuple[str, str, str]]:
    """(host path, guest path, mode) for every 9p share, parents before children."""
    shares = []
    for d in HOST_DIRS:
        if os.path.isdir(d) and not os.path.islink(d):
            shares.append((d, d, "overlay"))
    # Kernel modules for `modprobe` in the chroot, where the host's /lib may be a
    # symlink into /usr.
    shares.append((str(modules_dir), os.path.realpath("/lib") + f"/modules/{ver}", "ro"))
    for d in extra_ro:
        shares.append((d, d, "ro"))
    shares.append((project, project, "rw"))
    for host, _guest, _ in shares:
        check_share_path(host, "shared directory")
    # Mount order: a path must come after every share containing it.
    return sorted(shares, key=lambda s: s[1].rstrip("/").count("/"))


def covered(path: str, dirs) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def prune_stale_runs(cache: Cache) -> None:
    # A run killed with SIGKILL cannot clean up; its directory name holds its pid.
    if not cache.runs.is_dir():
        return
    for d in cache.runs.iterdir():
        pid = d.name.split("-")[0]
        if pid.isdigit():
            try:
                os.kill(int(pid), 0)
                continue
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
        shutil.rmtree(d, ignore_errors=True)


def _die_with_parent() -> None:
    # If this script is SIGKILLed (e.g. by a test runner's timeout), the kernel
    # kills QEMU too: the guest must never outlive its harness.
    PR_SET_PDEATHSIG = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Tail:
    """Forwards what a growing file gains to a stream."""

    def __init__(self, path: Path, sink=None):
        self.path, self.sink, self.pos = path, sink, 0

    def pump(self) -> bytes:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except FileNotFoundError:
            return b""
        self.pos += len(data)
        if data and self.sink is not None:
            self.sink.write(data)
            self.sink.flush()
        return data


def run(cache: Cache, args) -> int:
    t_start = time.monotonic()
    probs = host_problems(for_check=args.check)
    if probs:
        raise HarnessError("missing on the host: " + "; ".join(probs))
    if os.environ.get("RCOLL_SOFTROCE_GUEST") == "1":
        raise HarnessError("already inside the Soft-RoCE guest (no nested guests)")
    ver = prepare(cache, quiet=True)

    project = os.path.realpath(args.project or os.getcwd())
    if not os.path.isdir(project):
        raise HarnessError(f"project directory {project} does not exist")
    if project in HOST_DIRS or any(covered(d, [project]) for d in HOST_DIRS):
        raise HarnessError(f"project directory {project} is (or contains) a system "
                           "directory; it is shared read-write, pick the project root")
    extra_ro = [os.path.realpath(d) for d in args.share]
    for d in extra_ro:
        if not os.path.isdir(d):
            raise HarnessError(f"--share {d}: not a directory")
    venv = os.environ.get("VIRTUAL_ENV")
    if venv and os.path.isdir(venv):
        venv = os.path.realpath(venv)
        if not covered(venv, list(HOST_DIRS) + [project] + extra_ro):
            extra_ro.append(venv)  # a venv outside the shared trees would be invisible

    extra_env = {}
    for item in args.env:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise HarnessError(f"--env wants NAME=VALUE, got {item!r}")
        extra_env[k] = v
    env = guest_env(extra_env, args.pass_env)

    prune_stale_runs(cache)
    nonce = secrets.token_hex(8)
    rundir = cache.runs / f"{os.getpid()}-{nonce}"
    rundir.mkdir(parents=True)
    try:
        return _run_in(rundir, nonce, cache, ver, project, extra_ro, env, args, t_start)
    finally:
        if not args.keep_run_dir:
            shutil.rmtree(rundir, ignore_errors=True)
        else:
            log(f"run directory kept: {rundir}")


def _run_in(rundir: Path, nonce: str, cache: Cache, ver: str, project: str,
            extra_ro: List[str], env: Dict[str, str], args, t_start: float) -> int:
    mounts = plan_mounts(project, cache.modules_dir(ver), ver, extra_ro)
    tags = {}
    lines = []
    for i, (host, guest, mode) in enumerate(mounts):
        tags[host] = f"h{i}"
        lines.append(f"h{i} {guest} {mode}\n")
    (rundir / "mounts").write_text("".join(lines))
    (rundir / "config.sh").write_text(
        f"NONCE={nonce}\nMSIZE={MSIZE}\n"
        f"PRINTK={shlex.quote('7 4 1 7' if args.verbose else '1 4 1 7')}\n"
        f"SYMLINKS={shlex.quote(' '.join(host_symlinks()))}\n")
    (rundir / "init.sh").write_text(INIT_SH)
    (rundir / "setup.sh").write_text(SETUP_SH)
    (rundir / "check.sh").write_text(CHECK_SH)
    if args.check:
        command = ["/bin/sh", "/run/rcoll-softroce/check.sh"]
    else:
        command = args.command
    cmd_sh = ["# generated by guest.py: the command, in the project directory",
              ". /run/rcoll-softroce/env.sh"]
    cmd_sh += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())
               if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
    # Root has CAP_IPC_LOCK anyway; this is for commands that drop privileges.
    cmd_sh.append("ulimit -l unlimited 2>/dev/null || true")
    cmd_sh.append(f"cd {shlex.quote(project)} || exit {EXIT_HARNESS}")
    cmd_sh.append("exec " + " ".join(shlex.quote(a) for a in command))
    (rundir / "cmd.sh").write_text("\n".join(cmd_sh) + "\n")

    kernel = cache.vmlinux(ver) if cache.vmlinux(ver).exists() else cache.vmlinuz(ver)
    append = "console=ttyS0 panic=-1 rdinit=/init mitigations=off 8250.nr_uarts=1"
    append += " loglevel=7" if args.verbose else " quiet loglevel=3"
    argv = [QEMU] + QEMU_BASE_ARGS + [
        "-kernel", str(kernel), "-initrd", str(cache.initramfs(ver)), "-append", append,
        # Console to a file the loop below tails; QEMU's own messages to another.
        "-chardev", f"file,id=con,path={rundir / 'console.log'}", "-serial", "chardev:con",
    ]
    for host, tag in tags.items():
        ro = "" if host == project else ",readonly=on"
        argv += ["-virtfs", f"local,path={host},mount_tag={tag},security_model=none"
                 f",multidevs=remap{ro}"]
    argv += ["-virtfs", f"local,path={rundir},mount_tag=rcollrun,security_model=none"]

    log(f"booting kernel {ver} ({kernel.name}) under TCG; project {project} (rw); "
        f"timeout {args.timeout:.0f}s")
    qemu_log = open(rundir / "qemu.log", "wb")
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=qemu_log,
                            stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    qemu_log.close()

    out = Tail(rundir / "stdout", sys.stdout.buffer)
    err = Tail(rundir / "stderr", sys.stderr.buffer)
    console = Tail(rundir / "console.log", sys.stderr.buffer if args.verbose else None)
    console_text = ""
    marks: Dict[str, float] = {}
    marker = re.compile(r"@@rcoll-softroce:%s:([A-Z=0-9-]+)@@" % nonce)
    timed_out = False
    deadline = t0 + args.timeout

    def pump_all() -> None:
        nonlocal console_text
        out.pump()
        err.pump()
        text = console.pump().decode("utf-8", "replace")
        if text:
            console_text += text
            for m in marker.finditer(console_text):
                marks.setdefault(m.group(1).split("=")[0], time.monotonic())
                if m.group(1).startswith("RC="):
                    marks["rc_value"] = int(m.group(1)[3:])

    try:
        while proc.poll() is None:
            pump_all()
            now = time.monotonic()
            if now > deadline:
                timed_out = True
                log(f"timeout: the guest ran past {args.timeout:.0f}s; killing QEMU "
                    f"(pid {proc.pid})")
                break
            # After the exit code is in, give the guest a short while to power off.
            if "RC" in marks and now - marks["RC"] > 15:
                log("guest did not power off after reporting; killing QEMU")
                break
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    t_end = time.monotonic()
    pump_all()

    rc_file = rundir / "rc"
    rc: Optional[int] = None
    if rc_file.exists():
        try:
            rc = int(rc_file.read_text().strip())
        except ValueError:
            pass
    if rc is None:
        rc = marks.get("rc_value")

    def since(a: Optional[str], b: str) -> str:
        start = t0 if a is None else marks.get(a)
        return "n/a" if start is None or b not in marks else f"{marks[b] - start:.1f}s"

    log(f"timings: boot {since(None, 'BOOTED')} (QEMU start -> init running, shares "
        f"reachable), rdma setup {since('BOOTED', 'READY')}, command "
        f"{since('READY', 'RC')}, guest total {t_end - t0:.1f}s, "
        f"with prepare/checks {t_end - t_start:.1f}s")
    if rc is None:
        qemu_out = (rundir / "qemu.log").read_text(errors="replace")
        if not args.verbose:
            tail = "\n".join(console_text.replace("\r", "").splitlines()[-60:])
            log("guest console (last 60 lines):\n" + tail)
        if qemu_out.strip():
            log("QEMU said:\n" + qemu_out.strip())
        if timed_out:
            log(f"exit code {EXIT_TIMEOUT} (timeout)")
            return EXIT_TIMEOUT
        why = "Soft-RoCE setup failed" if "SETUP-FAILED" in marks else \
            f"QEMU exited with status {proc.returncode} before the command reported"
        log(f"{why}; exit code {EXIT_HARNESS}")
        return EXIT_HARNESS
    log(f"exit code {rc}")
    return rc


# ---------------------------------------------------------------------------------
# availability (used by tests/support/softroce.py) and the command line

def availability(cache: Optional[Cache] = None, for_check: bool = False) -> Tuple[bool, str]:
    """(usable, reason): whether `run` can work here, without changing anything."""
    cache = cache or Cache(default_cache_dir())
    if os.environ.get("RCOLL_SOFTROCE_GUEST") == "1":
        return False, "already inside the Soft-RoCE guest"
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return False, "the Soft-RoCE guest needs an x86_64 Linux host"
    probs = host_problems(for_check=for_check)
    if probs:
        return False, "missing on the host: " + "; ".join(probs)
    try:
        check_share_path(str(cache.root), "cache directory")
    except HarnessError as e:
        return False, str(e)
    if is_prepared(cache):
        return True, f"prepared (kernel {cache.current_version()} in {cache.root})"
    probs = missing_tools(["apt-get", "apt-cache", "dpkg-deb", "depmod"])
    if probs:
        return False, f"{cache.root} is not prepared and cannot be: missing " + ", ".join(probs)
    return True, f"not prepared yet; `run` downloads the kernel into {cache.root}"


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", type=Path, default=None,
                   help="cache directory (default $RCOLL_SOFTROCE_CACHE or "
                   "~/.cache/rcoll-softroce)")
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="download/unpack the kernel, build the initramfs")
    pp.add_argument("--kernel-package", help="e.g. linux-image-6.1.0-56-amd64 "
                    "(default: what linux-image-amd64 depends on)")
    pp.add_argument("--refresh", action="store_true",
                    help="ask apt again for the newest kernel instead of using the cached one")
    pr = sub.add_parser("run", help="boot the guest and run a command (or --check)")
    pr.add_argument("--check", action="store_true", help="run the built-in Soft-RoCE self-test")
    pr.add_argument("--project", help="directory shared read-write and used as the "
                    "working directory (default: the current directory)")
    pr.add_argument("--timeout", type=float, default=900.0,
                    help="limit for the whole guest, boot included (default 900 s)")
    pr.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="set a variable in the guest command's environment")
    pr.add_argument("--pass-env", action="append", default=[], metavar="NAME",
                    help="pass this variable through as well as the default set")
    pr.add_argument("--share", action="append", default=[], metavar="DIR",
                    help="also share DIR read-only at the same path")
    pr.add_argument("--verbose", action="store_true", help="show the guest console live")
    pr.add_argument("--keep-run-dir", action="store_true",
                    help="keep the run directory (console log, scripts) for debugging")
    pr.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    sub.add_parser("status", help="report host tools and cache state; changes nothing")
    args = p.parse_args(argv)
    cache = Cache((args.cache or default_cache_dir()).expanduser().absolute())

    # SIGTERM/SIGHUP become exceptions so that `finally` kills QEMU and removes the
    # run directory.
    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    try:
        if args.cmd == "prepare":
            t0 = time.monotonic()
            ver = prepare(cache, args.kernel_package, args.refresh)
            log(f"prepared kernel {ver} in {cache.root} ({time.monotonic() - t0:.1f}s)")
            return 0
        if args.cmd == "status":
            ok, reason = availability(cache, for_check=True)
            print(f"{'available' if ok else 'unavailable'}: {reason}")
            return 0 if ok else 1
        if args.command and args.command[0] == "--":
            args.command = args.command[1:]
        if args.check == bool(args.command):
            p.error("run needs either --check or -- COMMAND")
        return run(cache, args)
    except HarnessError as e:
        log(f"error: {e}")
        return EXIT_HARNESS
    except KeyboardInterrupt as e:
        log(f"interrupted ({e or 'SIGINT'})")
        return 130


if __name__ == "__main__":
    sys.exit(main())
