"""Ground truths: why one cannot run here (in REASON_KINDS order), the FlashInfer and SGLang adapters'
plumbing against fake packages on the CPU, the torch ground truth's independence from the
references, and the semantics every adapter reads off a definition."""

from __future__ import annotations

import dataclasses
import pickle
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from packaging.version import Version
from samples import REPRESENTATIVES, VALID

from flashinfer_trace import semantics as sem
from flashinfer_trace.dataset import load_definition, load_path
from flashinfer_trace.definition import Definition
from flashinfer_trace.groundtruth import (
    GroundTruth,
    GroundTruthUnavailable,
    adapters_for,
    base,
    get_ground_truth,
    ground_truths,
)
from flashinfer_trace.groundtruth import flashinfer as fi_adapters
from flashinfer_trace.inputs import edge_cases, generate_inputs
from flashinfer_trace.testing import run_reference
from flashinfer_trace.verdict.compare import Mismatch, assert_close, tolerance_for

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "definitions"


# -- small definitions ------------------------------------------------------------------------------
def rmsnorm(eps: float = 1e-5, dtype: str = "bfloat16") -> Definition:
    """VALID with `eps` declared by its param tag (the ground truths' source) and written in its reference."""
    data = {**VALID, "reference": VALID["reference"].replace("EPS = 1e-5", f"EPS = {eps!r}")}
    data["tags"] = [t for t in VALID["tags"] if not t.startswith("param:")] + [f"param:eps={eps!r}"]
    data["inputs"] = {k: {**v, "dtype": dtype} for k, v in VALID["inputs"].items()}
    data["outputs"] = {k: {**v, "dtype": dtype} for k, v in VALID["outputs"].items()}
    return Definition.model_validate(data)


FUSED_REFERENCE = """import torch

EPS = {eps!r}


@torch.no_grad()
def run(hidden_states, residual, weight):
    s = hidden_states.to(torch.float32) + residual.to(torch.float32)
    residual_out = s.to(residual.dtype)
    inv_rms = torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return (s * inv_rms * weight.to(torch.float32)).to(hidden_states.dtype), residual_out
"""


