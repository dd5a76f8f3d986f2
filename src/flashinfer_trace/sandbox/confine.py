"""OS confinement of the worker process that runs untrusted references.

Applied by the worker to itself, after torch is imported (and, on a GPU, CUDA is initialised) and
before it receives any reference, in this order:

1. hygiene: standard streams on /dev/null (they were the caller's files or terminal), a new session
   (no controlling terminal), SIGKILL when its parent dies, no core dumps, an environment scrubbed of
   all but an exact list of names torch, CUDA and the math libraries read (never one that looks like
   a secret);
2. Landlock (the `landlock` package; Linux >= 5.13): file reads only beneath the directories Python,
   torch and the shared libraries live in (plus the GPU device files), no writes, no file creation
   or removal anywhere, no execution;
3. resource limits: address space (CPU workers, within the caller's hard limit; CUDA reserves
   terabytes of virtual addresses, so a GPU worker is bounded by the parent's resident-memory
   watchdog instead) and, per call, CPU time (set by the parent with prlimit);
4. seccomp (libseccomp through `seccomp` or `pyseccomp`): no execve, no new processes (threads
   only), no sockets, no ptrace or process_vm_*, no signals to other processes, no rlimit raising,
   no mount/namespace/bpf/keyring/io_uring/perf, no chmod/chown/xattr/utime, no TIOCSTI; EPERM, so
   an attempt is a clear error in the reference. Filters all threads (TSYNC).

`apply()` returns a `Confinement` saying what is active and, for what is not, why.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import os
import re
import resource
import signal
import sys
import sysconfig
from dataclasses import asdict, dataclass, field

__all__ = ["ENV_ALLOW", "Confinement", "apply", "landlock_abi", "scrubbed_environment", "secret_name"]

MECHANISMS = ("landlock", "seccomp", "rlimits", "privileges")

# The environment a fork server and its workers see: exact names only, what torch, CUDA, the math
# libraries and the sandbox read. No prefix rules: `NVIDIA_` kept NVIDIA_API_KEY, `TORCH_` would keep
# any TORCH_*_TOKEN a CI job sets. An escaped reference reads its environment two ways, os.environ and
# /proc/self/task/<tid>/environ (the fork server's exec environment, which unsetenv cannot erase), so
# the list applies where the fork server is started, and again in the worker.
ENV_ALLOW = frozenset({
    # the process, locale, paths (the fork server runs with -I: PYTHON* are ignored anyway)
    "PATH", "HOME", "TMPDIR", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "LC_MESSAGES", "TZ",
    "LD_LIBRARY_PATH", "VIRTUAL_ENV",
    # CUDA runtime and driver, the container runtime's device selection, MPS (nox starts a daemon per session)
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_HOME", "CUDA_PATH", "CUDA_MODULE_LOADING",
    "CUDA_LAUNCH_BLOCKING", "CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_CACHE_DISABLE", "CUDA_CACHE_MAXSIZE",
    "CUDA_FORCE_PTX_JIT", "CUDA_DISABLE_PTX_JIT", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY",
    "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_TF32_OVERRIDE",
    # cuBLAS / cuDNN numerics
    "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE", "CUDNN_CONV_WSCAP_DBG",
    # OpenMP, MKL, OpenBLAS threading and dispatch (they decide the CPU results' summation order)
    "OMP_NUM_THREADS", "OMP_DYNAMIC", "OMP_PROC_BIND", "OMP_PLACES", "OMP_WAIT_POLICY", "OMP_STACKSIZE",
    "MKL_NUM_THREADS", "MKL_DYNAMIC", "MKL_THREADING_LAYER", "MKL_SERVICE_FORCE_INTEL", "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE", "KMP_AFFINITY", "KMP_BLOCKTIME", "KMP_DUPLICATE_LIB_OK",
    "KMP_INIT_AT_FORK", "GOMP_CPU_AFFINITY", "GOMP_SPINCOUNT", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
    # torch
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "PYTORCH_NVML_BASED_CUDA_CHECK", "TORCH_CUDA_ARCH_LIST", "TORCH_SHOW_CPP_STACKTRACES", "TORCH_USE_CUDA_DSA",
    "TORCH_CPP_LOG_LEVEL", "TORCH_BLAS_PREFER_CUBLASLT", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "TORCH_DEVICE_BACKEND_AUTOLOAD", "ATEN_CPU_CAPABILITY",
    # this package (pool.Settings.from_env, read where the sandbox package is imported)
    "FLASHINFER_TRACE_REFERENCE_TIMEOUT", "FLASHINFER_TRACE_REFERENCE_MEMORY_GB",
    "FLASHINFER_TRACE_ALLOW_UNCONFINED", "FLASHINFER_TRACE_SANDBOX_DISABLE",
})
# Names that carry secrets never pass, listed or not (a name added to ENV_ALLOW by mistake, say).
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE|PRIVATE|SESSION",
                          re.IGNORECASE)


def secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def scrubbed_environment(env: dict[str, str] | None = None, allow: frozenset[str] = ENV_ALLOW) -> dict[str, str]:
    """The names of `env` (default os.environ) in `allow`, exactly, less any that look like a secret."""
    env = dict(os.environ if env is None else env)
    return {k: v for k, v in env.items() if k in allow and not secret_name(k)}


@dataclass
class Confinement:
    active: dict[str, str] = field(default_factory=dict)  # mechanism -> what it enforces
    missing: dict[str, str] = field(default_factory=dict)  # mechanism -> why it is not active
    disabled: tuple[str, ...] = ()
    vm_base: int | None = None  # address space before the arena (the RLIMIT_AS the parent adjusts)
    memory_budget: int | None = None  # address space a reference gets beyond vm_base (and its arena, unless capped)
    memory_capped: str = ""  # why memory_budget is less than asked (the caller's hard RLIMIT_AS), if it is

    @property
    def complete(self) -> bool:
        return not self.missing and all(m in self.active for m in MECHANISMS)

    def as_dict(self) -> dict:
        return asdict(self) | {"complete": self.complete}


# -- 1. hygiene -------------------------------------------------------------------------------------
_PR_SET_PDEATHSIG = 1


def _hygiene() -> None:
    # The standard streams were inherited from whoever started the fork server (pytest's capture files,
    # a terminal): writable files outside the sandbox. Errors travel on the pipe instead.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    try:
        os.setsid()  # no controlling terminal: TIOCSTI cannot type into the user's shell
    except OSError:
        pass
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    keep = scrubbed_environment()
    for k in list(os.environ):
        if k not in keep:
            del os.environ[k]


# -- 2. Landlock ------------------------------------------------------------------------------------
def landlock_abi() -> tuple[int, str]:
    """(ABI version, "") when Landlock works here, else (0, why not)."""
    try:
        from landlock import landlock_abi_version
    except ImportError as e:
        return 0, f"the landlock package is not installed ({e})"
    try:
        return int(landlock_abi_version()), ""
    except OSError as e:
        return 0, f"{errno.errorcode.get(e.errno, e.errno)}: {getattr(e, 'reason', None) or e.strerror}"
    except Exception as e:  # non-Linux: the package raises on import of its syscalls
        return 0, f"{type(e).__name__}: {e}"


def _mapped_dirs() -> set[str]:
    """Directories of every file mapped into this process (the shared libraries already loaded)."""
    dirs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    dirs.add(os.path.dirname(parts[5].strip()))
    except OSError:
        pass
    return dirs


def read_roots() -> list[str]:
    """Where a worker may read: Python, its packages, shared libraries, CUDA; never home or the cwd."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    roots |= {p for k, p in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib", "purelib", "platlib")}
    for name in ("torch", "flashinfer_trace", "landlock", "seccomp", "pyseccomp", "flashinfer", "sgl_kernel",
                 "nvidia", "triton"):
        mod = sys.modules.get(name)
        for p in getattr(mod, "__path__", []) or ([mod.__file__] if getattr(mod, "__file__", None) else []):
            roots.add(os.path.dirname(os.path.abspath(p)))
    roots |= {"/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/usr/local/lib64",
              "/usr/local/cuda", "/usr/local/nvidia", "/sys", "/etc/ld.so.cache", "/etc/localtime"}
    roots |= {p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p}
    roots |= {os.environ[k] for k in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(k)}
    roots |= set(glob.glob("/usr/local/cuda-*"))
    roots |= _mapped_dirs()
    return sorted(p for p in roots if p and os.path.isabs(p) and os.path.exists(p) and p not in ("/", "/proc"))


