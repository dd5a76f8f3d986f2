"""Values across the worker boundary: shared-memory tensors, and answers checked like untrusted input."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from flashinfer_trace.sandbox import ReferenceFailure, compile_reference, configure, shutdown
from flashinfer_trace.sandbox.pool import _compile_as_escaped
from flashinfer_trace.sandbox.transport import ALIGN, Arenas, HostArena, ProtocolError, decode, encode, needed


@pytest.fixture
def arena():
    host = HostArena(1 << 16)
    yield Arenas({"cpu": host.tensor})
    host.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.bool,
                                   torch.float8_e4m3fn, torch.uint8])
def test_round_trip_is_bit_exact(arena, dtype):
    src = (torch.arange(-60, 60).reshape(3, 40) % 7).to(dtype)
    values = [src, 3, 2.5, None, "s", [1, (2, 3)], {"k": src[0]}, torch.zeros(0, 5, dtype=dtype),
              torch.tensor(1.5).to(dtype), torch.float16]
    spec = encode(values, arena)
    assert json.loads(json.dumps(spec)) == spec
    out = decode(spec, Arenas(arena.buffers), clone=True)
    assert torch.equal(out[0].view(torch.uint8), src.view(torch.uint8)) and out[0].dtype == dtype
    assert out[1:6] == [3, 2.5, None, "s", [1, (2, 3)]]
    assert torch.equal(out[6]["k"], src[0]) and out[7].shape == (0, 5) and out[8].shape == ()
    assert out[9] is torch.float16
    assert spec["v"][0]["off"] % ALIGN == 0 and needed(values)["cpu"] == arena.cursor["cpu"]


def test_non_contiguous_tensors_arrive_contiguous(arena):
    x = torch.arange(12.0).reshape(3, 4).t()
    out = decode(encode(x, arena), arena, clone=True)
    assert torch.equal(out, x) and out.is_contiguous()


@pytest.mark.parametrize("value", [torch, object(), lambda: 1, {1: 2}, torch.zeros(2).to_sparse()])
def test_what_cannot_cross_is_a_type_error(arena, value):
    with pytest.raises(TypeError, match="cannot cross the worker boundary"):
        encode(value, arena)


def _tensor(**kw):
    return {"t": "tensor", "dev": "cpu", "dtype": "float32", "shape": [4], "off": 0} | kw


HOSTILE = [
    pytest.param(_tensor(shape=[1 << 40]), id="beyond-the-arena"),
    pytest.param(_tensor(off=(1 << 16) - 4, shape=[4]), id="straddles-the-end"),
    pytest.param(_tensor(off=-256), id="negative-offset"),
    pytest.param(_tensor(off=3), id="unaligned-offset"),
    pytest.param(_tensor(off="0"), id="offset-not-int"),
    pytest.param(_tensor(shape=[-1]), id="negative-dim"),
    pytest.param(_tensor(shape=[True]), id="bool-dim"),
    pytest.param(_tensor(shape=[1] * 17), id="too-many-dims"),
    pytest.param(_tensor(dtype="object"), id="unknown-dtype"),
    pytest.param(_tensor(dtype="__class__"), id="dtype-attribute-name"),
    pytest.param(_tensor(dev="cuda"), id="arena-not-shared"),
    pytest.param({"t": "py", "v": [1, 2]}, id="py-list"),
    pytest.param({"t": "py", "v": "x" * ((1 << 20) + 1)}, id="huge-string"),
    pytest.param({"t": "seq", "kind": "set", "v": []}, id="bad-sequence"),
    pytest.param({"t": "dict", "v": [[1, {"t": "py", "v": 1}]]}, id="non-str-key"),
    pytest.param({"t": "dtype", "v": "Tensor"}, id="dtype-name-not-dtype"),
    pytest.param({"t": "module", "v": "os"}, id="unknown-kind"),
    pytest.param("not a dict", id="not-a-dict"),
    pytest.param({"t": "seq", "kind": "list", "v": [{"t": "py", "v": 0}] * 100_001}, id="too-many-nodes"),
]


@pytest.mark.parametrize("spec", HOSTILE)
def test_hostile_answers_are_protocol_errors(arena, spec):
    with pytest.raises(ProtocolError):
        decode(spec, arena, clone=True)


def test_deep_answer_is_a_protocol_error(arena):
    spec = {"t": "py", "v": 1}
    for _ in range(40):
        spec = {"t": "seq", "kind": "list", "v": [spec]}
    with pytest.raises(ProtocolError, match="too deep"):
        decode(spec, arena, clone=True)


@pytest.mark.skipif(sys.platform != "linux", reason="unsupported: the worker's confinement is Linux's")
class TestWorkerAnswers:
    """A worker that escaped could write anything on its pipe: the parent kills it and says so."""

    def teardown_method(self):
        shutdown()

    def _forge(self, payload: bytes, claimed: int | None = None) -> str:
        body = ("import os, stat, struct, time\n"
                "for name in os.listdir('/proc/self/fd'):\n"
                "    fd = int(name)\n"
                "    try:\n"
                "        if stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
                f"            os.write(fd, struct.pack('!i', {claimed or len(payload)}) + {payload!r})\n"
                "    except OSError:\n"
                "        pass\n"
                "time.sleep(60)\n")
        return "def run():\n" + "".join(f"    {line}\n" for line in body.splitlines())

    OUTSIDE = {"ok": {"outputs": {"t": "tensor", "dev": "cpu", "dtype": "float32", "shape": [1 << 40], "off": 0},
                      "mutated": []}}
    MUTATED = {"ok": {"outputs": {"t": "py", "v": 1}, "mutated": [99]}}

    @pytest.mark.parametrize("payload", [b"not json", b"[1, 2]", json.dumps(OUTSIDE).encode(),
                                         json.dumps(MUTATED).encode()])
    def test_forged_answer_kills_the_worker(self, payload):
        with pytest.raises(ReferenceFailure) as info:
            _compile_as_escaped(self._forge(payload), definition="forger")()
        assert info.value.kind == "protocol" and info.value.definition == "forger"
        assert compile_reference("def run(x):\n    return x - 1\n")(torch.ones(1)).tolist() == [0.0]

    def test_half_a_message_then_silence_is_a_timeout(self):
        configure(timeout=2)
        try:
            with pytest.raises(ReferenceFailure, match="stall: timeout: no complete answer after 2 s"):
                _compile_as_escaped(self._forge(b'{"ok": ', claimed=1000), definition="stall")()
        finally:
            configure(timeout=900)

    def test_oversized_message_is_a_protocol_failure(self):
        with pytest.raises(ReferenceFailure, match="huge: protocol: a message of"):
            _compile_as_escaped(self._forge(b"", claimed=2**31 - 1), definition="huge")()

    def test_large_inputs_and_outputs_grow_the_arena(self):
        x = torch.randn(3, 1 << 20)  # 12 MiB in, 24 MiB out: past the first arena both ways
        out = compile_reference("import torch\ndef run(x):\n    return torch.cat([x, x])\n")(x)
        assert torch.equal(out, torch.cat([x, x]))
