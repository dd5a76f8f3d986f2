"""The SGLang adapters against a fake `sglang` module tree on the CPU: which module each sglang release
resolves to, the exact arguments each adapter passes (layouts, token slots, scales, keywords), how
outputs come back (base-2 lse from the kernels' natural-log ones), and the precise skip reasons. The
fake attention kernels compute attention with plain torch math written here from the kernels'
contracts (token-slot KV, per-split natural-log LSE, prefix + causal extend), so the adapters'
end-to-end results are compared with the torch ground truth: a wrong slot mapping fails."""

from __future__ import annotations

import dataclasses
import math
import sys
import types
from pathlib import Path

import pytest
import torch
from packaging.version import Version

from flashinfer_trace.dataset import load_definition
from flashinfer_trace.definition import Definition
from flashinfer_trace.groundtruth import GroundTruthUnavailable, base, get_ground_truth
from flashinfer_trace.groundtruth import sglang as sgt
from flashinfer_trace.groundtruth import sglang_triton as st
from flashinfer_trace.inputs import generate_inputs
from flashinfer_trace.verdict.compare import Mismatch, assert_close, tolerance_for

SHIPPED = Path(__file__).resolve().parents[2] / "definitions"
NEW_DECODE = "sglang.kernels.ops.attention.decode_attention"
OLD_DECODE = "sglang.srt.layers.attention.triton_ops.decode_attention"
NEW_EXTEND = "sglang.kernels.ops.attention.extend_attention"
OLD_EXTEND = "sglang.srt.layers.attention.triton_ops.extend_attention"


def shipped(op_type: str, name: str) -> Definition:
    return load_definition(SHIPPED / op_type / f"{name}.json")


GQA_DECODE = "gqa_paged_decode_h8_kv1_d128_ps1"  # group size 8
GQA_PREFILL = "gqa_paged_prefill_causal_h8_kv1_d128_ps1"
GQA_RAGGED = "gqa_ragged_prefill_causal_h4_kv1_d128"
MLA_DECODE = "mla_paged_decode_h16_ckv512_kpe64_ps1"
MLA_PREFILL = "mla_paged_prefill_causal_h16_ckv512_kpe64_ps1"
MLA_RAGGED = "mla_ragged_prefill_causal_h16_qk192_vo128"


def paged(d: Definition, page: int) -> Definition:
    """The definition with page_size `page` and a kv_last_page_len input (partly filled last pages)."""
    data = d.model_dump(mode="json")
    data["name"] = data["name"].replace("_ps1", f"_ps{page}")
    data["axes"]["page_size"] = {**data["axes"]["page_size"], "value": page}
    inputs = dict(data["inputs"])
    sm = inputs.pop("sm_scale")
    rows = "batch_size" if "batch_size" in data["axes"] else "len_indptr"
    data["inputs"] = {**inputs, "kv_last_page_len": {"shape": [rows], "dtype": "int32"}, "sm_scale": sm}
    data["reference"] = f"def run({', '.join(data['inputs'])}):\n    return None\n"
    data["constraints"] = []
    return Definition.model_validate(data)


# -- the fake sglang tree --------------------------------------------------------------------------------
def install(monkeypatch, version: str | None, modules: dict[str, dict]) -> None:
    """A fake `sglang` distribution of `version` (None: not installed) whose modules are `modules`."""
    monkeypatch.setattr(base, "_imported", {})
    if version is None:
        monkeypatch.setattr(base, "installed_version", lambda package: None)
        return
    top = types.ModuleType("sglang")
    top.__version__ = version
    monkeypatch.setitem(sys.modules, "sglang", top)
    for path, attrs in modules.items():
        m = types.ModuleType(path)
        for k, v in attrs.items():
            setattr(m, k, v)
        monkeypatch.setitem(sys.modules, path, m)
    monkeypatch.setattr(base, "installed_version", lambda package: Version(version))


@pytest.fixture
def sm90(monkeypatch):
    monkeypatch.setattr(base, "cuda_capability", lambda device: (9, 0) if str(device).startswith("cuda") else None)


def on_cpu(gt):
    return dataclasses.replace(gt, device="cpu")


def unavailable(d: Definition) -> GroundTruthUnavailable:
    with pytest.raises(GroundTruthUnavailable) as exc:
        get_ground_truth("sglang", d, device="cuda")
    return exc.value


# -- fake kernels: attention from the formula, with the kernels' argument contracts ---------------------
MIN_BLOCK_KV = 32  # decode splits are multiples of this many tokens


