"""mamba_ssu (Mamba2 selective state update): the input generator, the float64 torch ground truth
against the references (the public files when /tmp/public is there, our own definitions, a per-element
loop of its own), the FlashInfer adapter's CPU-checkable parts, the roofline, the template and the
Nemotron-H extraction. The planted bugs (mutants.py) run in test_errormodel.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flashinfer_trace import semantics as sem
from flashinfer_trace.dataset import load_definition
from flashinfer_trace.definition import Definition
from flashinfer_trace.extract import ConfigError, plan, select_models
from flashinfer_trace.extract.templates import FAMILIES
from flashinfer_trace.groundtruth import GroundTruthUnavailable
from flashinfer_trace.groundtruth.base import Call
from flashinfer_trace.inputs import InputGenerationError, edge_cases, generate_inputs
from flashinfer_trace.testing import assert_close, get_ground_truth, run_reference, tolerance_for
from flashinfer_trace.timing.roofline import work
from flashinfer_trace.validate import check_data

ROOT = Path(__file__).resolve().parents[2]
OURS = sorted((ROOT / "definitions" / "mamba_ssu").glob("*.json"))
PUBLIC = sorted(Path("/tmp/public/flashinfer_trace/definitions/mamba_ssu").glob("*.json"))
public = pytest.mark.skipif(not PUBLIC, reason="the public dataset is not at /tmp/public")


def _tiny(nheads=4, head_dim=3, dstate=5, ngroups=2) -> Definition:
    return Definition.model_validate(FAMILIES["mamba_ssu"](nheads=nheads, head_dim=head_dim, dstate=dstate,
                                                           ngroups=ngroups))


# -- the generator ------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [None, "batch1", "padded", "large_cache", "large_dt"])
def test_generated_cases_are_what_a_mamba2_layer_feeds(case):
    d = _tiny(nheads=8, head_dim=4, dstate=16, ngroups=2)
    i = generate_inputs(d, "small", 0, case=case)
    v, ax = i.values, i.axes
    batch, rows = ax["batch_size"], ax["state_cache_size"]
    assert rows >= batch and v["state"].shape == (rows, 8, 4, 16) and v["B"].shape == (batch, 2, 16)
    slots = v["state_batch_indices"].tolist()
    live = [s for s in slots if s != -1]
    assert len(set(live)) == len(live) and all(0 <= s < rows for s in live)  # distinct rows of the cache
    assert (len(live) < batch) == (case == "padded") and live  # padding only where asked, never all of it
    assert batch == (1 if case == "batch1" else 4)
    if case == "large_cache":
        assert rows >= 4 * batch
    a = v["A"]
    assert (a < 0).all() and torch.equal(a, a[:, :1, :1].expand_as(a))  # negative, one value per head
    for name in ("D", "dt_bias"):
        assert torch.equal(v[name], v[name][:, :1].expand_as(v[name]))
    assert torch.equal(v["dt"], v["dt"][:, :, :1].expand_as(v["dt"]))
    step = torch.nn.functional.softplus(v["dt"].double() + v["dt_bias"].double())
    if case == "large_dt":
        assert step.max() > 20  # softplus past torch's threshold, decays underflowing to 0
    else:
        assert 0 < step.min() and step.max() < 1
    again = generate_inputs(d, "small", 0, case=case)
    assert all(torch.equal(again.values[k], v[k]) for k in v)


def test_generator_errors_name_the_definition_and_the_input():
    data = FAMILIES["mamba_ssu"](nheads=4, head_dim=3, dstate=5, ngroups=2)
    data["inputs"]["conv_state"] = {"shape": ["batch_size", "nheads"], "dtype": "bfloat16"}
    with pytest.raises(InputGenerationError, match=r"mamba_ssu_decode_h4_d3_s5_ng2: .*conv_state"):
        _family(Definition.model_validate(data))
    data = FAMILIES["mamba_ssu"](nheads=4, head_dim=3, dstate=5, ngroups=2)
    data["inputs"]["x"]["shape"] = ["batch_size", "nheads"]
    with pytest.raises(InputGenerationError, match="input 'x'.*3 dimensions"):
        _family(Definition.model_validate(data))
    # a family that does not fit is no error of generate_inputs: the declaration makes the inputs
    assert generate_inputs(Definition.model_validate(data), "small", 0).source == "declared"


def _family(d: Definition) -> None:
    from flashinfer_trace.inputs import GeneratorMismatch
    from flashinfer_trace.inputs.common import Builder
    from flashinfer_trace.inputs.registry import family_for

    try:
        family_for(d).generate(Builder(d, "small", 0, None))
    except GeneratorMismatch:
        raise
    except InputGenerationError as e:
        raise AssertionError(f"a loud error where a mismatch was due: {e}") from e


# -- the torch ground truth --------------------------------------------------------------------------
def _matches(d: Definition, size: str = "small", seed: int = 0, case: str | None = None) -> list:
    """assert_close's reports (it raises on a mismatch): one per output."""
    inputs = generate_inputs(d, size, seed, case=case)
    expected = get_ground_truth("torch", d, device="cpu")(inputs)
    return assert_close(run_reference(d, inputs), expected, tolerance=tolerance_for(d), names=list(d.outputs))