def _proc_self() -> list[str]:
    # Not /proc: other processes' environ and cmdline are readable there under the same uid.
    base = f"/proc/{os.getpid()}"
    names = ("status", "stat", "statm", "maps", "fd", "task", "cgroup", "mountinfo", "limits", "smaps")
    extra = ["/proc/meminfo", "/proc/cpuinfo", "/proc/stat", "/proc/driver", "/proc/sys/kernel",
             "/proc/sys/vm/overcommit_memory"]
    return [p for p in [f"{base}/{n}" for n in names] + extra if os.path.exists(p)]


def gpu_device_files() -> list[str]:
    return sorted(set(glob.glob("/dev/nvidia*")) | set(glob.glob("/dev/nvidia-caps/*")))


def _landlock(gpu: bool) -> str:
    """Restrict this thread and its future children; returns what was enforced."""
    from landlock import FSAccess, Ruleset

    abi, why = landlock_abi()
    if not abi:
        raise OSError(errno.ENOSYS, why)
    read_dir = FSAccess.READ_FILE | FSAccess.READ_DIR
    rules = Ruleset()  # handles every access right this kernel knows: all denied unless allowed below

    def allow(path: str, rights) -> None:
        if os.path.isdir(path):
            rules.allow(path, rules=rights)
        elif os.path.exists(path):
            rules.allow(path, rules=rights & FSAccess.all_file())

    for p in read_roots() + _proc_self():
        allow(p, read_dir)
    for p in ("/dev/null", "/dev/urandom", "/dev/zero"):
        allow(p, FSAccess.READ_FILE)
    device = FSAccess.READ_FILE | FSAccess.WRITE_FILE
    if abi >= 5:
        device |= FSAccess.IOCTL_DEV
    if gpu:
        for p in gpu_device_files():
            allow(p, device if not os.path.isdir(p) else device | FSAccess.READ_DIR)
    rules.apply()
    return f"ABI {abi}: reads beneath {len(read_roots())} library roots" + (", GPU device files" if gpu else "") + \
        "; no writes, creation, removal or execution"


