"""The ground truth found from a definition's `fi_api:` tag (groundtruth/fi_api.py), against a fake
flashinfer package written to disk and imported from sys.path: versions, missing attributes, signature
mismatches, in-place outputs, and its place after the hand-written adapters."""

from __future__ import annotations

import dataclasses
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from packaging.version import Version

from flashinfer_trace.definition import Definition
from flashinfer_trace.groundtruth import GroundTruthUnavailable, base, fi_api, get_ground_truth
from flashinfer_trace.inputs import Inputs

FAKE = '''
import torch
import torch.nn.functional as F

calls = []


def _norm(x, w, eps):
    x32 = x.to(torch.float32)
    return (F.rms_norm(x32, (x.shape[-1],), eps=eps) * w.to(torch.float32)).to(x.dtype)


def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    calls.append(("rmsnorm", eps))
    return _norm(input, weight, eps)


def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    """In place like the kernel: residual <- input + residual, input <- norm(residual) * weight."""
    calls.append(("fused_add_rmsnorm", eps))
    residual.add_(input)
    input.copy_(_norm(residual, weight, eps))


def add_and_norm(input, residual, weight, eps=1e-6):
    """Writes the sum into residual and returns the normalised result."""
    residual.add_(input)
    return _norm(residual, weight, eps)


def kv_sum(q, paged_kv_cache):
    k, v = paged_kv_cache
    return q + k - v


class PagedWrapper:
    def run(self, q):
        return q


class BackendSupportedError(Exception):
    pass


def blackwell_only(input):
    raise BackendSupportedError("blackwell_only does not support compute capability 90; supported compute "
                                "capabilities: [100, 103, 107]")


def picky(input):
    raise ValueError("tensors do not satisfy the picky contract")


def sampling_from_logits(logits, deterministic=True, generator=None):
    calls.append(("sampling_from_logits", tuple(logits.shape)))
    return torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=generator).squeeze(1).to(torch.int32)
'''

GEMMA = '''

def gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    return _norm(input, weight + 1, eps)
'''


@pytest.fixture
def fake_flashinfer(tmp_path, monkeypatch):
    """write(version, gemma=...) puts a flashinfer package of that version on sys.path; every test starts
    and ends with nothing of it imported or cached."""

    installed_version = base.installed_version  # cached; a test may monkeypatch it away

    def clean():
        for name in [m for m in sys.modules if m == "flashinfer" or m.startswith("flashinfer.")]:
            del sys.modules[name]
        installed_version.cache_clear()

    def write(version: str, *, gemma: bool = False):
        root = tmp_path / f"fi-{version}"
        pkg = root / "flashinfer"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(f"__version__ = {version!r}\nfrom . import norm\n"
                                         "from .norm import PagedWrapper\n")
        (pkg / "norm.py").write_text(textwrap.dedent(FAKE) + (GEMMA if gemma else ""))
        monkeypatch.syspath_prepend(str(root))
        return root

    clean()
    monkeypatch.setattr(base, "_imported", {})
    monkeypatch.setattr(base, "cuda_capability", lambda device: (9, 0) if str(device).startswith("cuda") else None)
    yield write
    clean()


def definition(name: str, op_type: str, api: str, inputs: dict, outputs: dict, reference: str = "",
               eps: float | None = 1e-6) -> Definition:
    """`eps`: declared by a param tag (the norm APIs take eps=; an undeclared one is unsupported)."""
    return Definition.model_validate({
        "name": name, "op_type": op_type, "tags": [f"fi_api:{api}", *([f"param:eps={eps!r}"] if eps else [])],
        "axes": {"rows": {"type": "var"}, "hidden": {"type": "const", "value": 8}},
        "inputs": inputs, "outputs": outputs,
        "reference": reference or "import torch\n\ndef run(*args):\n    return args[0]\n"})


def tensor(shape=("rows", "hidden"), **extra) -> dict:
    return {"shape": list(shape), "dtype": "float32", **extra}


def inputs_for(d: Definition, rows: int = 3, seed: int = 0) -> Inputs:
    g = torch.Generator().manual_seed(seed)
    values = {}
    for name, spec in d.inputs.items():
        shape = [rows if a == "rows" else d.axes[a].value for a in spec.shape]
        values[name] = torch.randn(shape, generator=g) + (1.0 if name in ("weight", "gamma") else 0.0)
    return Inputs(d.name, "small", seed, None, values, {"rows": rows, "hidden": 8})


def run_on_cpu(d: Definition, x: Inputs) -> tuple:
    gt = get_ground_truth("flashinfer", d, device="cuda")  # capability faked: the pipeline passes
    return gt, dataclasses.replace(gt, device="cpu")(x)