@public
@pytest.mark.parametrize("path", PUBLIC, ids=[p.stem for p in PUBLIC])
def test_torch_agrees_with_the_public_references(path):
    d = load_definition(path)
    for case in [None, *edge_cases(d)]:
        assert [r.name for r in _matches(d, case=case)] == list(d.outputs)


@pytest.mark.parametrize("path", OURS, ids=[p.stem for p in OURS])
def test_torch_agrees_with_our_references(path):
    d = load_definition(path)
    for case in [None, *edge_cases(d)]:
        assert [r.name for r in _matches(d, case=case)] == list(d.outputs)
    assert all(r.passed for r in _matches(d, seed=1))


def test_torch_agrees_with_a_per_element_loop():
    """The recurrence written out element by element in float64, for a tiny definition with padding."""
    d = _tiny()
    i = generate_inputs(d, "small", 3, case="padded")
    v = {k: t.double() if t.is_floating_point() else t for k, t in i.values.items()}
    out, new_state = get_ground_truth("torch", d, device="cpu")(i)
    want_state = v["state"].clone()
    want = torch.zeros_like(v["x"])
    batch, nheads, head_dim = v["x"].shape
    ratio = nheads // v["B"].shape[1]
    for b in range(batch):
        slot = int(v["state_batch_indices"][b])
        if slot == -1:
            continue
        for h in range(nheads):
            g = h // ratio
            for p in range(head_dim):
                z = float(v["dt"][b, h, p] + v["dt_bias"][h, p])
                step = torch.log1p(torch.exp(torch.tensor(z, dtype=torch.float64)))
                acc = v["D"][h, p] * v["x"][b, h, p]
                for n in range(v["state"].shape[-1]):
                    s = (torch.exp(step * v["A"][h, p, n]) * v["state"][slot, h, p, n]
                         + step * v["x"][b, h, p] * v["B"][b, g, n])
                    want_state[slot, h, p, n] = s
                    acc = acc + s * v["C"][b, g, n]
                want[b, h, p] = acc
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(new_state, want_state, rtol=1e-12, atol=1e-12)


