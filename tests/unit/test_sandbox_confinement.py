"""The boundary itself: the confined worker process.

Code compiled with `_compile_as_escaped` runs with the real builtins, unchecked: what a reference that
found a gadget past the static check and the module views (the FX `Module.compile` chain, say) would
have. Every attack below must fail inside the worker and leave nothing behind here.
"""

from __future__ import annotations

import os
import signal
import sys

import pytest
import torch

from flashinfer_trace.sandbox import (
    ConfinementUnavailable,
    ReferenceFailure,
    compile_reference,
    configure,
    settings,
    shutdown,
    status,
)
from flashinfer_trace.sandbox.confine import landlock_abi, scrubbed_environment
from flashinfer_trace.sandbox.pool import _compile_as_escaped, canonical_device, worker_starts

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="unsupported: the worker's confinement is Linux's")
SECRET = "MY_SERVICE_API_TOKEN"


@pytest.fixture(autouse=True)
def fresh_settings():
    """Each test gets default settings and a fresh worker; what a test configures is undone."""
    saved = (settings.timeout, settings.memory_bytes, settings.cpu_seconds, settings.allow_unconfined,
             settings.disable)
    env = {k: os.environ.get(k) for k in ("FLASHINFER_TRACE_REFERENCE_TIMEOUT", "FLASHINFER_TRACE_REFERENCE_MEMORY_GB",
                                          "FLASHINFER_TRACE_ALLOW_UNCONFINED", "FLASHINFER_TRACE_SANDBOX_DISABLE")}
    yield
    (settings.timeout, settings.memory_bytes, settings.cpu_seconds, settings.allow_unconfined,
     settings.disable) = saved
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    shutdown()


def escaped(body: str, *args):
    """Run `body` (the body of run(), real builtins) in a confined worker; its return value."""
    code = "def run(*args):\n" + "".join(f"    {line}\n" for line in body.strip().splitlines())
    return _compile_as_escaped(code, definition="escaped_def")(*args)


def refused(body: str, *args, match: str = "PermissionError") -> ReferenceFailure:
    with pytest.raises(ReferenceFailure, match=match) as info:
        escaped(body, *args)
    assert info.value.definition == "escaped_def" and info.value.kind == "raised"
    return info.value


def test_worker_is_fully_confined_here():
    abi, why = landlock_abi()
    if not abi and not os.environ.get("FLASHINFER_TRACE_REQUIRE_CONFINEMENT"):  # .ci/run requires it
        pytest.skip(reason=f"unsupported: no Landlock here ({why})")
    assert abi > 0, why
    compile_reference("def run():\n    return 1\n")()
    s = status()
    assert s["complete"] and set(s["active"]) == {"landlock", "rlimits", "seccomp", "privileges"} and not s["missing"]
    assert "no capabilities" in s["active"]["privileges"] and "allowlist" in s["active"]["seccomp"]


# -- escaped code: file system ------------------------------------------------------------------------
def test_no_file_writes_anywhere(tmp_path):
    for target in (tmp_path / "pwned", "/tmp/flashinfer-trace-pwned", os.path.expanduser("~/flashinfer-trace-pwned")):
        refused(f"open({str(target)!r}, 'w').write('x')")
        assert not os.path.exists(target)
    refused(f"import os\nos.mkdir({str(tmp_path / 'd')!r})")
    assert list(tmp_path.iterdir()) == []