class FakeDecode:
    """decode_attention_fwd: writes o, and per kv split its partial output (attn_logits) and natural-log
    LSE (attn_lse), leaving splits without tokens unwritten, as the Triton kernels do."""

    def __init__(self):
        self.calls: list[dict] = []

    def run(self, q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits,
            max_kv_splits, sm_scale, k_scale, v_scale, logit_cap=0.0, sinks=None, xai_temperature_len=-1,
            has_mla=False, use_pdl=False, page_size=1):
        self.calls.append(dict(q=q, k=k_buffer, v=v_buffer, o=o, indptr=kv_indptr.clone(), indices=kv_indices.clone(),
                               logits=attn_logits, lse_in=attn_lse.clone(), splits=num_kv_splits.clone(),
                               max_splits=max_kv_splits, sm_scale=sm_scale, k_scale=k_scale, v_scale=v_scale,
                               has_mla=has_mla, page_size=page_size))
        group = q.shape[1] // k_buffer.shape[-2]
        for b in range(q.shape[0]):
            s0, s1 = int(kv_indptr[b]), int(kv_indptr[b + 1])
            length = s1 - s0
            per = math.ceil(math.ceil(length / int(num_kv_splits[b])) / MIN_BLOCK_KV) * MIN_BLOCK_KV
            for s in range(max_kv_splits):
                lo, hi = per * s, min(per * s + per, length)
                if hi <= lo:
                    continue
                loc = kv_indices[s0 + lo:s0 + hi]
                k = k_buffer[loc].float().repeat_interleave(group, dim=1)  # [L, H, Dk]
                v = v_buffer[loc].float().repeat_interleave(group, dim=1)
                scores = torch.einsum("hd,lhd->hl", q[b].float(), k) * (sm_scale * k_scale)
                peak = scores.amax(-1, keepdim=True)
                p = torch.exp(scores - peak)
                attn_logits[b, :, s] = torch.einsum("hl,lhd->hd", p, v) / p.sum(-1, keepdim=True)
                attn_lse[b, :, s] = peak.squeeze(-1) + torch.log(p.sum(-1))
            written = torch.isfinite(attn_lse[b])  # [H, S]
            w = torch.softmax(attn_lse[b].masked_fill(~written, -math.inf), dim=-1)
            parts = torch.where(written[..., None], attn_logits[b], 0.0)
            o[b] = ((w[..., None] * parts).sum(1) * v_scale).to(o.dtype)


def fake_decode_fn(fake: FakeDecode, with_has_mla: bool = True):
    if with_has_mla:
        return fake.run

    def run(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits, max_kv_splits,
            sm_scale, k_scale, v_scale, logit_cap=0.0, sinks=None, xai_temperature_len=-1):  # 0.5.10 / 0.5.11
        return fake.run(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits,
                        max_kv_splits, sm_scale, k_scale, v_scale)

    return run


class FakeExtend:
    """extend_attention_fwd: per request the prefix (kv_indices into the buffers, all visible) and the
    extend tokens (k_extend / v_extend rows, indexed like the queries, causal when is_causal); o and, when
    given, lse_extend (natural log)."""

    def __init__(self):
        self.calls: list[dict] = []

    def run(self, q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
            custom_mask, is_causal, mask_indptr, max_len_extend, k_scale, v_scale, sm_scale=None, logit_cap=0.0,
            skip_prefix_custom_mask=True, sliding_window_size=-1, sinks=None, window_kv_offsets=None,
            xai_temperature_len=-1, lse_extend=None, skip_prefix=False, skip_extend=False, page_size=1):
        self.calls.append(dict(q=q_extend, k_ext=k_extend, v_ext=v_extend, o=o_extend, k=k_buffer, v=v_buffer,
                               qo_indptr=qo_indptr.clone(), kv_indptr=kv_indptr.clone(), indices=kv_indices.clone(),
                               mask=custom_mask, causal=is_causal, mask_indptr=mask_indptr, max_len=max_len_extend,
                               k_scale=k_scale, v_scale=v_scale, sm_scale=sm_scale, lse=lse_extend))
        group = q_extend.shape[1] // k_extend.shape[1]
        for b in range(qo_indptr.numel() - 1):
            q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
            p0, p1 = int(kv_indptr[b]), int(kv_indptr[b + 1])
            loc = kv_indices[p0:p1]
            n_pre, n_ext = p1 - p0, q1 - q0
            k = torch.cat([k_buffer[loc].float() * k_scale, k_extend[q0:q1].float()]).repeat_interleave(group, dim=1)
            v = torch.cat([v_buffer[loc].float(), v_extend[q0:q1].float()]).repeat_interleave(group, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q_extend[q0:q1].float(), k) * sm_scale
            i = torch.arange(n_ext)[:, None]
            j = torch.arange(n_pre + n_ext)[None, :]
            visible = (j < n_pre) | ((j - n_pre) <= i) if is_causal else torch.ones(n_ext, n_pre + n_ext, dtype=bool)
            scores = scores.masked_fill(~visible, -math.inf)
            o_extend[q0:q1] = torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v).to(o_extend.dtype)
            if lse_extend is not None:
                lse_extend[q0:q1] = torch.logsumexp(scores, -1).T


