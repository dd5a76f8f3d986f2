"""Outside the API's contract (verdict/contract.py, verdict/contract.toml): a boundary case that fails against a
kernel source is info only where the table puts its property outside that API's promise, the inputs carry the
property, and the property explains the difference; a pass stays a pass, the torch ground truth is never
covered, and a reference's own bug in that regime is still caught. On the CPU, with planted kernels labelled as
FlashInfer's (the torch ground truth's computation, with or without flush-to-zero)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from packaging.version import Version

from flashinfer_trace.check import CheckConfig, Discovered, plan, run
from flashinfer_trace.groundtruth import GroundTruth, adapters_for
from flashinfer_trace.mutants import MUTANTS, mutate
from flashinfer_trace.status import CellState, Kind, Status, cell_state
from flashinfer_trace.testing import load_definition
from flashinfer_trace.verdict.contract import (
    CONTRACT_FILE,
    COVERABLE_SOURCES,
    MODELS,
    ContractError,
    default_contract,
    load_contract,
)

DECODE = "gqa_paged_decode_h2_kv2_d128_ps1"  # bf16: its subnormal_query queries are float32 subnormals
DECODE_API = "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper"


def _ftz(values: dict) -> dict:
    """What an FTZ float32 kernel sees: every input value below float32's smallest normal (2**-126) is 0."""
    return {k: torch.where(v.float().abs() < 2.0**-126, torch.zeros_like(v), v)
            if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in values.items()}


def _flushing(fn):
    def kernel(call):
        return fn(dataclasses.replace(call, inputs=dataclasses.replace(call.inputs, values=_ftz(call.inputs.values))))
    return kernel


def _wrong_too(fn):
    """Flushes, and scales its output by 1.5: wrong in a way flush-to-zero does not explain."""
    def kernel(call):
        out = _flushing(fn)(call)
        return (out[0] * 1.5, *out[1:])
    return kernel


def _planted(d, wrap=None, *, source="flashinfer", api=DECODE_API, version="0.5.3"):
    """check's ground truth: the torch computation, wrapped, labelled as `source`'s `api` at `version`."""
    base = next(a for a in adapters_for(d.op_type, "torch") if a.applies(d) is None)
    adapter = dataclasses.replace(base, source=source, api=api, fn=wrap(base.fn) if wrap else base.fn)

    def resolve(src, definition, *, device=None, prebuild=None, path=None):
        return GroundTruth(adapter, definition, device or "cpu", None, Version(version))
    return resolve


def _edge(d, resolve=None, *, source="flashinfer", case="subnormal_query", **config):
    config = CheckConfig(sources=(source,), sizes=("small",), seeds=(0,), cases=(case,), device="cpu",
                         resolve=resolve, paths=False, **config)
    return [r for r in run(plan(Discovered([d], []), config), config) if r.check == "edge"]


# -- the table -------------------------------------------------------------------------------------------
def test_the_shipped_table_loads_with_reasons_and_evidence():
    c = default_contract()
    assert c.entries and all(e.source in COVERABLE_SOURCES and e.reason and e.evidence for e in c.entries)
    assert set(c.properties) <= set(MODELS)
    assert c.property_of("subnormal_query").name == "float32-subnormals"
    assert c.property_of("scores_far_negative") is None and c.property_of(None) is None  # no entry for a known bug
    ftz = next(e for e in c.entries if e.id == "flashinfer-jit-fast-math-ftz")
    assert ftz.covers("flashinfer", DECODE_API + "(use_tensor_cores=True)", "0.5.3")
    assert ftz.covers("flashinfer", DECODE_API, "0.7.2.post1")
    assert not ftz.covers("flashinfer", DECODE_API, "0.7.3")  # a release whose build flags nobody read yet
    assert not ftz.covers("flashinfer", "flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla", "0.6.6")
    assert not ftz.covers("torch", DECODE_API, "0.5.3") and not ftz.covers("flashinfer", DECODE_API, None)


GOOD = """
[property.float32-subnormals]
cases = ["subnormal_query"]
what = "w"

[[outside]]
id = "x"
property = "float32-subnormals"
source = "flashinfer"
apis = ["flashinfer.*"]
versions = ">=0.5"
reason = "r"
evidence = ["e"]
"""