def fused_rmsnorm(eps: float = 1e-5) -> Definition:
    row = {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16"}
    return Definition.model_validate({
        "name": "fused_add_rmsnorm_h8", "op_type": "rmsnorm", "tags": [f"param:eps={eps!r}"],
        "axes": {"batch_size": {"type": "var"}, "hidden_size": {"type": "const", "value": 8}},
        "inputs": {"hidden_states": row, "residual": row, "weight": {"shape": ["hidden_size"], "dtype": "bfloat16"}},
        "outputs": {"output": row, "residual_out": row},
        "reference": FUSED_REFERENCE.format(eps=eps),
    })


def gemm(dtype: str) -> Definition:
    return Definition.model_validate({
        "name": f"gemm_{dtype}_n8_k8", "op_type": "gemm",
        "axes": {"M": {"type": "var"}, "N": {"type": "const", "value": 8}, "K": {"type": "const", "value": 8}},
        "inputs": {"A": {"shape": ["M", "K"], "dtype": dtype}, "B": {"shape": ["N", "K"], "dtype": dtype}},
        "outputs": {"C": {"shape": ["M", "N"], "dtype": dtype}},
        "reference": "import torch\n\n\ndef run(A, B):\n    return torch.matmul(A, B.T)\n",
    })


def named(name: str, inputs: tuple[str, ...] = (), tags: tuple[str, ...] = (), reference: str | None = None,
          const: dict[str, int] | None = None) -> Definition:
    axes = {"n": {"type": "var"}, **{k: {"type": "const", "value": v} for k, v in (const or {}).items()}}
    return Definition.model_validate({
        "name": name, "op_type": "x", "tags": list(tags), "axes": axes,
        "inputs": {i: {"shape": ["n"], "dtype": "int32"} for i in inputs} or {"x": {"shape": ["n"], "dtype": "int32"}},
        "outputs": {"y": {"shape": ["n"], "dtype": "int32"}},
        "reference": reference or "def run(*args):\n    return None\n",
    })


def moe_definition() -> Definition:
    (path,) = sorted((SHIPPED / "moe").glob("moe_fp8_block_scale_ds_routing_*.json"))
    return load_definition(path)


# -- (a) nothing installed --------------------------------------------------------------------------
def test_flashinfer_not_installed():
    with pytest.raises(GroundTruthUnavailable) as exc:
        get_ground_truth("flashinfer", rmsnorm(), device="cpu")
    assert str(exc.value).startswith("not-installed: flashinfer")
    assert exc.value.kind == "not-installed"


def test_sglang_not_installed_and_unsupported_op_type():
    with pytest.raises(GroundTruthUnavailable) as exc:
        get_ground_truth("sglang", rmsnorm(), device="cpu")
    assert str(exc.value).startswith("not-installed: sgl_kernel")
    with pytest.raises(GroundTruthUnavailable) as exc:
        get_ground_truth("sglang", gemm("bfloat16"), device="cpu")
    assert str(exc.value) == "unsupported: no sglang ground truth for op_type 'gemm'"
    assert exc.value.kind == "unsupported"


def test_unknown_source_is_a_value_error():
    with pytest.raises(ValueError, match="unknown ground-truth source 'triton'"):
        get_ground_truth("triton", rmsnorm(), device="cpu")


def test_ground_truths_lists_every_source():
    out = ground_truths(rmsnorm(), device="cpu")
    assert list(out) == ["flashinfer", "sglang", "torch"]
    assert isinstance(out["flashinfer"], GroundTruthUnavailable)
    assert isinstance(out["sglang"], GroundTruthUnavailable)
    assert isinstance(out["torch"], GroundTruth) and out["torch"].source == "torch"
    assert out["torch"].describe() == {"source": "torch", "api": out["torch"].api, "version": None, "device": "cpu"}


def test_ground_truth_by_name_loads_the_definition():
    gt = get_ground_truth("torch", "rmsnorm_h4096", device="cpu")
    assert gt.definition.name == "rmsnorm_h4096"


def test_unavailable_reason_kinds_and_pickling():
    e = GroundTruthUnavailable("arch-unsupported", "needs sm100")
    copy = pickle.loads(pickle.dumps(e))
    assert (copy.kind, copy.detail, str(copy)) == ("arch-unsupported", "needs sm100", "arch-unsupported: needs sm100")
    assert GroundTruthUnavailable("api-missing", "x").progress < e.progress
    with pytest.raises(ValueError, match="unknown reason kind"):
        GroundTruthUnavailable("broken", "x")


def test_adapters_are_in_source_preference_order():
    sources = [a.source for a in adapters_for("rmsnorm")]
    assert sources == sorted(sources, key=["flashinfer", "sglang", "torch"].index)
    assert {a.source for a in adapters_for("rmsnorm", "torch")} == {"torch"}


# -- (b) version, dtype, device and arch gating with a fake flashinfer -----------------------------
def ns(**attrs):
    return types.SimpleNamespace(**attrs)


def fake_package(monkeypatch, name: str, version: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__version__ = version
    for k, v in attrs.items():
        setattr(module, k, v)
    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(base, "installed_version", lambda package: Version(version))
    monkeypatch.setattr(base, "_imported", {})
    return module


def unavailable(source: str, d: Definition, device: str) -> GroundTruthUnavailable:
    with pytest.raises(GroundTruthUnavailable) as exc:
        get_ground_truth(source, d, device=device)
    return exc.value


def test_old_flashinfer_without_gemm_apis_is_api_missing(monkeypatch):
    fake_package(monkeypatch, "flashinfer", "0.5.3", gemm=ns())
    e = unavailable("flashinfer", gemm("bfloat16"), "cuda")
    assert e.kind == "api-missing" and "0.5.3" in str(e)


def test_fp16_gemm_where_only_mm_bf16_exists_is_dtype_unsupported(monkeypatch):
    fake_package(monkeypatch, "flashinfer", "0.6.18", mm_bf16=lambda *a, **k: None, gemm=ns())
    e = unavailable("flashinfer", gemm("float16"), "cuda")
    assert e.kind == "dtype-unsupported"
    assert "float16" in e.detail and "mm_bf16" in e.detail


def test_everything_present_on_cpu_is_no_gpu(monkeypatch):
    fake_package(monkeypatch, "flashinfer", "0.6.0", norm=ns(rmsnorm=lambda *a, **k: None))
    e = unavailable("flashinfer", rmsnorm(), "cpu")
    assert e.kind == "no-gpu" and str(e).startswith("no-gpu: flashinfer.norm.rmsnorm needs a CUDA device")


def test_moe_on_sm90_without_cutlass_is_arch_unsupported(monkeypatch):
    fake_package(monkeypatch, "flashinfer", "0.6.0", fused_moe=ns(trtllm_fp8_block_scale_moe=lambda **k: None))
    monkeypatch.setattr(base, "cuda_capability", lambda device: (9, 0))
    e = unavailable("flashinfer", moe_definition(), "cuda")
    assert e.kind == "arch-unsupported"
    assert str(e) == ("arch-unsupported: flashinfer.fused_moe.trtllm_fp8_block_scale_moe needs sm100..sm103, "
                      "have sm90")


def test_moe_on_sm90_with_cutlass_is_available(monkeypatch):
    fake_package(monkeypatch, "flashinfer", "0.6.0",
                 fused_moe=ns(trtllm_fp8_block_scale_moe=lambda **k: None, cutlass_fused_moe=lambda *a, **k: None))
    monkeypatch.setattr(base, "cuda_capability", lambda device: (9, 0))
    gt = get_ground_truth("flashinfer", moe_definition(), device="cuda")
    assert gt.api.startswith("flashinfer.fused_moe.cutlass_fused_moe") and gt.version == Version("0.6.0")
    # the trtllm path stays visible in every record: arch-gated on sm90, passed over for the cutlass kernel
    assert gt.describe()["passed_over"] == [{"api": "flashinfer.fused_moe.trtllm_fp8_block_scale_moe", "reason":
                                             "arch-unsupported: flashinfer.fused_moe.trtllm_fp8_block_scale_moe "
                                             "needs sm100..sm103, have sm90"}]
    assert "passed_over" not in get_ground_truth("torch", moe_definition(), device="cpu").describe()


def test_moe_variants_on_sm90(monkeypatch):
    """Renormalize routing goes through the same cutlass kernel (routing supplied by the adapter); bf16
    experts have no kernel adapter, and the reason says so."""
    fake_package(monkeypatch, "flashinfer", "0.6.0",
                 fused_moe=ns(trtllm_fp8_block_scale_moe=lambda **k: None, cutlass_fused_moe=lambda *a, **k: None))
    monkeypatch.setattr(base, "cuda_capability", lambda device: (9, 0))
    renorm = load_definition(next((SHIPPED / "moe").glob("moe_fp8_block_scale_renorm_*.json")))
    assert get_ground_truth("flashinfer", renorm, device="cuda").api.startswith("flashinfer.fused_moe.cutlass")
    bf16 = load_definition(next((SHIPPED / "moe").glob("moe_bf16_renorm_*.json")))
    e = unavailable("flashinfer", bf16, "cuda")
    assert e.kind == "unsupported" and "unquantised experts" in str(e)
    assert get_ground_truth("torch", bf16, device="cpu").api.startswith("dequantise + routing")


def test_import_failure_is_the_reason(monkeypatch):
    fake_package(monkeypatch, "flashinfer", "0.6.0")

    def broken(name, *args, **kwargs):
        raise AssertionError("Torch not compiled with CUDA enabled")

    monkeypatch.setattr(base.importlib, "import_module", broken)
    e = unavailable("flashinfer", rmsnorm(), "cuda")
    assert str(e) == "import-failed: AssertionError: Torch not compiled with CUDA enabled"
    # remembered: a second lookup does not import again
    monkeypatch.setattr(base.importlib, "import_module", lambda *a, **k: pytest.fail("imported twice"))
    assert str(unavailable("flashinfer", rmsnorm(), "cuda")) == str(e)


def test_module_without_version_falls_back_to_the_distribution(monkeypatch):
    module = fake_package(monkeypatch, "flashinfer", "0.5.3", gemm=ns())
    del module.__version__
    e = unavailable("flashinfer", gemm("bfloat16"), "cuda")
    assert e.kind == "api-missing" and "0.5.3" in str(e)


# -- (c) adapters against fakes, on the CPU --------------------------------------------------------
def torch_rmsnorm(x, w, eps):
    x32 = x.to(torch.float32)
    return (F.rms_norm(x32, (x.shape[-1],), eps=eps) * w.to(torch.float32)).to(x.dtype)


class Recorder:
    """Fake norm kernels that record the eps they were given."""

    def __init__(self):
        self.eps: list[float] = []

    def rmsnorm(self, x, w, eps=1e-6):
        self.eps.append(eps)
        return torch_rmsnorm(x, w, eps)

    def fused_add_rmsnorm(self, x, r, w, eps=1e-6):
        """In place like the kernels: r <- x + r, x <- norm(x + r) * w."""
        self.eps.append(eps)
        s = x.to(torch.float32) + r.to(torch.float32)
        r.copy_(s)
        x.copy_(F.rms_norm(s, (s.shape[-1],), eps=eps) * w.to(torch.float32))


def on_cpu(gt: GroundTruth) -> GroundTruth:
    """The adapter found for "cuda" (capability faked), run on CPU tensors."""
    return dataclasses.replace(gt, device="cpu")


@pytest.fixture
def sm90(monkeypatch):
    monkeypatch.setattr(base, "cuda_capability", lambda device: (9, 0) if str(device).startswith("cuda") else None)


def fake_flashinfer(monkeypatch, rec: Recorder):
    return fake_package(monkeypatch, "flashinfer", "0.6.0",
                        norm=ns(rmsnorm=rec.rmsnorm, fused_add_rmsnorm=rec.fused_add_rmsnorm))


def fake_sgl_kernel(monkeypatch, rec: Recorder):
    return fake_package(monkeypatch, "sgl_kernel", "0.3.21", rmsnorm=rec.rmsnorm,
                        fused_add_rmsnorm=rec.fused_add_rmsnorm)


@pytest.mark.parametrize("source, fake, api", [
    ("flashinfer", fake_flashinfer, "flashinfer.norm.rmsnorm"),
    ("sglang", fake_sgl_kernel, "sgl_kernel.rmsnorm"),
])
def test_rmsnorm_adapter_passes_the_declared_eps(monkeypatch, sm90, source, fake, api):
    rec = Recorder()
    fake(monkeypatch, rec)
    d = rmsnorm(eps=1e-3)
    gt = get_ground_truth(source, d, device="cuda")
    assert gt.api == api and gt.version is not None
    x = generate_inputs(d, "small", seed=0)
    before = {k: v.clone() for k, v in x.values.items()}
    (out,) = on_cpu(gt)(x)
    assert rec.eps == [1e-3]
    assert_close(run_reference(d, x), (out,), tolerance=tolerance_for(d))
    assert all(torch.equal(before[k], x.values[k]) for k in before)


@pytest.mark.parametrize("source, fake, api", [
    ("flashinfer", fake_flashinfer, "flashinfer.norm.fused_add_rmsnorm"),
    ("sglang", fake_sgl_kernel, "sgl_kernel.fused_add_rmsnorm"),
])
def test_fused_adapter_returns_both_outputs_and_leaves_inputs_alone(monkeypatch, sm90, source, fake, api):
    rec = Recorder()
    fake(monkeypatch, rec)
    d = fused_rmsnorm(eps=1e-2)
    gt = get_ground_truth(source, d, device="cuda")
    assert gt.api == api
    x = generate_inputs(d, "small", seed=1)
    before = {k: v.clone() for k, v in x.values.items()}
    out, residual = on_cpu(gt)(x)
    assert rec.eps == [1e-2]
    for k in before:
        assert torch.equal(before[k], x.values[k]), f"the adapter wrote into the caller's {k}"
    expected_residual = (before["hidden_states"].float() + before["residual"].float()).to(torch.bfloat16)
    assert torch.equal(residual, expected_residual)
    assert_close(run_reference(d, x), (out, residual), tolerance=tolerance_for(d), names=list(d.outputs))


def test_fused_adapter_with_a_single_output_definition(monkeypatch, sm90):
    rec = Recorder()
    fake_flashinfer(monkeypatch, rec)
    data = fused_rmsnorm().as_dict
    data = {**data, "outputs": {"output": data["outputs"]["output"]},
            "reference": data["reference"].replace(", residual_out\n", "\n")}
    d = Definition.model_validate(data)
    out = on_cpu(get_ground_truth("flashinfer", d, device="cuda"))(generate_inputs(d, "small", seed=0))
    assert len(out) == 1 and out[0].shape == (4, 8)


def test_fp32_rmsnorm_is_not_given_to_the_half_precision_kernels(monkeypatch, sm90):
    fake_flashinfer(monkeypatch, Recorder())
    e = unavailable("flashinfer", rmsnorm(dtype="float32"), "cuda")
    assert e.kind == "dtype-unsupported" and "float32" in e.detail


class WithBackend:
    def __init__(self, workspace, layout="NHD", backend="auto"):
        pass


class WithoutBackend:
    def __init__(self, workspace, layout="NHD"):
        pass


class OnlyKwargs:
    def __init__(self, workspace, **kwargs):
        pass


def test_keywords_pass_only_declared_parameters():
    assert fi_adapters._fa2(WithBackend) == {"backend": "fa2"}
    assert fi_adapters._fa2(WithoutBackend) == {}
    assert fi_adapters._fa2(OnlyKwargs) == {}  # **kwargs may swallow it silently: not passed

    def run(q, kv, *, return_lse=False, lse_base="e"):
        return None

    assert fi_adapters.keywords(run, lse_base="log2", return_lse_base_on_e=False, q=1) == \
        {"lse_base": "log2", "q": 1}
    assert fi_adapters.accepts(run, "return_lse") and not fi_adapters.accepts(run, "backend")


def test_keywords_on_an_uninspectable_callable_pass_nothing():
    class Opaque:
        __signature__ = "not a signature"

        def __call__(self):
            pass

    assert fi_adapters.keywords(Opaque(), backend="fa2") == {}


def decode_definition() -> Definition:
    row = ["batch_size", "num_qo_heads", "head_dim"]
    cache = ["num_pages", "page_size", "num_kv_heads", "head_dim"]
    return Definition.model_validate({
        "name": "gqa_paged_decode_h4_kv2_d16_ps1", "op_type": "gqa_paged", "tags": ["stage:decode"],
        "axes": {"batch_size": {"type": "var"}, "num_pages": {"type": "var"}, "len_indptr": {"type": "var"},
                 "num_kv_indices": {"type": "var"}, "num_qo_heads": {"type": "const", "value": 4},
                 "num_kv_heads": {"type": "const", "value": 2}, "head_dim": {"type": "const", "value": 16},
                 "page_size": {"type": "const", "value": 1}},
        "constraints": ["len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"],
        "inputs": {"q": {"shape": row, "dtype": "bfloat16"}, "k_cache": {"shape": cache, "dtype": "bfloat16"},
                   "v_cache": {"shape": cache, "dtype": "bfloat16"},
                   "kv_indptr": {"shape": ["len_indptr"], "dtype": "int32"},
                   "kv_indices": {"shape": ["num_kv_indices"], "dtype": "int32"},
                   "sm_scale": {"shape": None, "dtype": "float32"}},
        "outputs": {"output": {"shape": row, "dtype": "bfloat16"},
                    "lse": {"shape": ["batch_size", "num_qo_heads"], "dtype": "float32"}},
        "reference": "def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):\n    return None\n",
    })


@pytest.mark.parametrize("with_backend", [True, False])
def test_decode_adapter_pins_fa2_only_where_declared_and_names_dtypes(monkeypatch, sm90, with_backend):
    seen: dict = {}

    class Wrapper:
        def __init__(self, workspace, layout, **kw):
            seen["init"] = (layout, kw)

        def plan(self, indptr, indices, last, hq, hk, d, page, q_data_type=None, kv_data_type=None, sm_scale=None):
            seen["plan"] = dict(indptr=indptr, last=last, heads=(hq, hk, d, page), q=q_data_type,
                                kv=kv_data_type, sm_scale=sm_scale)

        def run(self, q, kv, return_lse=False):
            seen["run"] = return_lse
            return torch.zeros_like(q), torch.zeros(q.shape[:2])

    if with_backend:
        def init(self, workspace, layout, backend="auto"):
            seen["init"] = (layout, {"backend": backend})

        Wrapper.__init__ = init
    fake_package(monkeypatch, "flashinfer", "0.6.0", decode=ns(BatchDecodeWithPagedKVCacheWrapper=Wrapper))
    d = decode_definition()
    gt = get_ground_truth("flashinfer", d, device="cuda")
    x = generate_inputs(d, "small", seed=0)
    out, lse = on_cpu(gt)(x)
    assert out.shape == x.values["q"].shape and lse.shape == x.values["q"].shape[:2]
    assert seen["init"] == ("NHD", {"backend": "fa2"} if with_backend else {})
    plan = seen["plan"]
    assert plan["q"] == torch.bfloat16 and plan["kv"] == torch.bfloat16
    assert plan["sm_scale"] == pytest.approx(float(x.values["sm_scale"]))
    assert plan["heads"] == (4, 2, 16, 1) and seen["run"] is True
    pages = x.values["kv_indptr"][1:] - x.values["kv_indptr"][:-1]
    assert plan["last"].tolist() == torch.where(pages > 0, 1, 0).tolist()


# -- (d) the torch ground truth is independent of the references -----------------------------------
SHIPPED_EXACT = sorted(p for p in SHIPPED.rglob("*.json")
                       if p.stem in REPRESENTATIVES and p.parent.name not in ("moe", "sampling"))


@pytest.mark.parametrize("path", SHIPPED_EXACT, ids=lambda p: p.stem)
def test_torch_ground_truth_agrees_with_shipped_reference(path):
    d = load_path(path)
    x = generate_inputs(d, "small", seed=3)
    expected = get_ground_truth("torch", d, device="cpu")(x)
    reports = assert_close(run_reference(d, x), expected, tolerance=tolerance_for(d), names=list(d.outputs))
    assert len(reports) == len(d.outputs)


def test_shipped_exact_definitions_cover_the_families():
    assert {p.parent.name for p in SHIPPED_EXACT} >= {"rmsnorm", "gemm", "gqa_paged", "gqa_ragged", "mla_paged",
                                                      "rope", "activation"}


def mutated(d: Definition, old: str, new: str) -> Definition:
    assert old in d.reference, f"{old!r} not in the reference of {d.name}"
    return Definition.model_validate({**d.as_dict, "reference": d.reference.replace(old, new)})


def test_a_reference_with_its_own_eps_is_detected_by_the_ground_truth():
    """The reference brings EPS = 1e-1 instead of the declared eps (the fp16 variant's input, rmsnorm_h4096's
    param:eps=1e-5 tag): the ground truth reads the declaration."""
    d = load_definition(SHIPPED / "rmsnorm" / "rmsnorm_h4096_fp16.json")
    bad = mutated(mutated(d, "+ eps)", "+ EPS)"), "import torch\n", "import torch\n\nEPS = 1e-1\n")
    x = generate_inputs(d, "small", seed=3)
    expected = get_ground_truth("torch", d, device="cpu")(x)
    with pytest.raises(Mismatch):
        assert_close(run_reference(bad, x), expected, tolerance=tolerance_for(d))
    d = load_definition(SHIPPED / "rmsnorm" / "rmsnorm_h4096.json")
    bad = mutated(d, "EPS = 1e-5", "EPS = 1e-1")
    x = generate_inputs(d, "small", seed=3)
    expected = get_ground_truth("torch", d, device="cpu")(x)
    with pytest.raises(Mismatch):
        assert_close(run_reference(bad, x), expected, tolerance=tolerance_for(d))


@pytest.mark.parametrize("path, old, new", [
    ("rmsnorm/rmsnorm_h4096.json", "+ EPS)", "+ 1e-1)"),
    ("rmsnorm/rmsnorm_h4096.json", "* weight.to(torch.float32)", ""),
    ("gqa_paged/gqa_paged_decode_h32_kv8_d128_ps1.json", "* sm_scale", "* sm_scale * 2"),
    ("rmsnorm/fused_add_rmsnorm_h4096.json", "inv_rms = torch.rsqrt(s.pow(2)",
     "inv_rms = torch.rsqrt(hidden_states.to(torch.float32).pow(2)"),
])
def test_mutated_reference_is_detected_by_its_own_ground_truth(path, old, new):
    # the ground truth reads EPS and sm_scale off the definition but never runs its reference
    bad = mutated(load_definition(SHIPPED / path), old, new)
    x = generate_inputs(bad, "small", seed=3)
    expected = get_ground_truth("torch", bad, device="cpu")(x)
    with pytest.raises(Mismatch):
        assert_close(run_reference(bad, x), expected, tolerance=tolerance_for(bad), names=list(bad.outputs))


# -- (e) semantics ----------------------------------------------------------------------------------
def test_last_page_lens():
    indptr = torch.tensor([0, 0, 2, 5], dtype=torch.int32)
    assert sem.last_page_lens(indptr, 4, None).tolist() == [0, 4, 4]
    assert sem.last_page_lens(indptr, 4, None).dtype == torch.int32
    given = torch.tensor([0, 3, 1], dtype=torch.int64)
    out = sem.last_page_lens(indptr, 4, given)
    assert out.tolist() == [0, 3, 1] and out.dtype == torch.int32


def test_request_token_slots():
    indptr = torch.tensor([0, 2, 2, 3])
    indices = torch.tensor([5, 1, 7], dtype=torch.int32)
    last = torch.tensor([2, 0, 3])
    slots = sem.request_token_slots(indptr, indices, 4, last)
    assert [s.tolist() for s in slots] == [[20, 21, 22, 23, 4, 5], [], [28, 29, 30]]


def test_request_token_slots_full_pages_with_page_size_one():
    indptr = torch.tensor([0, 3])
    indices = torch.tensor([9, 2, 4])
    slots = sem.request_token_slots(indptr, indices, 1, sem.last_page_lens(indptr, 1, None))
    assert [s.tolist() for s in slots] == [[9, 2, 4]]


def test_rope_is_neox():
    assert sem.rope_is_neox(named("rope_with_cos_sin_cache_neox_style_d8")) is True
    assert sem.rope_is_neox(named("rope_interleave_d8")) is False
    assert sem.rope_is_neox(named("rope_gptj_d8")) is False
    assert sem.rope_is_neox(named("rope_d8", tags=("param:is_neox=false",))) is False
    assert sem.rope_is_neox(named("rope_d8", tags=("param:is_neox=true",))) is True
    with pytest.raises(GroundTruthUnavailable) as exc:  # the reference's own IS_NEOX is what is judged, not read
        sem.rope_is_neox(named("rope_d8", reference="IS_NEOX = True\n\ndef run(x):\n    return x\n"))
    assert exc.value.kind == "unsupported" and "rope_d8" in str(exc.value)


def test_stage_and_is_causal():
    assert sem.stage(named("attn", ("q", "qo_indptr"))) == "prefill"
    assert sem.stage(named("attn", ("q",))) == "decode"
    assert sem.stage(named("attn", ("q", "qo_indptr"), tags=("stage:decode",))) == "decode"
    assert sem.is_causal(named("gqa_ragged_prefill_causal_h4", ("q", "qo_indptr"))) is True
    assert sem.is_causal(named("gqa_ragged_prefill_h4", ("q", "qo_indptr"))) is False
    assert sem.is_causal(named("gqa_paged_decode_causal_h4", ("q",))) is False  # decode sees every key
    assert sem.is_causal(named("gqa_ragged_prefill_noncausal_h4", ("q", "qo_indptr"))) is False


def test_eps_and_page_size():
    assert sem.eps(rmsnorm(eps=3e-4)) == 3e-4  # its param:eps tag
    with pytest.raises(GroundTruthUnavailable, match="declares no eps"):
        sem.eps(named("norm"))
    # the public dataset's forms, EPS in run() or a literal in the norm: the reference's, never read
    inside = "def run(x):\n    EPS = 1e-6\n    return x * (x.pow(2).mean(-1, keepdim=True) + EPS).rsqrt()\n"
    literal = "def run(x):\n    return x * (x.pow(2).mean(-1, keepdim=True) + 3e-6).rsqrt()\n"
    for reference in (inside, literal, "VARIANCE_EPSILON = 1e-6\n\ndef run(x):\n    return x\n"):
        with pytest.raises(GroundTruthUnavailable, match="declares no eps"):
            sem.eps(named("norm", reference=reference))
    with pytest.raises(GroundTruthUnavailable, match="is not a decimal number"):
        sem.eps(named("norm", tags=("param:eps=small",)))
    assert sem.page_size(named("p", const={"page_size": 16})) == 16
    assert sem.page_size(named("p")) == 1


def test_eps_constant_controls_the_torch_ground_truth():
    x = generate_inputs(rmsnorm(), "small", seed=0)
    a = get_ground_truth("torch", rmsnorm(eps=1e-5), device="cpu")(x)[0]
    b = get_ground_truth("torch", rmsnorm(eps=1.0), device="cpu")(x)[0]
    assert not torch.allclose(a, b, atol=1e-3)


def test_decode_is_checked_on_cuda_cores_and_tensor_cores_where_both_apply():
    from flashinfer_trace.groundtruth import flashinfer as fgt
    from flashinfer_trace.groundtruth import paths

    cuda_core, tensor_core = [a for a in fgt.ADAPTERS if a.api.startswith("flashinfer.decode.")]
    assert tensor_core.api.endswith("(use_tensor_cores=True)") and tensor_core.path == "tensor-cores"
    group8 = load_definition("gqa_paged_decode_h32_kv4_d128_ps1")
    assert cuda_core.applies(group8) is None and tensor_core.applies(group8) is None
    assert paths("flashinfer", group8) == [None, "plan-reuse", "graph", "tensor-cores", "tensor-cores+plan-reuse",
                                           "tensor-cores+graph"]
    for heads, kv in ((20, 4), (24, 4), (5, 1), (6, 1), (48, 8)):  # the public dataset's group sizes 5 and 6
        data = group8.model_dump(mode="json")
        data["axes"]["num_qo_heads"]["value"], data["axes"]["num_kv_heads"]["value"] = heads, kv
        d = type(group8).model_validate(data)
        assert f"no group size {heads // kv}" in cuda_core.applies(d) and tensor_core.applies(d) is None
        assert paths("flashinfer", d)[0] == "tensor-cores"  # only the tensor-core path runs it
    assert paths("torch", group8) == [None]


def _ragged_wrapper(with_vo: bool, seen: dict):
    class Wrapper:
        def __init__(self, buffer, layout, **kw):
            pass

        def _plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, **kw):
            seen.update(kw, heads=(num_qo_heads, num_kv_heads), qk=head_dim_qk)

        if with_vo:
            def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None, **kw):
                self._plan(qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=head_dim_vo, **kw)
        else:
            def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, **kw):
                self._plan(qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, **kw)

        def run(self, q, k, v, return_lse=True):
            return torch.zeros(*q.shape[:2], v.shape[-1], dtype=q.dtype), torch.zeros(q.shape[:2])

    return Wrapper