# -- 3. resource limits -----------------------------------------------------------------------------
def _vm_size() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _rlimits(c: Confinement, memory_bytes: int | None, gpu: bool) -> str:
    parts = ["no core dumps"]
    if memory_bytes and not gpu:
        # The soft limit only: the parent raises it by the worker's arena before each call (prlimit), so the
        # arena does not eat the reference's budget; the worker cannot (seccomp: no setrlimit). Never above
        # the hard limit the caller's job runs under (a batch system's RLIMIT_AS): there the reference gets
        # what is left, recorded, rather than no worker at all.
        c.vm_base = _vm_size()
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        limit = c.vm_base + memory_bytes
        if hard != resource.RLIM_INFINITY and limit > hard:
            limit = hard
            c.memory_capped = f"by the caller's hard RLIMIT_AS of {hard / 2**30:.1f} GiB " \
                              f"({memory_bytes / 2**30:.1f} GiB asked)"
        c.memory_budget = max(limit - c.vm_base, 0)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        if c.memory_capped:
            parts.append(f"address space: {c.memory_budget / 2**30:.1f} GiB for the arena and the reference "
                         f"together, capped {c.memory_capped}")
        else:
            parts.append(f"address space: the arena + {c.memory_budget / 2**30:.1f} GiB")
    elif memory_bytes:
        parts.append(f"resident memory {memory_bytes / 2**30:.1f} GiB (the parent's watchdog)")
    parts.append("CPU time per call (set by the parent)")
    return ", ".join(parts)