@pytest.mark.parametrize("edit, message", [
    (('source = "flashinfer"', 'source = "torch"'), "outside[0].source: 'torch' cannot be outside its own contract"),
    (('versions = ">=0.5"', 'versions = "newest"'), "outside[0].versions: 'newest' is not a version specifier"),
    (('evidence = ["e"]', 'evidence = []'), "outside[0].evidence: must be a non-empty list"),
    (('evidence = ["e"]', 'evidence = ["e"]\nexpires = 2027-01-01'), "outside[0]: unknown field(s) ['expires']"),
    (('reason = "r"\n', ''), "outside[0].reason: missing"),
    (('property = "float32-subnormals"', 'property = "empty rows"'), "outside[0].property: 'empty rows' is not"),
    (("[property.float32-subnormals]", "[property.nan-inputs]"), "[property.nan-inputs]: no model"),
    (('cases = ["subnormal_query"]', 'cases = "subnormal_query"'), ".cases: must be a non-empty list"),
])
def test_table_errors_name_the_field(tmp_path, edit, message):
    path = tmp_path / "contract.toml"
    path.write_text(GOOD.replace(*edit))
    with pytest.raises(ContractError) as info:
        load_contract(path)
    assert message in str(info.value)


def test_a_case_belongs_to_one_property(tmp_path):
    path = tmp_path / "contract.toml"
    path.write_text(GOOD.replace('cases = ["subnormal_query"]', 'cases = ["subnormal_query", "subnormal_query"]'))
    with pytest.raises(ContractError, match="already in"):
        load_contract(path)
    assert load_contract(CONTRACT_FILE) == default_contract()


# -- the engine ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def decode():
    return load_definition(DECODE)


def test_flush_to_zero_where_the_api_does_not_promise_subnormals_is_info(decode):
    (r,) = _edge(decode, _planted(decode, _flushing))
    assert r.status is Status.INFO and r.kind is Kind.OUTSIDE_CONTRACT, r.detail
    assert cell_state(r.status, r.kind) is CellState.INFO
    assert r.detail.startswith("outside the contract (flashinfer-jit-fast-math-ftz: float32-subnormals)")
    assert "-use_fast_math" in r.detail and "Measured: output:" in r.detail  # the reason, the difference
    assert "flushed to zero (q " in r.detail and "the reference agrees with the kernel" in r.detail
    assert r.reports and not r.reports[0]["verdict"] == "pass"  # the measured reports are kept


def test_a_pass_stays_a_pass(decode):
    (r,) = _edge(decode, _planted(decode))  # a kernel that does not flush: nothing to reconsider
    assert r.status is Status.PASS and r.kind is None


@pytest.mark.parametrize("label", [dict(version="0.7.3"), dict(api="flashinfer.decode.trtllm_batch_decode"),
                                   dict(source="sglang")])
def test_outside_the_entry_a_failure_stays_red(decode, label):
    (r,) = _edge(decode, _planted(decode, _flushing, **label), source=label.get("source", "flashinfer"))
    assert r.status is Status.FAIL and r.kind is Kind.MISMATCH and "outside the contract" not in r.detail


def test_the_torch_ground_truth_promises_everything(decode):
    (r,) = _edge(decode, _planted(decode, _flushing, source="torch"), source="torch")
    assert r.status is Status.FAIL and r.kind is Kind.MISMATCH


def test_a_kernel_wrong_in_another_way_stays_red_and_says_why(decode):
    (r,) = _edge(decode, _planted(decode, _wrong_too))
    assert r.status is Status.FAIL and r.kind is Kind.MISMATCH
    assert "not explained by float32-subnormals" in r.detail and "the reference still differs" in r.detail


def test_inputs_without_the_property_stay_red():
    """fp16: subnormal_query's queries are fp16 subnormals (2**-15), normal float32s: a kernel that zeroes them
    is no flush-to-zero kernel, and nothing the contract says covers it."""
    d = load_definition("gqa_paged_decode_h32_kv8_d128_ps1_fp16")

    def zeroing(fn):
        def kernel(call):
            q = call.inputs.values["q"]
            values = {**call.inputs.values, "q": torch.where(q.abs() < 2.0**-14, torch.zeros_like(q), q)}
            return fn(dataclasses.replace(call, inputs=dataclasses.replace(call.inputs, values=values)))
        return kernel

    (r,) = _edge(d, _planted(d, zeroing))
    assert r.status is Status.FAIL and "outside the contract" not in r.detail and "not explained" not in r.detail