@pytest.mark.parametrize("with_vo", [True, False])
def test_mla_ragged_asks_flashinfer_for_the_value_head_dim(monkeypatch, sm90, with_vo):
    from flashinfer_trace.groundtruth import flashinfer as fgt

    seen: dict = {}
    fake_package(monkeypatch, "flashinfer", "0.6.6",
                 prefill=ns(BatchPrefillWithRaggedKVCacheWrapper=_ragged_wrapper(with_vo, seen)))
    monkeypatch.setattr(fgt, "workspace", lambda device: torch.empty(0))
    d = load_definition("mla_ragged_prefill_causal_h16_qk192_vo128")
    gt = get_ground_truth("flashinfer", d, device="cuda")
    assert gt.api.endswith("(head_dim_vo)")
    x = generate_inputs(d, "small", seed=0)
    if with_vo:
        out, _ = on_cpu(gt)(x)
        assert seen["head_dim_vo"] == 128 and seen["qk"] == 192 and seen["heads"] == (16, 16) and seen["causal"]
        assert tuple(out.shape[1:]) == (16, 128)
    else:
        with pytest.raises(GroundTruthUnavailable, match="has no head_dim_vo") as e:
            on_cpu(gt)(x)
        assert e.value.kind == "api-missing"


def test_a_moe_without_an_expert_offset_has_every_expert_local():
    """The public Qwen-style fp8 MoE files have no local_expert_offset: all their experts are local (and so has
    ours of the public name, which keeps the public contract)."""
    from flashinfer_trace.testing import assert_matches, run_reference, tolerance_for

    data = load_definition("moe_fp8_block_scale_renorm_topk8_e128_h2048_i768").model_dump(mode="json")
    assert "local_expert_offset" not in data["inputs"]
    d = Definition.model_validate(data)
    assert sem.moe_applies(d) is None and "no_local_tokens" not in edge_cases(d)
    x = generate_inputs(d, "small", seed=0)
    expected = get_ground_truth("torch", d, device="cpu")(x)
    assert_matches(d, x, run_reference(d, x), expected, tolerance_for(d))
    data["axes"]["num_experts"] = {"type": "const", "value": 128}
    data["inputs"]["routing_logits"]["shape"] = ["seq_len", "num_experts"]
    data["axes"]["num_local_experts"]["value"] = 64  # fewer weights than routed experts, and no offset
    fewer = Definition.model_validate(data)
    assert "cannot tell which are local" in sem.moe_applies(fewer)