# -- 4. privileges --------------------------------------------------------------------------------------
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_CAP_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def capabilities() -> dict[str, int]:
    """This process's capability sets, from /proc/self/status (mode 0444 even once the uid changed)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in _CAP_FIELDS:
                out[key] = int(value.strip(), 16)
    return out


def _others_can_read(path: str) -> bool:
    """Whether a process of another uid, without capabilities, can reach and read `path`."""
    import stat
    from pathlib import Path

    path = Path(os.path.realpath(path))
    if any(not os.stat(d).st_mode & stat.S_IXOTH for d in path.parents):
        return False
    mode = os.stat(path).st_mode
    return bool(mode & stat.S_IROTH) and (not stat.S_ISDIR(mode) or bool(mode & stat.S_IXOTH))


def unprivileged_uid() -> int:
    """The kernel's overflow uid (65534, "nobody", on every common distribution): owns no file."""
    try:
        with open("/proc/sys/kernel/overflowuid") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65534


def _drop_privileges(gpu: bool) -> str:
    """No capability in any set, no_new_privs, and where the process is root, another uid. The switch
    needs every library root readable by others (a Python under /root, mode 0700, is not): where one is
    not, the uid stays 0 without capabilities, and the result says which root kept it. A GPU worker keeps
    uid 0 (without capabilities) until the switch has run on a GPU: its device files were opened before
    (CUDA is up before confinement) and the driver makes them 0666, but that is not yet measured."""
    libc = ctypes.CDLL(None, use_errno=True)
    notes = []
    if os.geteuid() == 0 or os.getuid() == 0:
        for cap in range(64):  # the bounding set: needs CAP_SETPCAP, which root has; EINVAL past the last cap
            if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                if (err := ctypes.get_errno()) != errno.EINVAL:
                    notes.append(f"bounding set kept ({errno.errorcode.get(err)}): exec is refused anyway")
                break
        closed = [r for r in read_roots() if not _others_can_read(r)]
        if gpu:  # CUDA and its MPS client connection came up as root: the switch is to be tried on a GPU first
            notes.append("uid stays 0 on a GPU worker until the switch is measured on a GPU")
        elif closed:
            notes.append(f"uid stays 0: {closed[0]} is not readable by another uid")
        else:
            uid = unprivileged_uid()
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)  # clears the permitted and effective sets
            notes.append(f"uid and gid {uid}")
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL before Linux 4.3: none there
    empty = (_CapData * 2)()
    if libc.capset(ctypes.byref(_CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)), empty) != 0:
        raise OSError(ctypes.get_errno(), "capset to empty sets failed")
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
    left = {k: v for k, v in capabilities().items() if v and k != "CapBnd"}
    if left:
        raise OSError(errno.EPERM, f"capabilities left after dropping them: {left}")
    return "no capabilities, no_new_privs" + "".join(f"; {n}" for n in notes)


# -- 5. seccomp -------------------------------------------------------------------------------------
_CLONE_THREAD = 0x00010000
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
# fcntl commands that reach other processes or watch files: F_SETOWN, F_SETSIG, F_SETOWN_EX (a signal to
# any process on I/O), F_SETLEASE, F_NOTIFY
_FCNTL_DENIED = (8, 10, 15, 1024, 1026)
DENIED_SYSCALLS = (
    "execve", "execveat", "fork", "vfork",
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd", "pidfd_send_signal",
    "tkill", "setrlimit",
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "mount_setattr", "open_tree", "move_mount",
    "fsopen", "fsconfig", "fsmount", "fspick",
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "init_module", "finit_module",
    "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct", "syslog",
    "quotactl", "quotactl_fd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "name_to_handle_at", "open_by_handle_at",
    "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat",
    "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr", "setxattrat",
    "removexattrat", "utime", "utimes", "utimensat", "futimesat",
    # reached past the first denylist (issue 25): SysV IPC that outlives the worker, watches on folders
    # Landlock hides, host-wide settings a root worker could change, other processes' priorities
    "shmget", "shmat", "shmdt", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semtimedop",
    "semctl", "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark",
    "sethostname", "setdomainname", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups", "setfsuid", "setfsgid",
    "capset",
)
# denied on a GPU worker where they name a process (0, "this thread", passes: the driver may tune itself;
# libseccomp takes one comparison per argument, so its own pid named explicitly is refused too)
_DENIED_FOR_OTHERS = (("setpriority", 1), ("ioprio_set", 1), ("sched_setscheduler", 0), ("sched_setparam", 0),
                      ("sched_setattr", 0))

