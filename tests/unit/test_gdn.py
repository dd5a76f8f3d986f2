"""Gated Delta Net (op_type gdn): the input generator, the float64 chunked ground truth, its error
model, the FlashInfer adapters' availability, the Qwen3-Next extraction and the planted bugs."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path

import pytest
import torch
from packaging.version import Version

from flashinfer_trace.dataset import load_definition
from flashinfer_trace.extract import instantiate, plan, select_models
from flashinfer_trace.groundtruth import GroundTruthUnavailable, base, get_ground_truth
from flashinfer_trace.groundtruth import torch_gdn as G
from flashinfer_trace.inputs import edge_cases, generate_inputs
from flashinfer_trace.testing import run_reference

OURS = {"decode": "gdn_decode_qk4_v8_d128_k_last", "mtp": "gdn_mtp_qk4_v8_d128_k_last",
        "prefill": "gdn_prefill_qk4_v8_d128_k_last"}
PUBLIC = Path("/tmp/public/flashinfer_trace/definitions/gdn")
public = pytest.mark.skipif(not PUBLIC.is_dir(), reason="the public flashinfer-trace dataset is not at " + str(PUBLIC))


def _close(ref, gt, out_rtol=1e-2, state_rtol=1e-4):
    """Reference (float32, bf16 output) against the float64 ground truth: the output within bf16
    rounding, the states (MTP: the pool and the intermediate-state buffer) within float32 accumulation."""
    out, *states = ref
    g_out, *g_states = gt
    assert out.dtype == torch.bfloat16 and len(states) == len(g_states)
    torch.testing.assert_close(out.double(), g_out, atol=1e-2, rtol=out_rtol)
    for state, g_state in zip(states, g_states, strict=True):
        assert state.dtype == torch.float32
        torch.testing.assert_close(state.double(), g_state, atol=1e-4, rtol=state_rtol)


# -- the generator ----------------------------------------------------------------------------------
@pytest.mark.parametrize("stage", ["decode", "mtp", "prefill"])
def test_generator_honours_shapes_constraints_and_normalises_q_k(stage):
    d = load_definition(OURS[stage])
    x = generate_inputs(d, "small", seed=0)
    v = x.values
    for name in ("q", "k"):
        norms = v[name].double().norm(dim=-1)
        assert torch.allclose(norms, torch.ones_like(norms), atol=1e-2), name
    assert v["A_log"].dtype == torch.float32 and 0.0 <= float(v["A_log"].min()) and float(v["A_log"].max()) <= 2.78
    dt = torch.nn.functional.softplus(v["dt_bias"].double())
    assert 1e-3 * 0.99 <= float(dt.min()) and float(dt.max()) <= 0.1 * 1.01
    assert v["scale"] == pytest.approx(1 / math.sqrt(128))
    if stage == "prefill":
        cu = v["cu_seqlens"]
        lens = (cu[1:] - cu[:-1]).tolist()
        assert cu.dtype == torch.int64 and cu[0] == 0 and min(lens) == 1 and max(lens) == 70  # crosses a 64 chunk
        assert x.axes["total_seq_len"] == sum(lens) and x.axes["num_seqs"] == len(lens) == v["state"].shape[0]
    elif stage == "mtp":
        idx = v["initial_state_indices"]
        assert x.axes["seq_len"] > 1 and x.axes["pool_size"] > x.axes["batch_size"]
        assert len(set(idx.tolist())) == idx.numel() and idx.max() < x.axes["pool_size"]
        assert idx.tolist() != list(range(idx.numel())) and not bool((idx[1:] > idx[:-1]).all())
        assert not v["intermediate_states_buffer"].any()
    else:
        assert x.axes["seq_len"] == 1 and v["state"].shape[0] == x.axes["batch_size"]
    again = generate_inputs(d, "small", seed=0)
    assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
               for a, b in zip(x.args(), again.args(), strict=True))


def test_edge_cases_per_stage():
    assert edge_cases(load_definition(OURS["decode"])) == ["batch1", "zero_state", "fast_decay", "gate_extremes"]
    assert "min_tokens" in edge_cases(load_definition(OURS["mtp"]))
    d = load_definition(OURS["prefill"])
    assert "unit_lengths" in edge_cases(d)
    x = generate_inputs(d, "small", seed=0, case="unit_lengths")
    assert (x.values["cu_seqlens"][1:] - x.values["cu_seqlens"][:-1]).tolist() == [1] * x.axes["num_seqs"]
    z = generate_inputs(d, "small", seed=0, case="zero_state")
    assert not z.values["state"].any()
    one = generate_inputs(d, "small", seed=0, case="batch1")
    assert one.axes["num_seqs"] == 1
    m = generate_inputs(load_definition(OURS["mtp"]), "small", seed=0, case="min_tokens")
    assert m.axes["seq_len"] == 2
    fast = G.gates(generate_inputs(load_definition(OURS["decode"]), "small", 0, case="fast_decay").values)[0]
    slow = G.gates(generate_inputs(load_definition(OURS["decode"]), "small", 0).values)[0]
    assert float(fast.exp().median()) < 0.1 and float(slow.exp().median()) > 0.9


def test_an_unknown_input_is_a_clear_error():
    from flashinfer_trace.inputs import InputGenerationError

    d = load_definition(OURS["decode"])
    data = d.as_dict | {"inputs": {**d.as_dict["inputs"], "z": {"shape": ["batch_size"], "dtype": "float32"}}}
    from flashinfer_trace.inputs import GeneratorMismatch
    from flashinfer_trace.inputs.common import Builder
    from flashinfer_trace.inputs.registry import family_for

    unknown = type(d).model_validate(data)
    with pytest.raises(GeneratorMismatch, match="does not know input.*z"):  # the family makes no guess
        family_for(unknown).generate(Builder(unknown, "small", 0, None))
    assert issubclass(GeneratorMismatch, InputGenerationError)
    assert generate_inputs(unknown, "small", seed=0).source == "declared"  # the declaration makes its inputs


# -- the ground truth ----------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_chunked_form_equals_the_recurrence(chunk):
    g = torch.Generator().manual_seed(chunk)
    length, hv, dk, dv = 37, 3, 8, 6
    q = torch.nn.functional.normalize(torch.randn(length, hv, dk, generator=g, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(length, hv, dk, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(length, hv, dv, generator=g, dtype=torch.float64)
    log_g = -torch.rand(length, hv, generator=g, dtype=torch.float64) * 3
    beta = torch.rand(length, hv, generator=g, dtype=torch.float64)
    s0 = torch.randn(hv, dv, dk, generator=g, dtype=torch.float64)
    o1, s1 = G.chunk_scan(q, k, v, log_g, beta, s0, 0.3, chunk=chunk)
    o2, s2 = G.recurrence(q, k, v, log_g, beta, s0, 0.3)
    torch.testing.assert_close(o1, o2, atol=1e-11, rtol=1e-11)
    torch.testing.assert_close(s1, s2, atol=1e-11, rtol=1e-11)


@pytest.mark.parametrize("stage", ["decode", "mtp", "prefill"])
@pytest.mark.parametrize("case", [None, "zero_state", "fast_decay"])
def test_torch_ground_truth_agrees_with_our_references(stage, case):
    d = load_definition(OURS[stage])
    x = generate_inputs(d, "small", seed=1, case=case)
    gt = get_ground_truth("torch", d, device="cpu")(x)
    _close(run_reference(d, x.clone()), gt)
    if stage == "mtp":  # a verification pass: the pool comes back unchanged; the buffer holds every state
        assert torch.equal(gt[1], x.values["initial_state"].double())
        assert len(gt) == 3 and gt[2].shape == x.values["intermediate_states_buffer"].shape
        assert bool((gt[2].flatten(2).abs().amax(-1) > 0).all())  # every (row, token) written


def test_mtp_declares_its_intermediate_states_written_in_place():
    """The MTP reference writes the state after each token into intermediate_states_buffer: the definitions
    declare it as an in-place output (an input and an output of the same name), indexed by row as
    FlashInfer's gated_delta_rule_mtp indexes it, so the engine neither flags the write nor leaves it
    unchecked: its value after the call is compared with the ground truth's."""
    from flashinfer_trace.memo import written_inputs

    for name in ("gdn_mtp_qk4_v8_d128_k_last", "gdn_mtp_qk8_v16_d128_k_last", "gdn_mtp_qk16_v32_d128_k_last"):
        d = load_definition(name)
        assert d.in_place_outputs == ["intermediate_states_buffer"]
        assert d.inputs["intermediate_states_buffer"].shape == ["batch_size", "seq_len", "num_v_heads",
                                                                 "head_size", "head_size"]
    x = generate_inputs(d, "small", seed=0)
    used = x.clone()
    out = run_reference(d, used)
    assert len(out) == 3 and written_inputs(d, x, used) == []
    assert torch.equal(x.values["intermediate_states_buffer"], torch.zeros_like(out[2]))  # a copy was written
    slots = x.values["initial_state_indices"].long()
    last = out[2][:, -1]  # row i's state after its last token, at row i (not its slot)
    gt = G.run(d, x.values)
    torch.testing.assert_close(last.double(), gt[2][:, -1], atol=1e-4, rtol=1e-4)
    assert not torch.allclose(last.double(), gt[2][slots.argsort(), -1], atol=1e-2)  # the slot order differs