def fake_extend_fn(fake: FakeExtend, with_lse: bool = True):
    if with_lse:
        return fake.run

    def run(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
            custom_mask, is_causal, mask_indptr, max_len_extend, k_scale, v_scale, sm_scale=None, logit_cap=0.0,
            skip_prefix_custom_mask=True, sliding_window_size=-1, sinks=None, window_kv_offsets=None,
            xai_temperature_len=-1):  # 0.5.10 - 0.5.14: no lse_extend
        return fake.run(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr,
                        kv_indices, custom_mask, is_causal, mask_indptr, max_len_extend, k_scale, v_scale, sm_scale)

    return run


def attention_tree(version: str, decode=None, extend=None) -> dict[str, dict]:
    new = Version(version) >= Version("0.5.16")
    tree = {}
    if decode is not None:
        tree[NEW_DECODE if new else OLD_DECODE] = {"decode_attention_fwd": decode}
    if extend is not None:
        tree[NEW_EXTEND if new else OLD_EXTEND] = {"extend_attention_fwd": extend}
    return tree


def torch_truth(d: Definition, inputs):
    return get_ground_truth("torch", d, device="cpu")(inputs)


# -- where each release keeps the kernels -------------------------------------------------------------
@pytest.mark.parametrize("version, decode, moe", [
    ("0.5.10.post1", OLD_DECODE, "sglang.srt.layers.moe.fused_moe_triton.fused_moe"),
    ("0.5.11", OLD_DECODE, "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe"),
    ("0.5.15", OLD_DECODE, "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe"),
    ("0.5.16", NEW_DECODE, "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe"),
    ("0.5.17", NEW_DECODE, "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe"),
    ("0.5.17.dev3+g1234", NEW_DECODE, "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe"),
    ("0.5.9", None, None),
])
def test_module_paths_per_release(version, decode, moe):
    v = Version(version)
    assert st.DECODE.module_for(v) == decode
    assert st.EXTEND.module_for(v) == (decode and decode.replace("decode_attention", "extend_attention"))
    assert st.FUSED_EXPERTS.module_for(v) == moe
    assert st.TOPK_OUTPUT.module_for(v) == (moe and "sglang.srt.layers.moe.topk")
    assert st.RUNNER_CONFIG.module_for(v) == (moe and "sglang.srt.layers.moe.moe_runner")


@pytest.mark.parametrize("version", ["0.5.15", "0.5.17"])
def test_the_release_decides_which_module_is_called(monkeypatch, sm90, version):
    fake = FakeDecode()
    other = FakeDecode()
    tree = attention_tree(version, decode=fake.run)
    wrong = OLD_DECODE if Version(version) >= Version("0.5.16") else NEW_DECODE
    tree[wrong] = {"decode_attention_fwd": other.run}  # the other release's path, present but not this one's
    install(monkeypatch, version, tree)
    d = shipped("gqa_paged", GQA_DECODE)
    gt = get_ground_truth("sglang", d, device="cuda")
    assert gt.api == "sglang Triton decode_attention_fwd" and gt.version == Version(version)
    on_cpu(gt)(generate_inputs(d, "small", seed=0))
    assert len(fake.calls) == 1 and not other.calls


# -- why it cannot run ---------------------------------------------------------------------------------
def test_not_installed(monkeypatch, sm90):
    install(monkeypatch, None, {})
    e = unavailable(shipped("gqa_paged", GQA_DECODE))
    assert str(e) == "not-installed: sglang"


def test_a_release_before_the_table_is_api_missing(monkeypatch, sm90):
    install(monkeypatch, "0.5.9", {OLD_DECODE: {"decode_attention_fwd": FakeDecode().run}})
    e = unavailable(shipped("gqa_paged", GQA_DECODE))
    assert e.kind == "api-missing"
    assert e.detail.startswith("sglang 0.5.9: no known location of decode_attention_fwd (read from the wheels: ")


def test_a_missing_module_is_import_failed_naming_it(monkeypatch, sm90):
    install(monkeypatch, "0.5.17", {OLD_DECODE: {"decode_attention_fwd": FakeDecode().run}})  # only the old path
    e = unavailable(shipped("gqa_paged", GQA_DECODE))
    assert e.kind == "import-failed"
    assert e.detail.startswith(f"{NEW_DECODE}: ModuleNotFoundError: No module named 'sglang.kernels")