# The CPU worker's allowlist: what torch, Python and glibc were seen to call in confined workers (strace
# of the CPU reference suite, docs/sandbox.md "System calls"), and the read-only or self-only calls of
# the same kinds they make on other paths. Everything else is EPERM. Calls with an argument filter
# (clone, kill, tgkill, fcntl, ioctl, prctl, prlimit64) are added in _seccomp.
ALLOWED_SYSCALLS = (
    # memory
    "brk", "mmap", "munmap", "mprotect", "mremap", "madvise", "msync", "mincore", "membarrier", "get_mempolicy",
    # threads and their synchronisation
    "futex", "futex_waitv", "set_robust_list", "rseq", "set_tid_address", "exit", "exit_group", "sched_yield",
    "sched_getaffinity", "sched_getparam", "sched_getscheduler", "sched_get_priority_max",
    "sched_get_priority_min", "getpriority", "arch_prctl", "seccomp",
    # signals (to itself: kill and tgkill are filtered)
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigtimedwait", "sigaltstack",
    "restart_syscall",
    # time
    "clock_gettime", "clock_getres", "gettimeofday", "time", "nanosleep", "clock_nanosleep",
    # who and where it is
    "getpid", "gettid", "getppid", "getuid", "geteuid", "getgid", "getegid", "getgroups", "getresuid",
    "getresgid", "uname", "sysinfo", "getrlimit", "getrusage", "getcpu", "getrandom", "times",
    # files: which ones is Landlock's (reads beneath the library roots; no writes, creation or removal)
    "openat", "open", "close", "close_range", "read", "write", "pread64", "pwrite64", "readv", "writev",
    "preadv", "pwritev", "preadv2", "pwritev2", "lseek", "fstat", "stat", "lstat", "newfstatat", "statx",
    "statfs", "fstatfs", "access", "faccessat", "faccessat2", "readlink", "readlinkat", "getdents64",
    "getcwd", "fadvise64", "dup", "dup2", "dup3", "pipe2", "eventfd2", "poll", "ppoll", "select",
    "pselect6", "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2",
)
_FCNTL_ALLOWED = (0, 1, 2, 3, 4, 1030, 1033, 1034)  # DUPFD, GETFD, SETFD, GETFL, SETFL, DUPFD_CLOEXEC, ADD/GET_SEALS
_IOCTL_ALLOWED = (0x5401, 0x541B, 0x5421, 0x5451, 0x5450)  # TCGETS (isatty), FIONREAD, FIONBIO, FIOCLEX, FIONCLEX
# PR_SET_NAME, PR_GET_NAME, PR_GET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_GET_NO_NEW_PRIVS, PR_GET_SECCOMP,
# PR_CAPBSET_READ, PR_GET_TIMERSLACK, PR_SET_VMA (glibc names its anonymous mappings)
_PRCTL_ALLOWED = (15, 16, 3, 38, 39, 21, 23, 30, 0x53564D41)
def _load_seccomp():
    """libseccomp's bindings, loaded at import: finding the library runs ldconfig, which a confined
    process could not."""
    try:
        import seccomp  # libseccomp's own bindings (Debian python3-seccomp)

        return seccomp, ""
    except ImportError:
        pass
    try:
        import pyseccomp  # the same API over ctypes; RuntimeError without libseccomp.so

        return pyseccomp, ""
    except (ImportError, RuntimeError, OSError) as e:
        return None, f"no libseccomp bindings: {type(e).__name__}: {e}"


_SECCOMP, _SECCOMP_MISSING = _load_seccomp()