@public
@pytest.mark.parametrize("path", sorted(PUBLIC.glob("*.json")) if PUBLIC.is_dir() else [],
                         ids=lambda p: p.stem)
def test_torch_ground_truth_agrees_with_the_public_references(path):
    d = load_definition(path)
    x = generate_inputs(d, "small", seed=0)
    ref, gt = run_reference(d, x.clone()), get_ground_truth("torch", d, device="cpu")(x)
    assert [tuple(t.shape) for t in ref] == [tuple(t.shape) for t in gt]
    _close(ref, gt)


def test_the_ground_truth_catches_a_transposed_state():
    d = load_definition(OURS["decode"])
    x = generate_inputs(d, "small", seed=0)
    out, state = G.run(d, x.values)
    flipped = dict(x.values, state=x.values["state"].transpose(-1, -2).contiguous())
    out_t, _ = G.run(d, flipped)
    assert (out - out_t).abs().max() > 0.1 * out.abs().max()


def test_error_scales_bound_the_output_and_state():
    from flashinfer_trace.verdict.errormodel import error_models, error_scales

    for stage in ("decode", "prefill"):
        d = load_definition(OURS[stage])
        x = generate_inputs(d, "small", seed=0)
        out, state = G.run(d, x.values)
        s_out, s_state = error_scales(d, x)
        assert bool((s_out >= out.abs() - 1e-12).all()) and bool((s_state >= state.abs() - 1e-12).all())
        assert float(s_out.max()) > float(out.abs().max())  # wider where the prediction cancelled
        assert error_models(d)[0].startswith("operand scale")