def test_an_absent_softmax_scale_is_flashinfers_default():
    import math

    from flashinfer_trace import semantics as sem

    assert sem.sm_scale({"sm_scale": None}, 128) == 1 / math.sqrt(128)  # fi_trace's inits pass None
    assert sem.sm_scale({}, 576) == 1 / math.sqrt(576)
    assert sem.sm_scale({"sm_scale": torch.tensor(0.25)}, 128) == 0.25


def test_no_plain_rmsnorm_ground_truth_claims_a_gemma_norm():
    # fi_trace's gemma_rmsnorm scales by (weight + 1): a plain rmsnorm kernel or formula computes another
    # function (on the H100 FlashInfer's rmsnorm adapter took it and "failed" by a factor near 2)
    from flashinfer_trace.definition import Definition
    from flashinfer_trace.groundtruth import flashinfer as fi_gt
    from flashinfer_trace.groundtruth import sglang as sgl_gt
    from flashinfer_trace.groundtruth import torch_ref

    spec = {"shape": ["rows", "hidden"], "dtype": "bfloat16"}
    base = {"op_type": "rmsnorm", "axes": {"rows": {"type": "var"}, "hidden": {"type": "const", "value": 8}},
            "inputs": {"hidden_states": spec, "weight": {"shape": ["hidden"], "dtype": "bfloat16"}},
            "outputs": {"output": spec}, "reference": "def run(hidden_states, weight):\n    return hidden_states\n"}
    plain = Definition.model_validate({**base, "name": "rmsnorm_h8"})
    gemma = Definition.model_validate({**base, "name": "gemma_rmsnorm_h8",
                                       "tags": ["fi_api:flashinfer.norm.gemma_rmsnorm"]})
    norms = [a for m in (fi_gt, sgl_gt, torch_ref) for a in m.ADAPTERS
             if a.op_type == "rmsnorm" and "fused" not in a.api]
    assert len(norms) == 3
    for a in norms:
        assert a.applies(plain) is None
        assert "Gemma-style" in a.applies(gemma)