def test_no_reads_outside_python_and_libraries(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("hunter2")
    refused(f"return open({str(secret)!r}).read()")
    refused(f"return open({str(os.path.join(os.getcwd(), 'pyproject.toml'))!r}).read()")
    refused(f"return open('/proc/{os.getpid()}/environ').read()")  # this process's environment
    assert escaped("import torch\nreturn len(open(torch.__file__).read()) > 0") is True  # where torch lives


def test_no_removal_chmod_or_truncate(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("data")
    refused(f"import os\nos.remove({str(victim)!r})")
    refused(f"import os\nos.chmod({str(victim)!r}, 0o777)")
    refused(f"import os\nos.truncate({str(victim)!r}, 0)")
    assert victim.read_text() == "data" and (victim.stat().st_mode & 0o777) != 0o777


def test_the_arena_cannot_be_shrunk_under_the_parent():
    # ftruncate on every regular file the worker holds (the shared arena among them): a shrink would
    # fault the parent's mapping with SIGBUS. The seal refuses it.
    body = """
import os, stat
out = []
for name in os.listdir('/proc/self/fd'):
    fd = int(name)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.ftruncate(fd, 0)
            out.append('shrunk')
    except OSError as e:
        out.append(type(e).__name__)
return out
"""
    assert "shrunk" not in escaped(body)
    x = torch.arange(1 << 18, dtype=torch.float32)
    assert torch.equal(compile_reference("def run(x):\n    return x * 2\n")(x), x * 2)


# -- escaped code: processes, network, signals, tracing --------------------------------------------------
def test_no_new_processes(tmp_path):
    target = tmp_path / "pwned"
    assert escaped(f"import os\nreturn os.system('touch {target}')") != 0
    refused("import subprocess\nsubprocess.run(['true'])")
    refused("import os\nos.fork()")
    refused("import os\nos.execv('/bin/true', ['true'])")
    refused("import os\nos.posix_spawn('/bin/true', ['true'], {})")
    assert not target.exists()
    assert escaped("import threading\nt = threading.Thread(target=lambda: None)\nt.start()\nt.join()\nreturn 1") == 1


def test_no_network():
    for body in ("import socket\nsocket.socket()", "import socket\nsocket.socket(socket.AF_UNIX)",
                 "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)"):
        assert "Operation not permitted" in str(refused(body))  # seccomp's EPERM, not a refused connection


def test_no_signals_or_tracing_of_other_processes():
    me = os.getpid()
    refused(f"import os, signal\nos.kill({me}, signal.SIGTERM)")
    refused("import os, signal\nos.kill(0, signal.SIGTERM)")  # the process group
    refused("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")  # the fork server
    body = f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nr = libc.ptrace(16, {me}, 0, 0)\n" \
           "return r, ctypes.get_errno()"
    assert escaped(body) == (-1, 1)  # PTRACE_ATTACH: EPERM
    refused("import fcntl, termios\nfcntl.ioctl(1, termios.TIOCSTI, b'x')")
    # the kernel would allow raising the soft limit up to the (infinite) hard one; seccomp says EPERM,
    # which Python words as ValueError
    refused("import resource\nlimit = resource.RLIM_INFINITY\nresource.setrlimit(resource.RLIMIT_CPU, (limit, limit))",
            match="not allowed to raise maximum limit")


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv(SECRET, "hunter2")
    assert SECRET not in scrubbed_environment()
    shutdown()
    assert escaped(f"import os\nreturn os.environ.get({SECRET!r})") is None
    assert "hunter2" not in escaped("import os\nreturn repr(dict(os.environ))")


def test_torch_compile_gadget_never_reaches_its_backend(tmp_path):
    # The chain from the issue, run as escaped code: Module.compile hands torch.compile a backend that
    # would receive an FX graph. Dynamo cannot even create its cache directory, so no graph is made.
    target = tmp_path / "pwned"
    body = f"""
import torch
seen = []
def backend(gm, example_inputs):
    seen.append(type(gm).__name__)
    open({str(target)!r}, 'w')
    return gm.forward
try:
    torch.nn.ParameterDict()['compile'](backend=backend)
    torch.compile(lambda x: x * 2, backend=backend)(torch.ones(2))
    return 'compiled', seen
except Exception as e:
    return type(e).__name__, seen
"""
    outcome, seen = escaped(body)
    assert outcome != "compiled" and seen == [] and not target.exists()


# -- state between calls -----------------------------------------------------------------------------------
HONEST = "import torch\n\ndef run(a, b):\n    return (a @ b, torch.rand(4))\n"
POISON = '''import torch

STASH = {}

def hold(ctx):
    with ctx:
        yield 1

def run(x, poison):
    if poison:
        torch.set_grad_enabled(False)
        torch.manual_seed(1234)
        for ctx in (torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad(), torch.inference_mode()):
            g = hold(ctx)
            next(g)
            STASH[len(STASH)] = g
    return (torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), torch.is_inference_mode_enabled(),
            torch.zeros(1).device.type, torch.get_default_dtype(), torch.rand(2, device="cpu"))
'''


def test_state_is_fresh_for_every_call_and_nothing_reaches_another_reference():
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    honest = compile_reference(HONEST, definition="honest_matmul")
    before = honest.call([a, b], seed=0)
    poison = compile_reference(POISON, definition="poison")
    clean = poison.call([torch.ones(1), False], seed=7)
    dirty = poison.call([torch.ones(1), True], seed=7)
    assert dirty[:4] == (False, True, True, "cpu")  # it did poison its own worker
    again = poison.call([torch.ones(1), False], seed=7)  # its next call starts clean, RNG included
    assert again[:5] == clean[:5] == (True, False, False, "cpu", torch.float32)
    assert torch.equal(again[5], clean[5])
    after = honest.call([a, b], seed=0)  # another reference: bit-identical, float32, same draws
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    assert after[0].dtype == torch.float32
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()  # and here, nothing changed


def test_a_reference_writing_into_its_inputs_writes_into_the_callers():
    x = torch.zeros(3)
    out = compile_reference("def run(x):\n    x.add_(1)\n    return x * 2\n")(x)
    assert x.tolist() == [1.0, 1.0, 1.0] and out.tolist() == [2.0, 2.0, 2.0]


# -- timeouts and crashes are results ------------------------------------------------------------------------
def test_timeout_is_a_result_and_the_next_call_works():
    configure(timeout=2)
    spin = compile_reference("def run():\n    while True:\n        pass\n", definition="spin_def")
    with pytest.raises(ReferenceFailure, match=r"spin_def: timeout: no result after 2 s") as info:
        spin()
    assert info.value.kind == "timeout"
    assert compile_reference("def run(x):\n    return x + 1\n")(torch.ones(2)).tolist() == [2.0, 2.0]


def test_timeout_in_module_body():
    configure(timeout=2)
    with pytest.raises(ReferenceFailure, match="slow_body: timeout"):
        compile_reference("x = 0\nwhile True:\n    x += 1\ndef run():\n    return x\n", definition="slow_body")


def test_segfault_is_a_crash_result():
    deep = "def run():\n    x = [1]\n    for i in range(1000000):\n        x = map(abs, x)\n    return list(x)\n"
    with pytest.raises(ReferenceFailure) as info:
        compile_reference(deep, definition="deep_map")()
    assert info.value.kind == "crash" and "SIGSEGV" in str(info.value) and "deep_map" in str(info.value)
    with pytest.raises(ReferenceFailure, match=r"escaped_def: crash: the worker died of SIGABRT"):
        escaped("import os, signal\nos.kill(os.getpid(), signal.SIGABRT)")
    assert compile_reference("def run():\n    return 3\n")() == 3


def test_memory_limit_is_a_result():
    configure(memory_gb=1)
    with pytest.raises(ReferenceFailure, match=r"big_def: raised: RuntimeError: .*allocate") as info:
        compile_reference("import torch\ndef run():\n    return torch.empty(2 ** 31).sum()\n", definition="big_def")()
    assert info.value.kind == "raised"
    with pytest.raises(MemoryError):
        compile_reference("def run():\n    return len([0] * 2 ** 31)\n", definition="list_def")()


def test_cpu_time_limit_is_a_result():
    configure(timeout=60, cpu_seconds=1)
    with pytest.raises(ReferenceFailure, match="burn_def: cpu-time") as info:
        compile_reference("def run():\n    while True:\n        pass\n", definition="burn_def")()
    assert info.value.kind == "cpu-time"


def test_exit_from_a_reference_is_a_result():
    with pytest.raises(ReferenceFailure, match=r"escaped_def: raised: SystemExit"):
        escaped("import sys\nsys.exit(3)")
    with pytest.raises(ReferenceFailure, match="crash: the worker died|exited with status"):
        escaped("import os\nos._exit(0)")


# -- where confinement is missing ------------------------------------------------------------------------
def test_missing_mechanism_refuses_unless_allowed():
    configure(disable=("landlock",))
    with pytest.raises(ConfinementUnavailable, match=r"landlock unavailable \(disabled by the user\).*"
                                                      r"--allow-unconfined-references"):
        compile_reference("def run():\n    return 1\n", definition="d")
    configure(disable=("landlock",), allow_unconfined=True)
    assert compile_reference("def run():\n    return 1\n", definition="d")() == 1
    s = status()
    assert not s["complete"] and s["allow_unconfined"] and "landlock" in s["missing"] and "seccomp" in s["active"]


def test_worker_death_signal_names():
    from flashinfer_trace.sandbox.pool import _signal_name

    assert _signal_name(signal.SIGSEGV) == "SIGSEGV" and _signal_name(250) == "signal 250"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no-gpu: torch sees no CUDA device")
def test_cuda_worker_shares_the_arena_and_is_confined(tmp_path):
    x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    starts = worker_starts()
    ref = compile_reference("import torch\ndef run(x):\n    return (x.float() * 2).to(x.dtype), x.device.type\n",
                            device="cuda")
    out, where = ref(x)  # compiled for "cuda", called with "cuda:0" tensors: the same worker
    assert worker_starts() - starts == 1
    assert where == "cuda" and out.is_cuda and torch.equal(out, (x.float() * 2).to(x.dtype))
    s = status()
    assert s["complete"] and s["device"].startswith("cuda"), s
    assert "GPU device files" in s["active"]["landlock"]
    y = torch.zeros(4, device="cuda")
    compile_reference("def run(y):\n    y.add_(1)\n    return y.sum()\n", device="cuda")(y)
    assert y.tolist() == [1.0] * 4  # in-place writes reach the caller through the arena
    refused = _compile_as_escaped(f"def run():\n    open({str(tmp_path / 'p')!r}, 'w')\n", device="cuda")
    with pytest.raises(ReferenceFailure, match="PermissionError"):
        refused()


def test_one_device_has_one_name():
    assert canonical_device("cpu") == "cpu" and canonical_device(torch.device("cpu")) == "cpu"
    if torch.cuda.is_available():
        assert canonical_device("cuda") == canonical_device("cuda:0") == "cuda:0"