# -- FlashInfer -----------------------------------------------------------------------------------------
def _fake_flashinfer(monkeypatch, version: str, **submodules):
    fi = types.ModuleType("flashinfer")
    fi.__version__ = version
    monkeypatch.setitem(sys.modules, "flashinfer", fi)
    for name, mod in submodules.items():
        monkeypatch.setitem(sys.modules, f"flashinfer.{name}", mod)
        setattr(fi, name, mod)
    monkeypatch.setattr(base, "installed_version", lambda package: Version(version))
    monkeypatch.setattr(base, "_imported", {})
    monkeypatch.setattr(base, "cuda_capability", lambda device: (9, 0) if str(device).startswith("cuda") else None)
    return fi


def _no_cutlass(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cutlass" else real(name, *a))


@pytest.mark.parametrize("stage", ["decode", "mtp"])
def test_decode_and_mtp_without_cutlass_dsl_skip_naming_it(monkeypatch, stage):
    _fake_flashinfer(monkeypatch, "0.6.6")
    _no_cutlass(monkeypatch)
    with pytest.raises(GroundTruthUnavailable) as e:
        get_ground_truth("flashinfer", load_definition(OURS[stage]), device="cuda")
    assert e.value.kind == "not-installed" and "nvidia-cutlass-dsl" in str(e.value)


def _import_failing_on(monkeypatch, fi, module_name: str, missing: str) -> GroundTruthUnavailable:
    """What flashinfer_gdn._import(fi, module_name) raises when the import fails on `missing`."""
    from flashinfer_trace.groundtruth import flashinfer_gdn

    def fail(name, *a, **kw):
        raise ModuleNotFoundError(f"No module named '{missing}'", name=missing)

    monkeypatch.setattr(flashinfer_gdn.importlib, "import_module", fail)
    with pytest.raises(GroundTruthUnavailable) as e:
        flashinfer_gdn._import(fi, module_name)
    return e.value


def test_gdn_decode_module_failing_on_cutlass_is_not_installed(monkeypatch):
    """0.6.6's flashinfer.gdn_decode imports cutlass at module scope: that import error names it too."""
    fi = _fake_flashinfer(monkeypatch, "0.6.6")
    e = _import_failing_on(monkeypatch, fi, "gdn_decode", "cutlass")
    assert e.kind == "not-installed" and "nvidia-cutlass-dsl" in str(e)


def test_a_release_without_the_prefill_module_is_api_missing(monkeypatch):
    """0.5.3 has no flashinfer.gdn_prefill (the H100 sweep said import-failed: ModuleNotFoundError); a module
    that fails inside its own imports stays import-failed."""
    fi = _fake_flashinfer(monkeypatch, "0.5.3")
    monkeypatch.delitem(sys.modules, "flashinfer.gdn_prefill", raising=False)
    with pytest.raises(GroundTruthUnavailable) as e:
        get_ground_truth("flashinfer", load_definition(OURS["prefill"]), device="cuda")
    assert e.value.kind == "api-missing" and "flashinfer 0.5.3 has no module flashinfer.gdn_prefill" in str(e.value)
    e = _import_failing_on(monkeypatch, fi, "gdn_prefill", "einops")
    assert e.kind == "import-failed" and "einops" in str(e)


@pytest.mark.parametrize("version", ["0.6.14", "0.7.2"])
def test_a_prefill_with_cute_dsl_kernels_needs_cutlass_dsl_whatever_its_version(monkeypatch, version):
    """Read from the module, not the number: 0.6.14's gdn_prefill already imports the DSL kernel (None
    without nvidia-cutlass-dsl; the call raised NotImplementedError on the H100, 24 false failures)."""
    prefill = types.ModuleType("flashinfer.gdn_prefill")
    prefill.chunk_gated_delta_rule = lambda *a, **k: None
    prefill.chunk_gated_delta_rule_sm90 = None
    _fake_flashinfer(monkeypatch, version, gdn_prefill=prefill)
    _no_cutlass(monkeypatch)
    with pytest.raises(GroundTruthUnavailable) as e:
        get_ground_truth("flashinfer", load_definition(OURS["prefill"]), device="cuda")
    assert e.value.kind == "not-installed" and "nvidia-cutlass-dsl" in str(e.value)
    assert f"flashinfer {version} runs gdn prefill as CuTe-DSL" in str(e.value)


def test_prefill_0_7_needs_cutlass_dsl_and_0_6_runs_the_jit_kernel(monkeypatch):
    seen: dict = {}

    def chunk_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
                               cu_seqlens=None, use_qk_l2norm_in_kernel=False, output=None, output_state=None):
        seen.update(g=g, beta=beta, scale=scale, final=output_final_state, l2=use_qk_l2norm_in_kernel,
                    cu=cu_seqlens, state=initial_state)
        return torch.zeros(q.shape[0], v.shape[1], v.shape[2], dtype=q.dtype), initial_state

    dsl = types.ModuleType("flashinfer.gdn_prefill")
    dsl.chunk_gated_delta_rule, dsl.chunk_gated_delta_rule_sm90 = chunk_gated_delta_rule, None
    d = load_definition(OURS["prefill"])
    _fake_flashinfer(monkeypatch, "0.7.2", gdn_prefill=dsl)
    _no_cutlass(monkeypatch)
    with pytest.raises(GroundTruthUnavailable, match="nvidia-cutlass-dsl"):
        get_ground_truth("flashinfer", d, device="cuda")
    prefill = types.ModuleType("flashinfer.gdn_prefill")
    prefill.chunk_gated_delta_rule = chunk_gated_delta_rule
    _fake_flashinfer(monkeypatch, "0.6.6", gdn_prefill=prefill)
    gt = get_ground_truth("flashinfer", d, device="cuda")
    assert gt.api == "flashinfer.gdn_prefill.chunk_gated_delta_rule"
    x = generate_inputs(d, "small", seed=0)
    import dataclasses

    out, state = dataclasses.replace(gt, device="cpu")(x)
    log_g, beta = G.gates(x.values)
    assert seen["final"] is True and seen["l2"] is False and seen["cu"].dtype == torch.int64
    torch.testing.assert_close(seen["g"].double(), log_g.exp(), rtol=1e-5, atol=1e-6)  # alpha, not log g
    torch.testing.assert_close(seen["beta"].double(), beta, rtol=1e-5, atol=1e-6)
    assert seen["state"] is not x.values["state"] and torch.equal(seen["state"], x.values["state"])
    assert out.shape == (x.axes["total_seq_len"], 8, 128) and state.shape == x.values["state"].shape