def _seccomp(gpu: bool) -> str:
    """A CPU worker: the allowlist above, EPERM for the rest. A GPU worker: the denylist, until the CUDA
    driver's calls are measured on a GPU the way the CPU's were (docs/sandbox.md "System calls")."""
    sc = _SECCOMP
    if sc is None:
        raise OSError(errno.ENOSYS, _SECCOMP_MISSING)
    eperm = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(eperm if not gpu else sc.ALLOW)
    f.set_attr(sc.Attr.CTL_TSYNC, 1)  # every thread, CUDA's and torch's included
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)  # i386 syscalls (int 0x80) kill the worker
    try:
        f.add_arch(sc.Arch.X32)  # x32 numbers would otherwise pass a native denylist
    except Exception:
        pass
    unknown, rules = [], 0

    def rule(action, name: str, *args) -> None:
        nonlocal rules
        try:
            f.add_rule(action, name, *args)
            rules += 1
        except Exception:  # a syscall this libseccomp or architecture does not know
            unknown.append(name)

    pid = os.getpid()
    if gpu:
        for name in DENIED_SYSCALLS:
            rule(eperm, name)
        rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, 0))  # threads only
        for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
            rule(eperm, name, sc.Arg(0, sc.NE, pid))  # signals to itself only (kill(0) would reach the group)
        rule(eperm, "prlimit64", sc.Arg(2, sc.NE, 0))  # reading limits is fine, setting them is not
        rule(eperm, "personality", sc.Arg(0, sc.NE, 0xFFFFFFFF))
        for request in (_TIOCSTI, _TIOCLINUX):
            rule(eperm, "ioctl", sc.Arg(1, sc.EQ, request))
        rule(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFF00, 0x8900))  # socket and interface requests
        for name, arg in _DENIED_FOR_OTHERS:
            rule(eperm, name, sc.Arg(arg, sc.NE, 0))
        for cmd in _FCNTL_DENIED:
            rule(eperm, "fcntl", sc.Arg(1, sc.EQ, cmd))
        what = "denylist"
    else:
        allow = sc.ALLOW
        for name in ALLOWED_SYSCALLS:
            rule(allow, name)
        rule(allow, "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, _CLONE_THREAD))  # threads only
        for name in ("kill", "tkill", "tgkill"):
            rule(allow, name, sc.Arg(0, sc.EQ, pid))  # signals to itself only
        rule(allow, "prlimit64", sc.Arg(2, sc.EQ, 0))  # reading limits only
        for cmd in _FCNTL_ALLOWED:
            rule(allow, "fcntl", sc.Arg(1, sc.EQ, cmd))
        for request in _IOCTL_ALLOWED:
            rule(allow, "ioctl", sc.Arg(1, sc.EQ, request))
        for option in _PRCTL_ALLOWED:
            rule(allow, "prctl", sc.Arg(0, sc.EQ, option))
        what = "allowlist"
    rule(sc.ERRNO(errno.ENOSYS), "clone3")  # flags live in memory; ENOSYS makes libc use clone
    f.load()
    note = f" ({len(unknown)} unknown to this libseccomp: {', '.join(unknown)})" if unknown else ""
    return f"{what} of {rules} rules, EPERM, all threads{note}"


# -- the whole ---------------------------------------------------------------------------------------
def apply(*, memory_bytes: int | None, gpu: bool, disable=()) -> Confinement:
    """Confine this process; what could not be applied is reported, never raised. `disable`: mechanisms
    the user turned off (FLASHINFER_TRACE_SANDBOX_DISABLE), reported as missing."""
    c = Confinement(disabled=tuple(disable))
    _hygiene()
    if "landlock" in c.disabled:
        c.missing["landlock"] = "disabled by the user"
    else:
        try:
            c.active["landlock"] = _landlock(gpu)
        except Exception as e:
            c.missing["landlock"] = f"{type(e).__name__}: {e}"
    try:
        c.active["rlimits"] = _rlimits(c, memory_bytes, gpu)
    except (OSError, ValueError) as e:
        c.missing["rlimits"] = f"{type(e).__name__}: {e}"
    return c


def finish(c: Confinement, *, gpu: bool = False) -> Confinement:
    """The last steps: privileges, then seccomp (which refuses what dropping them needs)."""
    for name, step in (("privileges", lambda: _drop_privileges(gpu)), ("seccomp", lambda: _seccomp(gpu))):
        if name in c.disabled:
            c.missing[name] = "disabled by the user"
            continue
        try:
            c.active[name] = step()
        except Exception as e:
            c.missing[name] = f"{type(e).__name__}: {e}"
    return c