def test_asking_a_method_its_keywords_keeps_no_object_alive():
    """`keywords(wrapper.run, ...)` once cached the bound method, and with it every FlashInfer wrapper asked about
    and its device workspaces: 160 MiB a case, test processes of 25-47 GiB on an H200 (2026-11-28)."""
    import gc
    import weakref

    from flashinfer_trace.groundtruth.base import accepts, keywords

    class Wrapper:
        def run(self, q, *, enable_pdl=None):
            return q

    w = Wrapper()
    gone = weakref.ref(w)
    assert keywords(w.run, enable_pdl=True, backend="fa2") == {"enable_pdl": True}
    assert accepts(w.run, "q") and not accepts(w.run, "backend")
    del w
    gc.collect()
    assert gone() is None


def test_no_name_is_both_a_path_and_a_call_mode():
    """split_path reads a path named like a call mode as that mode of the plain path, so a family's mode named like
    another family's path hides that path (dequantize_fp4's mode `other-layout` made segment_gemm's `other-layout`
    path unsupported). Every path name and every mode name stay apart."""
    from flashinfer_trace.groundtruth import _ALL_MODES, ADAPTERS, modes, split_path

    named = {a.path for adapters in ADAPTERS.values() for a in adapters if a.path}
    assert not named & (_ALL_MODES | set(modes.GENERIC)), named & (_ALL_MODES | set(modes.GENERIC))
    assert all(split_path(p) == (p, None) for p in named)