def reason(d: Definition, device: str = "cuda") -> GroundTruthUnavailable:
    with pytest.raises(GroundTruthUnavailable) as exc:
        get_ground_truth("flashinfer", d, device=device)
    return exc.value


def gemma(**input_extra) -> Definition:
    return definition("gemma_rmsnorm_h8", "gemma_rmsnorm", "flashinfer.norm.gemma_rmsnorm",
                      {"hidden_states": tensor(**input_extra), "weight": tensor(["hidden"])},
                      {"output": tensor()})


def ref_norm(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), eps=eps) * w


# -- availability -----------------------------------------------------------------------------------
def test_a_sampler_found_by_its_tag_draws_per_row_from_repeated_rows(fake_flashinfer):
    # fi_trace's sampling_from_logits: one call gives one token per row; the comparison needs [batch, draws]
    fake_flashinfer("0.7.2.post1")
    d = Definition.model_validate({
        "name": "sampling_from_logits_v8", "op_type": "sampling",
        "tags": ["fi_api:flashinfer.norm.sampling_from_logits"],
        "axes": {"batch": {"type": "var"}, "vocab": {"type": "const", "value": 8}},
        "inputs": {"logits": {"shape": ["batch", "vocab"], "dtype": "float32"}},
        "outputs": {"samples": {"shape": ["batch"], "dtype": "int32"}},
        "reference": "import torch\n\ndef run(logits):\n    return logits.argmax(-1)\n"})
    logits = torch.full((2, 8), -30.0)
    logits[0, 3] = logits[1, 6] = 30.0  # each row all but certain of one token
    gt = get_ground_truth("flashinfer", d, device="cuda")
    assert gt.kind == "sampler"
    (samples,) = dataclasses.replace(gt, device="cpu")(Inputs(d.name, "small", 0, None, {"logits": logits},
                                                             {"batch": 2, "vocab": 8}), draws=300)
    assert samples.shape == (2, 300) and samples.dtype == torch.int64
    assert samples[0].eq(3).all() and samples[1].eq(6).all()
    calls = sys.modules["flashinfer.norm"].calls
    assert calls == [("sampling_from_logits", (256, 8)), ("sampling_from_logits", (44, 8))] * 2


def test_a_kernel_refusing_this_gpu_is_arch_unsupported_and_other_raises_stay_errors(fake_flashinfer):
    fake_flashinfer("0.7.2.post1")
    d = definition("bw", "thing", "flashinfer.norm.blackwell_only", {"input": tensor()}, {"out": tensor()})
    gt = get_ground_truth("flashinfer", d, device="cuda")
    with pytest.raises(GroundTruthUnavailable) as exc:
        dataclasses.replace(gt, device="cpu")(inputs_for(d))
    assert exc.value.kind == "arch-unsupported"
    assert "flashinfer.norm.blackwell_only: BackendSupportedError: blackwell_only does not support compute " \
           "capability 90" in exc.value.detail
    d = definition("pk", "thing", "flashinfer.norm.picky", {"input": tensor()}, {"out": tensor()})
    with pytest.raises(ValueError, match="contract"):  # not about the GPU: an error of the check, as before
        run_on_cpu(d, inputs_for(d))



def test_a_file_tagged_for_other_archs_is_arch_unsupported_on_its_flashinfer_path(fake_flashinfer):
    """FlashInfer's traced files name the archs their kernel runs on ("arch:sm100", "arch:sm100_sm103",
    "arch:sm90a"): on another GPU the FlashInfer path is an arch skip, before a kernel refuses it in words that may
    not name the arch; a file without such tags, or a tag of this GPU, runs."""
    from flashinfer_trace.groundtruth.base import tagged_archs

    fake_flashinfer("0.7.2.post1")
    d = definition("bw_tagged", "thing", "flashinfer.norm.rmsnorm", {"input": tensor(), "weight": tensor(["hidden"])},
                   {"out": tensor()})
    assert tagged_archs(d) == set() and get_ground_truth("flashinfer", d, device="cuda").api
    bw = d.model_copy(update={"tags": [*d.tags, "arch:sm100_sm103", "arch:sm107", "arch:gpu-x"]})
    assert tagged_archs(bw) == {(10, 0), (10, 3), (10, 7)}
    why = reason(bw)
    assert why.kind == "arch-unsupported"
    assert "tagged for sm100, sm103, sm107 (its `arch:` tags), have sm90" in why.detail
    hopper = d.model_copy(update={"tags": [*d.tags, "arch:sm90a"]})
    assert tagged_archs(hopper) == {(9, 0)} and get_ground_truth("flashinfer", hopper, device="cuda").api