def test_an_exception_while_importing_is_import_failed_with_its_message(monkeypatch, sm90):
    install(monkeypatch, "0.5.16", {})
    real = base.importlib.import_module

    def broken(name, *a, **k):
        if name == NEW_EXTEND:
            raise RuntimeError("Triton is not compiled with CUDA 13 support")
        return real(name, *a, **k)

    monkeypatch.setattr(base.importlib, "import_module", broken)
    e = unavailable(shipped("gqa_ragged", GQA_RAGGED))
    assert str(e) == f"import-failed: {NEW_EXTEND}: RuntimeError: Triton is not compiled with CUDA 13 support"


def test_a_module_without_the_function_is_api_missing(monkeypatch, sm90):
    install(monkeypatch, "0.5.16", {NEW_DECODE: {"decode_attention_fwd_grouped": FakeDecode().run}})
    e = unavailable(shipped("gqa_paged", GQA_DECODE))
    assert str(e) == f"api-missing: sglang 0.5.16: {NEW_DECODE} has no decode_attention_fwd"


def test_extend_without_lse_extend_cannot_give_the_lse_output(monkeypatch, sm90):
    install(monkeypatch, "0.5.14", attention_tree("0.5.14", extend=fake_extend_fn(FakeExtend(), with_lse=False)))
    e = unavailable(shipped("gqa_ragged", GQA_RAGGED))
    assert e.kind == "api-missing" and "extend_attention_fwd has no lse_extend" in e.detail and "0.5.14" in e.detail


def test_attention_without_a_gpu_is_no_gpu(monkeypatch):
    install(monkeypatch, "0.5.17", attention_tree("0.5.17", decode=FakeDecode().run))
    e = unavailable(shipped("gqa_paged", GQA_DECODE))
    assert str(e) == "no-gpu: sglang Triton decode_attention_fwd needs a CUDA device, running on cuda"


def test_mla_with_a_latent_split_the_kernels_do_not_special_case_is_unsupported(monkeypatch, sm90):
    install(monkeypatch, "0.5.17", attention_tree("0.5.17", decode=FakeDecode().run))
    data = shipped("mla_paged", MLA_DECODE).model_dump(mode="json")
    data["axes"]["head_dim_kpe"]["value"] = 32
    e = unavailable(Definition.model_validate(data))
    assert e.kind == "unsupported" and "512 + 32" in e.detail and "512 + 64 or 256 + 32" in e.detail


# -- decode: arguments and results ---------------------------------------------------------------------------
def test_decode_arguments(monkeypatch, sm90):
    fake = FakeDecode()
    install(monkeypatch, "0.5.17", attention_tree("0.5.17", decode=fake.run))
    d = paged(shipped("gqa_paged", GQA_DECODE), 4)
    x = generate_inputs(d, "small", seed=3, case="uneven")
    on_cpu(get_ground_truth("sglang", d, device="cuda"))(x)
    (c,) = fake.calls
    v = x.values
    kc = v["k_cache"]
    pages, page, hk, dim = kc.shape
    assert page == 4
    # the paged cache is passed as token slots [pages * page_size, kv_heads, head_dim], the same storage
    assert c["k"].shape == (pages * page, hk, dim) and c["k"].data_ptr() == kc.data_ptr()
    assert c["v"].shape == (pages * page, hk, dim) and c["v"].data_ptr() == v["v_cache"].data_ptr()
    # slots: page * page_size + offset, each request's last page only as full as kv_last_page_len says
    indptr, indices, last = v["kv_indptr"].tolist(), v["kv_indices"].tolist(), v["kv_last_page_len"].tolist()
    expected, lens = [], []
    for b in range(len(indptr) - 1):
        mine = indices[indptr[b]:indptr[b + 1]]
        slots = [p * page + t for p in mine for t in range(page)][: (len(mine) - 1) * page + last[b]]
        expected += slots
        lens.append(len(slots))
    assert c["indices"].dtype == torch.int64 and c["indices"].tolist() == expected
    assert c["indptr"].dtype == torch.int32 and c["indptr"].tolist() == [0, *torch.tensor(lens).cumsum(0).tolist()]
    batch, heads, _ = v["q"].shape
    assert c["q"].shape == (batch, heads, dim) and c["q"].dtype == torch.bfloat16
    assert c["o"].shape == (batch, heads, dim) and c["o"].dtype == torch.bfloat16
    assert c["logits"].shape == (batch, heads, st.KV_SPLITS, dim) and c["logits"].dtype == torch.float32
    assert c["lse_in"].shape == (batch, heads, st.KV_SPLITS) and bool((c["lse_in"] == -math.inf).all())
    assert c["splits"].dtype == torch.int32 and c["splits"].tolist() == [st.KV_SPLITS] * batch
    assert c["max_splits"] == st.KV_SPLITS
    assert c["sm_scale"] == pytest.approx(float(v["sm_scale"])) and c["k_scale"] == 1.0 and c["v_scale"] == 1.0
    assert c["has_mla"] is False and c["page_size"] == 1  # no paging asked of the kernel: slots instead


