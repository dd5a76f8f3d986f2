"""What one reference leaves for the next, and what the worker inherits from the caller (issue 25).

Each test is an attack that worked against the process-wide arena, the prefix-based environment
filter or the fixed address-space limit: a reference reading an earlier one's output from the shared
arena, a worker growing that arena until every larger call failed with a raw PermissionError, a secret
passed by its `NVIDIA_` prefix, a job under a hard RLIMIT_AS refused a sandbox at all.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from flashinfer_trace.sandbox import ReferenceFailure, compile_reference, shutdown, transport
from flashinfer_trace.sandbox import pool as sandbox_pool
from flashinfer_trace.sandbox.confine import ENV_ALLOW, landlock_abi, scrubbed_environment
from flashinfer_trace.sandbox.pool import _compile_as_escaped

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="unsupported: the worker's confinement is Linux's")
MARK = 1234.5
SECRETS = {"NVIDIA_API_KEY": "nvapi-hunter2", "HF_TOKEN": "hf_hunter2", "AWS_SECRET_ACCESS_KEY": "aws-hunter2",
           "GITHUB_TOKEN": "ghp_hunter2", "TORCH_HUB_TOKEN": "hub-hunter2", "CUDA_CREDENTIALS": "cc-hunter2"}


@pytest.fixture(autouse=True)
def fresh_worker():
    shutdown()
    yield
    shutdown()


def escaped(code: str, *args):
    return _compile_as_escaped(textwrap.dedent(code), definition="escaped_def")(*args)


# -- 3. the arena: one per worker, sealed, released -------------------------------------------------------
def test_a_reference_cannot_read_an_earlier_references_output_from_the_arena():
    honest = compile_reference(f"import torch\ndef run(x):\n    return torch.full((1000,), {MARK}) + x.sum()\n",
                               definition="honest")
    assert (honest(torch.zeros(4)) == MARK).all()
    # the attack: a view over the whole storage behind its own input, which is the arena it was given
    n, seen = escaped(f"""
        def run(x):
            n = x.untyped_storage().nbytes() // 4
            return n, int((x.as_strided((n,), (1,), 0) == {MARK}).sum())
        """, torch.zeros(4))
    assert n >= 1024 and seen == 0


def test_a_worker_cannot_grow_or_shrink_its_arena():
    attempts = escaped("""
        import os
        def run():
            out = {}
            for name in os.listdir('/proc/self/fd'):
                fd = int(name)
                try:
                    if not os.readlink(f'/proc/self/fd/{fd}').startswith('/memfd:flashinfer-trace-arena'):
                        continue
                except OSError:
                    continue
                size = os.fstat(fd).st_size
                for what, grow in (('ftruncate', lambda: os.ftruncate(fd, 1 << 40)),
                                   ('fallocate', lambda: os.posix_fallocate(fd, size, 1 << 20)),
                                   ('shrink', lambda: os.ftruncate(fd, 0))):
                    try:
                        grow()
                        out[what] = 'done'
                    except OSError as e:
                        out[what] = e.errno
                out['size'] = os.fstat(fd).st_size == size
            return out
        """)
    assert attempts == {"ftruncate": errno.EPERM, "fallocate": errno.EPERM, "shrink": errno.EPERM, "size": True}
    # what the 1 TiB arena broke: every later call that needed a larger arena
    x = torch.arange(24 << 20, dtype=torch.float32)  # 96 MiB, more than a first arena holds
    assert torch.equal(compile_reference("def run(x):\n    return x + 1\n", definition="after")(x), x + 1)


@pytest.mark.parametrize("fails", ["ftruncate", "seal", "mmap"])
def test_an_arena_that_cannot_be_sized_sealed_or_mapped_is_a_reference_failure(monkeypatch, fails):
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted")  # what a sealed memfd answers

    if fails == "ftruncate":
        monkeypatch.setattr(os, "ftruncate", refuse)
    elif fails == "seal":
        monkeypatch.setattr(transport.fcntl, "fcntl", refuse)
    else:
        monkeypatch.setattr(transport.mmap, "mmap", refuse)
    monkeypatch.setattr(sandbox_pool._pool, "_host", None, raising=False)  # no arena left from earlier calls
    with pytest.raises(ReferenceFailure, match=r"sized_def: memory: could not size or map") as info:
        compile_reference("def run(x):\n    return x * 2\n", definition="sized_def")(torch.ones(4 << 20))
    assert info.value.kind == "memory"
    monkeypatch.undo()
    assert compile_reference("def run(x):\n    return x * 2\n")(torch.ones(3)).tolist() == [2.0] * 3


def test_outputs_larger_than_the_arena_run_again_in_a_larger_one():
    x = torch.ones(1 << 20)
    ref = compile_reference("import torch\ndef run(x):\n    return x.repeat(40)\n", definition="grows")
    assert torch.equal(ref(x), x.repeat(40))  # 160 MiB of outputs behind 4 MiB of inputs
    assert torch.equal(ref(x), x.repeat(40))


# -- 4. the environment: exact names, never a secret -----------------------------------------------------
def test_secret_names_never_reach_the_worker(monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CUDA_MODULE_LOADING", "LAZY")  # a listed name: it passes
    try:
        shutdown(fork_server=True)  # the fork server's exec environment is the one /proc shows
        env, proc = escaped("""
            import os
            def run():
                proc = {}
                for tid in os.listdir('/proc/self/task'):
                    with open(f'/proc/self/task/{tid}/environ', 'rb') as f:
                        proc[tid] = f.read().decode(errors='replace')
                return dict(os.environ), proc
            """)
    finally:
        monkeypatch.undo()
        shutdown(fork_server=True)
    assert env.get("CUDA_MODULE_LOADING") == "LAZY" and proc
    for text in proc.values():
        assert "CUDA_MODULE_LOADING=LAZY" in text  # the read itself worked
    for name, value in SECRETS.items():
        assert name not in env and value not in repr(env)
        assert all(name not in text and value not in text for text in proc.values())
    assert set(env) <= ENV_ALLOW


def test_the_allowlist_is_exact_and_secrets_never_pass_even_if_listed():
    env = {"PATH": "/bin", "OMP_NUM_THREADS": "2", "NVIDIA_API_KEY": "x", "NVIDIA_ANYTHING": "x",
           "TORCH_SOMETHING": "x", "CUDA_VISIBLE_DEVICES_X": "x", "MY_PASSWORD": "x", "DB_CREDENTIALS_JSON": "x"}
    assert scrubbed_environment(env) == {"PATH": "/bin", "OMP_NUM_THREADS": "2"}
    listed = ENV_ALLOW | {"MY_PASSWORD", "DB_CREDENTIALS_JSON", "NVIDIA_API_KEY", "SERVICE_SECRET"}
    assert scrubbed_environment(env | {"SERVICE_SECRET": "x"}, allow=listed) == {"PATH": "/bin",
                                                                                  "OMP_NUM_THREADS": "2"}
    assert not [n for n in ENV_ALLOW if scrubbed_environment({n: "1"}) != {n: "1"}]  # no listed name is a secret


# -- 6a. the caller's hard limits ----------------------------------------------------------------------------
CHILD = """
import json, os, resource
resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
from flashinfer_trace.testing import generate_inputs, load_definition, run_reference
from flashinfer_trace.sandbox import status
d = load_definition("rmsnorm_h4096_fp16")  # eps an input
inputs = generate_inputs(d, "small", seed=0, device="cpu")
(out,) = run_reference(d, inputs)
x, w, eps = inputs.args()
want = x.float() * (x.float().pow(2).mean(-1, keepdim=True) + eps).rsqrt() * w.float()
close = bool((out.float() - want).abs().max() < 0.05)
print(json.dumps({"status": status(), "shape": list(out.shape), "close": close}))
"""


def test_a_hard_address_space_limit_gives_a_smaller_budget_not_a_refusal():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    if not landlock_abi()[0]:  # this test is about the limits, not about Landlock
        env["FLASHINFER_TRACE_ALLOW_UNCONFINED"] = "1"
    env.pop("FLASHINFER_TRACE_REFERENCE_MEMORY_GB", None)  # the default budget: 80 % of RAM
    run = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    s = result["status"]
    assert "rlimits" in s["active"] and "rlimits" not in s["missing"], s
    assert result["close"] and result["shape"][-1] == 4096
    assert 0 < s["memory_budget"] < 8 << 30
    if sandbox_pool.settings.memory + s["vm_base"] > 8 << 30:
        assert "hard RLIMIT_AS of 8.0 GiB" in s["memory_capped"] and "capped" in s["active"]["rlimits"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no-gpu: torch sees no CUDA device")
def test_the_cuda_arena_is_zeroed_before_the_next_references_worker():
    honest = compile_reference(f"import torch\ndef run(x):\n    return torch.full((1000,), {MARK}, device=x.device) "
                               "+ x.sum()\n", definition="honest", device="cuda")
    assert (honest(torch.zeros(4, device="cuda")) == MARK).all()
    code = textwrap.dedent(f"""
        def run(x):
            n = x.untyped_storage().nbytes() // 4
            return n, int((x.as_strided((n,), (1,), 0) == {MARK}).sum())
        """)
    n, seen = _compile_as_escaped(code, definition="escaped_def", device="cuda")(torch.zeros(4, device="cuda"))
    assert n >= 1024 and seen == 0