def test_softplus_is_declared_by_the_definition_not_read_from_the_reference():
    d = _tiny()
    assert "param:dt_softplus=true" in d.tags and sem.mamba_dt_softplus(d) is True
    code = d.reference.replace("F.softplus(dt.to(torch.float32) + dt_bias.to(torch.float32))",
                               "dt.to(torch.float32) + dt_bias.to(torch.float32)")
    tags = [t for t in d.tags if not t.startswith("param:")]
    assert sem.mamba_dt_softplus(d.model_copy(update={"reference": code})) is True  # the reference is judged
    with pytest.raises(GroundTruthUnavailable, match="declares no dt_softplus"):
        sem.mamba_dt_softplus(d.model_copy(update={"tags": tags}))
    plain = d.model_copy(update={"reference": code, "tags": [*tags, "param:dt_softplus=false"]})
    assert sem.mamba_dt_softplus(plain) is False
    # the ground truth follows it: without softplus, a dt that already holds softplus(dt + bias) - bias
    # gives the same step, and so the same results
    i = generate_inputs(d, "small", 0)
    v = dict(i.values)
    v["dt"] = torch.nn.functional.softplus(v["dt"].double() + v["dt_bias"].double()) - v["dt_bias"].double()
    shifted = type(i)(i.definition, i.size, i.seed, i.case, v, dict(i.axes))
    with_softplus = get_ground_truth("torch", d, device="cpu")(i)
    without = get_ground_truth("torch", plain, device="cpu")(shifted)
    for a, b in zip(with_softplus, without, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(get_ground_truth("torch", plain, device="cpu")(i)[0], with_softplus[0])


# -- the FlashInfer adapter (what a CPU can check) ----------------------------------------------------
def test_flashinfer_adapter_takes_tied_parameters_as_stride_zero_views():
    from flashinfer_trace.groundtruth.flashinfer import _tied

    d = _tiny()
    i = generate_inputs(d, "small", 0)
    call = Call(d, i, None, None)
    a = _tied(call, "A", i.values["A"], 1)
    assert a.stride() == (1, 0, 0) and torch.equal(a, i.values["A"])
    dt = _tied(call, "dt", i.values["dt"], 2)
    assert dt.stride()[1:] == (1, 0) and torch.equal(dt, i.values["dt"])
    untied = i.values["D"].clone()
    untied[0, 1] += 1
    with pytest.raises(GroundTruthUnavailable, match="unsupported: .*D varies"):
        _tied(call, "D", untied, 1)


def test_flashinfer_is_a_precise_skip_without_it():
    d = _tiny()
    with pytest.raises(GroundTruthUnavailable) as e:
        get_ground_truth("flashinfer", d, device="cpu")
    assert e.value.kind in ("not-installed", "no-gpu")


# -- roofline, template, extraction -------------------------------------------------------------------
def test_roofline_counts_the_rows_live_requests_touch():
    d = _tiny(nheads=8, head_dim=4, dstate=16, ngroups=2)
    full, padded = (generate_inputs(d, "small", 0, case=c) for c in (None, "padded"))
    row = 8 * 4 * 16 * 2  # one bf16 cache row
    live = int((padded.values["state_batch_indices"] >= 0).sum())
    w_full, w_pad = work(d, full), work(d, padded)
    assert w_full.detail["bytes_read"]["state"] == 4 * row and w_pad.detail["bytes_read"]["state"] == live * row
    assert w_pad.detail["bytes_written"]["new_state"] == live * row
    assert w_full.flops == 7 * 4 * 8 * 4 * 16 and w_pad.flops == 7 * live * 8 * 4 * 16


def test_template_is_valid_and_checks_its_parameters():
    made = FAMILIES["mamba_ssu"](nheads=64, head_dim=64, dstate=128, ngroups=4)
    assert made["name"] == "mamba_ssu_decode_h64_d64_s128_ng4" and check_data(made, stem=made["name"]) == []
    assert "fi_api:flashinfer.mamba.selective_state_update" in made["tags"]
    with pytest.raises(ValueError, match="multiple of ngroups"):
        FAMILIES["mamba_ssu"](nheads=6, head_dim=4, dstate=8, ngroups=4)


@public
def test_our_definitions_have_the_public_interface():
    """Same name, axes, inputs and outputs (shapes and dtypes) as the public files; our own reference."""
    for path in PUBLIC:
        theirs = json.loads(path.read_text())
        ours = json.loads((ROOT / "definitions/mamba_ssu" / path.name).read_text())
        for key in ("axes", "inputs", "outputs"):
            assert {k: {f: v for f, v in spec.items() if f != "description"} for k, spec in ours[key].items()} == \
                   {k: {f: v for f, v in spec.items() if f != "description"} for k, spec in theirs[key].items()}
        assert ours["reference"] != theirs["reference"]


@pytest.mark.parametrize(("tp", "heads", "groups", "attn"), [(1, 128, 8, (32, 8)), (2, 64, 4, (16, 4))])
def test_nemotron_h_plan(tp, heads, groups, attn):
    p = plan(select_models("nemotron-h-8b", tp=tp)[0])
    ks = {(k.family, tuple(sorted(k.kwargs.items()))) for k in p.kernels}
    assert ("mamba_ssu", tuple(sorted(dict(nheads=heads, head_dim=64, dstate=128, ngroups=groups).items()))) in ks
    gqa = [dict(k.params) for k in p.kernels if k.family == "gqa_paged"]
    assert {(g["num_qo_heads"], g["num_kv_heads"], g["head_dim"]) for g in gqa} == {(*attn, 128)}
    gemms = {(dict(k.params)["n"], dict(k.params)["k"]) for k in p.kernels if k.family == "gemm"}
    assert ((2 * heads * 64 + 2 * groups * 128 + heads), 4096) in gemms  # in_proj [z, x, B, C, dt]
    assert not any(k.family in ("rope", "silu_and_mul", "moe") for k in p.kernels)  # no RoPE, relu^2 MLP
    assert any("relu" in x for x in p.left_out) and any("conv1d" in x for x in p.left_out)


def test_nemotron_h_config_errors_name_file_and_field(tmp_path):
    data = json.loads((ROOT / "src/flashinfer_trace/extract/configs/nemotron-h-8b.json").read_text())
    data.pop("flashinfer_trace")
    from flashinfer_trace.extract import load_config

    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({**data, "hybrid_override_pattern": "M-E*"}))
    with pytest.raises(ConfigError, match=r"config\.json: hybrid_override_pattern: .*'E'"):
        plan(load_config(bad))
    bad.write_text(json.dumps({k: v for k, v in data.items() if k != "ssm_state_size"}))
    with pytest.raises(ConfigError, match=r"config\.json: ssm_state_size: missing"):
        load_config(bad)
    with pytest.raises(ConfigError, match="n_groups 8 is not divisible by --tp 16"):
        plan(select_models("nemotron-h-8b", tp=16)[0])