ROUTER = "router_gemm_m16_k6144_n256"  # bf16 subnormal activations times weights near 2**122: outputs ~85


def _flushing_off_by_one(fn):
    """Flushes, and adds 1 to its output: wrong where flushing gives zeros (x 1.5 would not show)."""
    def kernel(call):
        out = _flushing(fn)(call)
        return (out[0] + 1, *out[1:])
    return kernel


@pytest.mark.parametrize("api, wrap, state", [
    ("flashinfer.gemm.mm_M1_16_K6144_N256", _flushing, Status.INFO),  # built with -use_fast_math: the H200's zeros
    ("flashinfer.gemm.mm_M1_16_K6144_N256", _flushing_off_by_one, Status.FAIL),
    ("flashinfer.gemm.mm_bf16", _flushing, Status.FAIL),  # cuBLAS / cuDNN: no build flag of FlashInfer's
])
def test_the_router_gemms_flush_subnormal_activations_outside_their_contract(api, wrap, state):
    d = load_definition(ROUTER)
    (r,) = _edge(d, _planted(d, wrap, api=api, version="0.7.2.post1"), case="subnormal")
    assert r.status is state, r.detail
    assert ("outside the contract (flashinfer-jit-fast-math-ftz" in r.detail) == (state is Status.INFO)


def test_the_contract_never_applies_to_random_cases(decode):
    config = CheckConfig(sources=("flashinfer",), sizes=("small",), seeds=(0,), cases=(), device="cpu",
                         resolve=_planted(decode, _wrong_too), paths=False)
    (r,) = [r for r in run(plan(Discovered([decode], []), config), config) if r.check == "match"]
    assert r.status is Status.FAIL


# -- planted bugs: the contract must not hide a reference's bug in the regime it covers ---------------------
FLUSH_MUTANT = next(m for m in MUTANTS if m.name == "gqa_paged_decode_h32_kv8_d128_ps1:flush-subnormal-q")


@pytest.fixture(scope="module")
def flushing_reference():
    return mutate(load_definition(FLUSH_MUTANT.definition), FLUSH_MUTANT)


def test_a_reference_that_flushes_is_caught_by_the_torch_ground_truth(flushing_reference):
    (r,) = _edge(flushing_reference, source="torch")
    assert r.status is Status.FAIL and r.kind is Kind.MISMATCH


def test_a_reference_that_flushes_is_caught_against_a_kernel_that_does_not(flushing_reference):
    """The kernel (labelled FlashInfer 0.5.3, whose contract leaves subnormals out) is right: the reference's
    flush does not explain the difference the other way round, so the case stays red."""
    (r,) = _edge(flushing_reference, _planted(flushing_reference))
    assert r.status is Status.FAIL and "not explained by float32-subnormals" in r.detail


def test_the_pytest_face_passes_an_info_case_with_a_warning_and_records_info(decode):
    """tests/references: an info case is no pytest failure, says why in a warning, and its record says info."""
    from types import SimpleNamespace

    from flashinfer_trace.check import Memo
    from flashinfer_trace.pytest_plugin import OutsideContract, _Engine

    config = CheckConfig(sources=("flashinfer",), sizes=("small",), seeds=(0,), cases=("subnormal_query",),
                         device="cpu", resolve=_planted(decode, _flushing), paths=False)
    (case,) = [c for c in plan(Discovered([decode], []), config) if c.check == "edge"]
    node = SimpleNamespace(user_properties=[])
    with pytest.warns(OutsideContract, match="outside the contract"):
        _Engine(config, Memo("cpu"), node).check(case)
    assert dict(node.user_properties)["record"]["status"] == "info"


def test_a_release_whose_only_differences_are_info_bisects_as_good():
    from flashinfer_trace.bisect.search import Verdict, classify
    from flashinfer_trace.results.record import CaseRecord

    def r(status, kind=None, case=None):
        return CaseRecord(definition=DECODE, check="edge" if case else "match", source="flashinfer", status=status,
                          kind=kind, case=case, size="small", seed=0)

    records = [r(Status.PASS), r(Status.INFO, Kind.OUTSIDE_CONTRACT, "subnormal_query")]
    assert classify("0.5.3", records, "flashinfer").verdict is Verdict.GOOD
    records.append(r(Status.FAIL, Kind.MISMATCH, "scores_far_negative"))
    assert classify("0.5.3", records, "flashinfer").verdict is Verdict.BAD