@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("case", [None, "uneven", "empty", "single_token"])
def test_decode_agrees_with_the_torch_ground_truth(monkeypatch, sm90, page, case):
    fake = FakeDecode()
    install(monkeypatch, "0.5.16", attention_tree("0.5.16", decode=fake.run))
    d = shipped("gqa_paged", GQA_DECODE)
    d = d if page == 1 else paged(d, page)
    x = generate_inputs(d, "small", seed=1, case=case)
    out, lse = on_cpu(get_ground_truth("sglang", d, device="cuda"))(x)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert_close((out, lse), torch_truth(d, x), tolerance=tolerance_for(d), names=list(d.outputs))
    if case == "empty":  # the kernel never sees the request without kv; its row is the definitions' 0 / -inf
        empty = [b for b in range(len(x.values["kv_indptr"]) - 1)
                 if x.values["kv_indptr"][b] == x.values["kv_indptr"][b + 1]]
        assert empty and fake.calls[0]["q"].shape[0] == out.shape[0] - len(empty)
        assert bool((out[empty] == 0).all()) and bool((lse[empty] == -math.inf).all())


def test_the_lse_is_base_2(monkeypatch, sm90):
    install(monkeypatch, "0.5.17", attention_tree("0.5.17", decode=FakeDecode().run))
    d = shipped("gqa_paged", GQA_DECODE)
    x = generate_inputs(d, "small", seed=2)
    _, lse = on_cpu(get_ground_truth("sglang", d, device="cuda"))(x)
    v = x.values
    b0, b1 = int(v["kv_indptr"][0]), int(v["kv_indptr"][1])
    k = v["k_cache"][v["kv_indices"][b0:b1].long(), 0, 0].double()  # one kv head: [L, D]
    natural = torch.logsumexp(k @ v["q"][0, 0].double() * float(v["sm_scale"]), 0)
    assert float(lse[0, 0]) == pytest.approx(float(natural) / math.log(2), rel=1e-3)


def test_a_wrong_slot_mapping_is_caught(monkeypatch, sm90):
    """Control: the comparison above can fail. Slots computed as if pages held one token (page ids
    without the in-page offset) read other tokens, and the outputs disagree with the torch truth."""
    install(monkeypatch, "0.5.17", attention_tree("0.5.17", decode=FakeDecode().run))
    d = paged(shipped("gqa_paged", GQA_DECODE), 4)
    x = generate_inputs(d, "small", seed=1)
    gt = on_cpu(get_ground_truth("sglang", d, device="cuda"))
    expected = torch_truth(d, x)  # before the patch below: the torch ground truth reads the same helper
    assert_close(gt(x), expected, tolerance=tolerance_for(d), names=list(d.outputs))
    real = st.sem.request_token_slots
    monkeypatch.setattr(st.sem, "request_token_slots",
                        lambda indptr, indices, page, last: real(indptr, indices * page, 1, torch.ones_like(last)))
    with pytest.raises(Mismatch):
        assert_close(gt(x), expected, tolerance=tolerance_for(d), names=list(d.outputs))


@pytest.mark.parametrize("with_has_mla", [True, False])
def test_mla_decode_arguments_and_result(monkeypatch, sm90, with_has_mla):
    fake = FakeDecode()
    version = "0.5.17" if with_has_mla else "0.5.11"
    install(monkeypatch, version, attention_tree(version, decode=fake_decode_fn(fake, with_has_mla)))
    d = shipped("mla_paged", MLA_DECODE)
    gt = get_ground_truth("sglang", d, device="cuda")
    assert gt.api == "sglang Triton decode_attention_fwd (has_mla)"
    x = generate_inputs(d, "small", seed=0, case="uneven")
    out, lse = on_cpu(gt)(x)
    (c,) = fake.calls
    v = x.values
    slots = v["ckv_cache"].shape[0] * v["ckv_cache"].shape[1]
    assert c["q"].shape == (v["q_nope"].shape[0], 16, 576)  # [q_nope | q_pe]
    assert torch.equal(c["q"][..., :512], v["q_nope"]) and torch.equal(c["q"][..., 512:], v["q_pe"])
    assert c["k"].shape == (slots, 1, 576)  # one latent kv head, keys [ckv | kpe]
    assert c["v"].shape == (slots, 1, 512) and c["v"].data_ptr() == c["k"].data_ptr()  # values: the ckv part
    assert c["o"].shape == (v["q_nope"].shape[0], 16, 512)
    assert c["has_mla"] is with_has_mla  # passed only where the signature has it (0.5.13+)
    assert_close((out, lse), torch_truth(d, x), tolerance=tolerance_for(d), names=list(d.outputs))