def test_attribute_missing_in_one_version_is_api_missing_naming_it(fake_flashinfer):
    fake_flashinfer("0.6.6")
    e = reason(gemma(param="input"))
    assert e.kind == "api-missing"
    assert e.detail == "flashinfer.norm.gemma_rmsnorm absent in flashinfer 0.6.6 (flashinfer.norm has no " \
                       "attribute 'gemma_rmsnorm')"


def test_present_in_the_next_version_resolves_and_runs(fake_flashinfer):
    fake_flashinfer("0.7.2.post1", gemma=True)
    d = gemma(param="input")
    x = inputs_for(d)
    gt, (out,) = run_on_cpu(d, x)
    assert gt.api == "fi_api:flashinfer.norm.gemma_rmsnorm" and gt.version == Version("0.7.2.post1")
    torch.testing.assert_close(out, ref_norm(x.values["hidden_states"], x.values["weight"] + 1, 1e-6))


def test_missing_module_is_api_missing(fake_flashinfer):
    fake_flashinfer("0.6.6")
    d = definition("x", "thing", "flashinfer.quantization.fp8_quantize", {"input": tensor()}, {"out": tensor()})
    e = reason(d)
    assert e.kind == "api-missing" and "flashinfer.quantization.fp8_quantize absent in flashinfer 0.6.6" in e.detail
    assert "flashinfer has no attribute 'quantization'" in e.detail


def test_not_installed(fake_flashinfer, monkeypatch):
    monkeypatch.setattr(base, "installed_version", lambda package: None)
    e = reason(gemma(param="input"))
    assert str(e) == "not-installed: flashinfer"


def test_input_name_that_is_no_parameter_is_a_signature_mismatch(fake_flashinfer):
    fake_flashinfer("0.7.2", gemma=True)
    e = reason(gemma())  # hidden_states, but the API's parameter is `input`
    assert e.kind == "api-missing"
    assert e.detail == ("signature mismatch: flashinfer 0.7.2 flashinfer.norm.gemma_rmsnorm(input, weight, eps, out, "
                        "enable_pdl) takes no parameter hidden_states (input hidden_states)")


def test_required_parameter_no_input_gives_is_a_signature_mismatch(fake_flashinfer):
    fake_flashinfer("0.7.2", gemma=True)
    d = definition("g", "gemma_rmsnorm", "flashinfer.norm.gemma_rmsnorm", {"input": tensor()}, {"output": tensor()})
    e = reason(d)
    assert e.kind == "api-missing" and e.detail.endswith("needs weight, which no input of g gives")


def test_wrapper_method_and_non_flashinfer_tags_are_unsupported(fake_flashinfer):
    fake_flashinfer("0.7.2")
    d = definition("w", "paged", "flashinfer.PagedWrapper.run", {"q": tensor()}, {"out": tensor()})
    e = reason(d)
    assert e.kind == "unsupported" and "method of the wrapper class PagedWrapper" in e.detail
    d = definition("t", "paged", "torch.add", {"input": tensor()}, {"out": tensor()})
    assert "not a dotted flashinfer.* name" in reason(d).detail


def test_no_tag_no_fallback(fake_flashinfer):
    fake_flashinfer("0.7.2")
    d = gemma(param="input").model_copy(update={"tags": []})
    assert fi_api.adapters(d) == []
    assert str(reason(d)) == "unsupported: no flashinfer ground truth for op_type 'gemma_rmsnorm'"


# -- order: hand-written first ----------------------------------------------------------------------
RMS_REF = "import torch\n\nEPS = 1e-5\n\ndef run(input, weight):\n    return input\n"


def test_hand_written_adapter_is_preferred(fake_flashinfer):
    fake_flashinfer("0.7.2")
    d = definition("rmsnorm_h8", "rmsnorm", "flashinfer.norm.rmsnorm",
                   {"hidden_states": tensor(dtype="bfloat16"), "weight": tensor(["hidden"], dtype="bfloat16")},
                   {"output": tensor(dtype="bfloat16")}, RMS_REF.replace("input", "hidden_states"))
    assert get_ground_truth("flashinfer", d, device="cuda").api == "flashinfer.norm.rmsnorm"
    # one that applies but cannot run here (float32) is the reason: the tag is no way around it
    d32 = Definition.model_validate({**d.as_dict, "inputs": {"hidden_states": tensor(), "weight": tensor(["hidden"])}})
    assert reason(d32).kind == "dtype-unsupported"