# -- roofline, extraction, planted bugs ------------------------------------------------------------------
def test_roofline_counts_seven_flops_per_state_element_and_token():
    from flashinfer_trace.timing.roofline import work

    d = load_definition(OURS["prefill"])
    x = generate_inputs(d, "small", seed=0)
    assert work(d, x).flops == 7 * x.axes["total_seq_len"] * 8 * 128 * 128


def test_qwen3_next_plans_the_public_gdn_names_per_tp():
    names = {}
    for tp in (1, 2, 4):
        [cfg] = select_models("qwen3-next-80b-a3b", tp=tp)
        p = plan(cfg)
        names[tp] = sorted(instantiate(k, cfg)["name"] for k in p.kernels if k.family == "gdn")
        assert any("conv1d" in s for s in p.left_out)
    assert names[1] == ["gdn_decode_qk16_v32_d128_k_last", "gdn_mtp_qk16_v32_d128_k_last",
                        "gdn_prefill_qk16_v32_d128_k_last"]
    assert names[4][0] == "gdn_decode_qk4_v8_d128_k_last"
    with pytest.raises(ValueError, match="linear_num_key_heads"):
        [cfg] = select_models("qwen3-next-80b-a3b", tp=32)
        plan(cfg)


@public
def test_our_definitions_have_the_public_interface():
    """Bar MTP's intermediate-state buffer: ours is an in-place output indexed by row, [batch, ..], as
    FlashInfer's kernel writes it; the public file's is an input only, pool-sized, written at the slot."""
    buffer = "intermediate_states_buffer"
    for path in sorted(PUBLIC.glob("*.json")):
        pub, ours = load_definition(path), load_definition(path.stem)
        assert list(ours.inputs) == list(pub.inputs)
        assert [n for n in ours.outputs if n != buffer] == list(pub.outputs)
        assert {n: (s.shape, s.dtype) for n, s in ours.inputs.items() if n != buffer} == \
               {n: (s.shape, s.dtype) for n, s in pub.inputs.items() if n != buffer}
        assert ours.const_axes == pub.const_axes