# -- prefill (extend): arguments and results ------------------------------------------------------------------
def test_extend_arguments(monkeypatch, sm90):
    fake = FakeExtend()
    install(monkeypatch, "0.5.16", attention_tree("0.5.16", extend=fake.run))
    d = paged(shipped("gqa_paged", GQA_PREFILL), 4)
    x = generate_inputs(d, "small", seed=5, case="uneven")
    on_cpu(get_ground_truth("sglang", d, device="cuda"))(x)
    (c,) = fake.calls
    v = x.values
    page = 4
    qo, indptr, pages, last = (v[n].tolist() for n in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"))
    prefix, new, qo_lens = [], [], []
    for b in range(len(qo) - 1):
        mine = pages[indptr[b]:indptr[b + 1]]
        slots = [p * page + t for p in mine for t in range(page)][: (len(mine) - 1) * page + last[b]]
        n_q = qo[b + 1] - qo[b]
        if n_q == 0:
            continue
        prefix.append(slots[: len(slots) - n_q])
        new += slots[len(slots) - n_q:]
        qo_lens.append(n_q)
    kc = v["k_cache"].flatten(0, 1)
    assert c["indices"].tolist() == sum(prefix, []) and c["indices"].dtype == torch.int64
    assert c["kv_indptr"].tolist() == [0, *torch.tensor([len(p) for p in prefix]).cumsum(0).tolist()]
    assert c["qo_indptr"].tolist() == [0, *torch.tensor(qo_lens).cumsum(0).tolist()]
    assert c["qo_indptr"].dtype == torch.int32 and c["kv_indptr"].dtype == torch.int32
    assert torch.equal(c["k_ext"], kc[new]) and c["k_ext"].is_contiguous()  # the new tokens, gathered
    assert torch.equal(c["v_ext"], v["v_cache"].flatten(0, 1)[new])
    assert c["k"].data_ptr() == v["k_cache"].data_ptr() and c["k"].shape == kc.shape  # the prefix: slots
    assert c["mask"] is None and c["mask_indptr"] is None and c["causal"] is True
    assert c["max_len"] == max(qo_lens) and c["k_scale"] == 1.0 and c["v_scale"] == 1.0
    assert c["sm_scale"] == pytest.approx(float(v["sm_scale"]))
    assert c["lse"].shape == (sum(qo_lens), 8) and c["lse"].dtype == torch.float32


@pytest.mark.parametrize("op_type, name, page", [
    ("gqa_paged", GQA_PREFILL, 1), ("gqa_paged", GQA_PREFILL, 4), ("gqa_ragged", GQA_RAGGED, 1),
    ("mla_ragged", MLA_RAGGED, 1), ("mla_paged", MLA_PREFILL, 1), ("mla_paged", MLA_PREFILL, 4),
])
@pytest.mark.parametrize("case", [None, "uneven", "empty"])
def test_extend_agrees_with_the_torch_ground_truth(monkeypatch, sm90, op_type, name, page, case):
    install(monkeypatch, "0.5.17", attention_tree("0.5.17", extend=FakeExtend().run))
    d = shipped(op_type, name)
    d = d if page == 1 else paged(d, page)
    x = generate_inputs(d, "small", seed=2, case=case)
    out, lse = on_cpu(get_ground_truth("sglang", d, device="cuda"))(x)
    assert_close((out, lse), torch_truth(d, x), tolerance=tolerance_for(d), names=list(d.outputs))


def test_a_non_causal_prefill_is_passed_as_such(monkeypatch, sm90):
    fake = FakeExtend()
    install(monkeypatch, "0.5.17", attention_tree("0.5.17", extend=fake.run))
    data = shipped("gqa_ragged", GQA_RAGGED).model_dump(mode="json")
    data["name"] = data["name"].replace("_causal", "")
    d = Definition.model_validate(data)
    x = generate_inputs(d, "small", seed=0)
    out = on_cpu(get_ground_truth("sglang", d, device="cuda"))(x)
    assert fake.calls[0]["causal"] is False
    assert_close(out, torch_truth(d, x), tolerance=tolerance_for(d), names=list(d.outputs))


# -- the Triton MoE --------------------------------------------------------------------------------------------
class TopK(tuple):
    def __new__(cls, topk_weights, topk_ids, router_logits):
        return super().__new__(cls, (topk_weights, topk_ids, router_logits))


@dataclasses.dataclass
class RunnerConfig:  # the fields of 0.5.16's MoeRunnerConfig that matter here
    num_experts: int | None = None
    num_local_experts: int | None = None
    top_k: int | None = None
    activation: str = "silu"
    inplace: bool = True
    routed_scaling_factor: float | None = None


class ServerArgsModule:
    def __init__(self, published=None):
        self.published = published
        self.ServerArgs = lambda model_path: ("ServerArgs", model_path)

    def get_global_server_args(self):
        if self.published is None:
            raise ValueError("Global server args is not set yet!")
        return self.published

    def set_global_server_args_for_scheduler(self, args):
        self.published = args


def moe_tree(version: str, fused_experts, server_args: ServerArgsModule) -> dict[str, dict]:
    runner = st.FUSED_EXPERTS.module_for(Version(version))
    return {runner: {"fused_experts": fused_experts}, "sglang.srt.layers.moe.topk": {"StandardTopKOutput": TopK},
            "sglang.srt.layers.moe.moe_runner": {"MoeRunnerConfig": RunnerConfig},
            "sglang.srt.server_args": vars(server_args) | {
                "get_global_server_args": server_args.get_global_server_args,
                "set_global_server_args_for_scheduler": server_args.set_global_server_args_for_scheduler}}


def moe_definition() -> Definition:
    (path,) = sorted((SHIPPED / "moe").glob("moe_fp8_block_scale_ds_routing_*.json"))
    return load_definition(path)


@pytest.mark.heavy  # the fp8 DeepSeek-routing MoE: 1.3 GiB of weights
@pytest.mark.parametrize("version, published", [("0.5.10.post1", None), ("0.5.17", None), ("0.5.16", "theirs")])
def test_triton_moe_arguments(monkeypatch, sm90, version, published):
    calls: list = []

    def fused_experts(hidden_states, w1, w2, topk_output, moe_runner_config, b1=None, b2=None, use_fp8_w8a8=False,
                      w1_scale=None, w2_scale=None, block_shape=None):
        calls.append(dict(h=hidden_states.clone(), w1=w1, w2=w2, topk=topk_output, config=moe_runner_config,
                          fp8=use_fp8_w8a8, s1=w1_scale, s2=w2_scale, block=block_shape,
                          h_ptr=hidden_states.data_ptr()))
        hidden_states.fill_(0.5)  # in place, as the runner does with inplace=True
        return hidden_states

    sa = ServerArgsModule(published)
    install(monkeypatch, version, moe_tree(version, fused_experts, sa))
    d = moe_definition()
    gt = get_ground_truth("sglang", d, device="cuda")
    assert gt.api == "sglang Triton fused_experts (fp8 w8a8, block 128)"
    x = generate_inputs(d, "small", seed=0)
    before = {k: v.clone() for k, v in x.values.items() if isinstance(v, torch.Tensor)}
    (out,) = on_cpu(gt)(x)
    (c,) = calls
    v = x.values
    assert all(torch.equal(before[k], v[k]) for k in before), "the adapter wrote into the caller's inputs"
    assert bool((out == 0.5).all()) and out.data_ptr() == c["h_ptr"]  # the in-place result is the output
    assert sa.published == (("ServerArgs", "dummy") if published is None else published)
    w1, s1 = v["gemm1_weights"], v["gemm1_weights_scale"]
    inter, blocks = w1.shape[1] // 2, s1.shape[1] // 2
    assert torch.equal(c["w1"].view(torch.uint8), torch.cat([w1[:, inter:], w1[:, :inter]], 1).view(torch.uint8))
    assert torch.equal(c["s1"], torch.cat([s1[:, blocks:], s1[:, :blocks]], 1).float())  # [gate; up]
    assert c["w1"].is_contiguous() and c["s1"].dtype == torch.float32 and c["s2"].dtype == torch.float32
    assert c["fp8"] is True and c["block"] == [128, 128] and c["h"].dtype == torch.bfloat16
    cfg = c["config"]
    local = w1.shape[0]
    assert cfg.inplace is True and cfg.activation == "silu"
    assert cfg.num_experts == cfg.num_local_experts == local
    assert cfg.routed_scaling_factor == pytest.approx(float(v["routed_scaling_factor"]))
    weights, ids, logits = c["topk"]
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32 and logits is v["routing_logits"]
    assert int(ids.min()) >= 0 and int(ids.max()) < local  # local expert ids; other ranks' choices weigh 0
    from flashinfer_trace.groundtruth.torch_ref import route
    gids, gw = route(d, {**v, "routed_scaling_factor": 1.0})
    offset = int(v.get("local_expert_offset", 0))
    mine = (gids >= offset) & (gids < offset + local)
    assert torch.equal(ids, torch.where(mine, gids - offset, 0).int())
    assert torch.allclose(weights, torch.where(mine, gw, 0.0).float())


def test_triton_moe_import_failure_and_old_release(monkeypatch, sm90):
    install(monkeypatch, "0.5.17", {})
    e = unavailable(moe_definition())
    assert e.kind == "import-failed" and e.detail.startswith(
        "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe: ModuleNotFoundError")
    install(monkeypatch, "0.5.8", {})
    e = unavailable(moe_definition())
    assert e.kind == "api-missing" and e.detail.startswith("sglang 0.5.8: no known location of fused_experts")


# -- sgl_kernel (sglang-kernel 0.4.5) --------------------------------------------------------------------------
def test_sglang_kernel_045_norm_keywords_and_missing_ops(monkeypatch, sm90):
    """0.4.5's rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None): eps by keyword; 0.4.5 has no
    apply_rope_with_cos_sin_cache_inplace and no (CUDA) top_k_top_p_sampling_from_probs."""
    seen: dict = {}

    def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
        seen.update(eps=eps, out=out, pdl=enable_pdl)
        return input

    module = types.ModuleType("sgl_kernel")
    module.__version__ = "0.4.5"
    module.rmsnorm = rmsnorm
    monkeypatch.setitem(sys.modules, "sgl_kernel", module)
    monkeypatch.setattr(base, "installed_version", lambda package: Version("0.4.5"))
    monkeypatch.setattr(base, "_imported", {})
    d = shipped("rmsnorm", "rmsnorm_h4096")  # param:eps=1e-5, not the API's default 1e-6
    x = generate_inputs(d, "small", seed=0)
    on_cpu(get_ground_truth("sglang", d, device="cuda"))(x)
    assert seen["out"] is None and seen["pdl"] is None and seen["eps"] == pytest.approx(1e-5)
    d = shipped("rmsnorm", "rmsnorm_h4096_fp16")  # eps an input
    x = generate_inputs(d, "small", seed=0)
    on_cpu(get_ground_truth("sglang", d, device="cuda"))(x)
    assert seen["eps"] == pytest.approx(x.values["eps"])
    rope = load_definition(sorted((SHIPPED / "rope").glob("*.json"))[0])
    e = unavailable(rope)
    assert str(e) == "api-missing: sgl_kernel 0.4.5 has no apply_rope_with_cos_sin_cache_inplace"


# -- sglang's JIT RoPE (sgl_kernel 0.4.5 has none) ------------------------------------------------------------
def _fake_rotary_embedding(calls: list):
    def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox=True):
        """In place on [tokens, heads * head_size], the first rot_dim of each head rotated (own formula), with
        the kernel's contract (elementwise/pos_enc.cuh): int64 positions, the cache in the query's dtype."""
        assert positions.dtype == torch.int64, "the kernel reads positions as int64"
        assert cos_sin_cache.dtype == query.dtype, "the kernel reads the cache as the query's dtype"
        calls.append(dict(shape=tuple(query.shape), head_size=head_size, is_neox=is_neox))
        rot = cos_sin_cache.shape[-1]
        cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)  # [tokens, rot / 2]
        for t in (query, key):
            x = t.view(t.shape[0], -1, head_size)
            r = x[..., :rot].float()
            if is_neox:
                a, b = r[..., : rot // 2], r[..., rot // 2:]
            else:
                a, b = r[..., 0::2], r[..., 1::2]
            c, s = cos[:, None, :], sin[:, None, :]
            ra, rb = a * c - b * s, b * c + a * s
            out = torch.cat([ra, rb], -1) if is_neox else torch.stack([ra, rb], -1).flatten(-2)
            x[..., :rot] = out.to(t.dtype)
        return query, key
    return rotary_embedding


@pytest.mark.parametrize("version, module", [("0.5.16", "sglang.jit_kernel.rope"),
                                             ("0.5.17", "sglang.kernels.ops.attention.rope")])
def test_rope_goes_through_sglangs_jit_kernel_where_it_lives(monkeypatch, sm90, version, module):
    calls: list = []
    install(monkeypatch, version, {module: {"rotary_embedding": _fake_rotary_embedding(calls)}})
    d = load_definition(sorted((SHIPPED / "rope").glob("*.json"))[0])
    gt = get_ground_truth("sglang", d, device="cuda")
    assert gt.api == "sglang rotary_embedding (JIT kernel)"
    x = generate_inputs(d, "small", seed=0)
    got = on_cpu(gt)(x)
    want = get_ground_truth("torch", d, device="cpu")(x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), w.double(), atol=3e-2, rtol=3e-2)
    q = x.values[sgt.sem.rope_rotated(d)[0]]
    assert calls == [dict(shape=(q.shape[0], q.shape[1] * q.shape[2]), head_size=q.shape[2],
                          is_neox=sgt.sem.rope_is_neox(d))]
    assert torch.equal(x.values[sgt.sem.rope_rotated(d)[0]], q)  # the caller's inputs are untouched


def test_rope_in_an_sglang_without_a_known_place_says_where_it_looked(monkeypatch, sm90):
    install(monkeypatch, "0.5.8", {})
    e = unavailable(load_definition(sorted((SHIPPED / "rope").glob("*.json"))[0]))
    assert e.kind == "api-missing" and "sglang 0.5.8: no known location of" in str(e)