def test_fallback_where_no_hand_written_adapter_applies_passes_the_declared_eps(fake_flashinfer):
    """Upstream's names (input, not hidden_states): the hand-written rmsnorm adapter does not apply, the
    tag's API does, and the declared param:eps=1e-05 reaches it as eps= (not the API's 1e-6 default)."""
    fake_flashinfer("0.7.2")
    d = definition("rmsnorm_h8", "rmsnorm", "flashinfer.norm.rmsnorm",
                   {"input": tensor(), "weight": tensor(["hidden"])}, {"output": tensor()}, RMS_REF, eps=1e-5)
    x = inputs_for(d)
    gt, (out,) = run_on_cpu(d, x)
    assert gt.api == "fi_api:flashinfer.norm.rmsnorm"
    assert sys.modules["flashinfer.norm"].calls == [("rmsnorm", 1e-5)]
    torch.testing.assert_close(out, ref_norm(x.values["input"], x.values["weight"], 1e-5))


def test_an_eps_nothing_declares_is_unsupported_whatever_the_reference_says(fake_flashinfer):
    """RMS_REF sets EPS = 1e-5: that is the code under judgement, so it is not passed; neither is the API's
    default taken for the model's."""
    fake_flashinfer("0.7.2")
    d = definition("rmsnorm_h8", "rmsnorm", "flashinfer.norm.rmsnorm",
                   {"input": tensor(), "weight": tensor(["hidden"])}, {"output": tensor()}, RMS_REF, eps=None)
    assert "declares no eps: flashinfer.norm.rmsnorm takes eps=" in str(reason(d))


# -- outputs ----------------------------------------------------------------------------------------
def fused(outputs: dict, api: str = "flashinfer.norm.fused_add_rmsnorm") -> Definition:
    return definition("fused_h8", "fused_norm", api,
                      {"input": tensor(), "residual": tensor(), "weight": tensor(["hidden"])}, outputs)


def test_in_place_outputs_are_read_from_clones_of_the_inputs(fake_flashinfer):
    """`output` is written into parameter `input`; `residual` is an input listed as an output."""
    fake_flashinfer("0.7.2")
    d = fused({"output": tensor(param="input"), "residual": tensor()})
    x = inputs_for(d)
    before = {k: v.clone() for k, v in x.values.items()}
    _, (out, residual) = run_on_cpu(d, x)
    s = before["input"] + before["residual"]
    torch.testing.assert_close(residual, s)
    torch.testing.assert_close(out, ref_norm(s, before["weight"], 1e-6))
    for k, v in x.values.items():  # the caller's tensors are untouched
        assert torch.equal(v, before[k]), k


def test_returned_and_in_place_outputs_keep_the_definition_order(fake_flashinfer):
    fake_flashinfer("0.7.2")
    d = fused({"residual": tensor(), "normed": tensor()}, "flashinfer.norm.add_and_norm")
    x = inputs_for(d)
    _, (residual, normed) = run_on_cpu(d, x)
    s = x.values["input"] + x.values["residual"]
    torch.testing.assert_close(residual, s)
    torch.testing.assert_close(normed, ref_norm(s, x.values["weight"], 1e-6))


def test_more_outputs_than_the_api_gives_is_a_precise_reason(fake_flashinfer):
    fake_flashinfer("0.7.2")
    d = fused({"output": tensor(), "residual_out": tensor()})  # names the kernel does not write
    gt = get_ground_truth("flashinfer", d, device="cuda")
    with pytest.raises(GroundTruthUnavailable) as exc:
        dataclasses.replace(gt, device="cpu")(inputs_for(d))
    assert str(exc.value) == ("unsupported: flashinfer.norm.fused_add_rmsnorm returned 0 value(s); fused_h8 reads "
                              "2 output(s) from its return value (output, residual_out)")


def test_output_param_the_api_does_not_take(fake_flashinfer):
    fake_flashinfer("0.7.2")
    e = reason(fused({"output": tensor(param="result")}))
    assert e.kind == "api-missing" and "output output is written into result" in e.detail


def test_tuple_parameter_from_tuple_idx(fake_flashinfer):
    fake_flashinfer("0.7.2")
    d = definition("kv", "kv_sum", "flashinfer.norm.kv_sum",
                   {"q": tensor(), "k": tensor(param="paged_kv_cache", tuple_idx=0),
                    "v": tensor(param="paged_kv_cache", tuple_idx=1)}, {"out": tensor()})
    x = inputs_for(d)
    _, (out,) = run_on_cpu(d, x)
    torch.testing.assert_close(out, x.values["q"] + x.values["k"] - x.values["v"])
    bad = definition("kv", "kv_sum", "flashinfer.norm.kv_sum",
                     {"q": tensor(), "k": tensor(param="paged_kv_cache", tuple_idx=0),
                      "v": tensor(param="paged_kv_cache", tuple_idx=2)}, {"out": tensor()})
    assert "has items [0, 2], not 0..1" in reason(bad).detail