@pytest.mark.parametrize("mutant", [m.id for m in __import__("flashinfer_trace.mutants", fromlist=["M"]).MUTANTS
                                    if m.definition.startswith("gdn_")])
def test_planted_gdn_bugs_are_caught(mutant):
    from flashinfer_trace.mutants import MUTANTS, kill

    [m] = [m for m in MUTANTS if m.id == mutant and m.definition.startswith("gdn_")]
    k = kill(m, "torch", sizes=("small",), seeds=(0,))
    assert k.killed is True, k.how


def test_a_file_that_leaves_a_gates_dtype_unknown_is_not_applicable_not_a_crash(tmp_path):
    """FlashInfer 0.7.2.post1's own traced GDN prefill declares A_log and dt_bias "unknown": asking whether its
    kernels apply raised AttributeError and took down the collection of every fi_trace test (H200, 2026-11-28)."""
    import json

    from flashinfer_trace.dataset import load_path
    from flashinfer_trace.groundtruth import flashinfer_gdn

    data = json.loads(load_definition(OURS["prefill"]).to_json())
    data["inputs"]["A_log"].update(dtype="unknown", optional=True)  # as an fi_trace file writes an absent input
    (tmp_path / f"{data['name']}.json").write_text(json.dumps(data))
    d = load_path(tmp_path / f"{data['name']}.json")
    assert d.inputs["A_log"].dtype is None
    assert flashinfer_gdn.applies("prefill", "cu_seqlens")(d) == "takes float32 A_log and dt_bias"
