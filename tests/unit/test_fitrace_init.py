"""Inputs from an fi_trace definition's own `init` (inputs/fitrace_init.py): used where our family
generator does not fit, run in the confined worker, mapped to the inputs by name and `param`. The fixture
(an RMSNorm with upstream's names: `hidden_states` passed as `input`, an `enable_pdl` flag our generator
does not know) is written for these tests."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch

from flashinfer_trace.check import CheckConfig, Discovered, plan, run, summarise
from flashinfer_trace.definition import Definition
from flashinfer_trace.inputs import InputGenerationError, edge_cases, generate_inputs
from flashinfer_trace.inputs import norm as norm_inputs
from flashinfer_trace.inputs.fitrace_init import INIT_SOURCE, generate_from_init, init_entry, init_source
from flashinfer_trace.sandbox import configure, settings, shutdown
from flashinfer_trace.testing import run_reference

FIXTURE = Path(__file__).parent / "fixtures" / "fitrace" / "fi_norm_h2048.json"
EMITTED = Path("/tmp/fitrace/0.7.2.post1")


@pytest.fixture
def fi() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.fixture
def fresh_settings():
    saved = (settings.timeout, settings.memory_bytes, settings.cpu_seconds)
    names = ("FLASHINFER_TRACE_REFERENCE_TIMEOUT", "FLASHINFER_TRACE_REFERENCE_MEMORY_GB")
    env = {k: os.environ.get(k) for k in names}
    yield
    settings.timeout, settings.memory_bytes, settings.cpu_seconds = saved
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    shutdown()


def definition(data: dict, name: str = "fi_norm_h2048.json") -> Definition:
    d = Definition.model_validate(data)
    d._source = Path("/defs") / name  # as if loaded from that file: errors name it
    return d


def from_init(d: Definition, size: str = "small", seed: int = 0):
    """The init's case alone: generate_inputs would fall back to the declared generator where it fails."""
    return generate_from_init(d, size, seed, device=torch.device("cpu"))


def with_init(fi: dict, body: str) -> Definition:
    """The fixture with its init replaced by one whose body is `body`."""
    data = copy.deepcopy(fi)
    data["init"] = ("import torch\n\n\ndef _norm_init(*, batch_size: int, hidden_size: int = 8, device: str = 'cuda', "
                    "seed: int = 0):\n" + "".join(f"    {line}\n" for line in body.strip().splitlines()))
    return definition(data)


# -- the fallback --------------------------------------------------------------------------------------------
def test_our_generator_does_not_fit_so_the_init_makes_the_inputs(fi):
    d = definition(fi)
    inputs = generate_inputs(d, "small", 0)
    assert inputs.source == INIT_SOURCE == "fi_trace init"
    assert list(inputs.values) == ["hidden_states", "weight", "enable_pdl"]
    x, w = inputs.values["hidden_states"], inputs.values["weight"]
    # `input` (the API parameter) became hidden_states by its "param"; const hidden_size=2048 was passed
    # (the init's own default is 8); the var batch_size is the small tier's 4
    assert x.shape == (4, 2048) and x.dtype == torch.bfloat16 and w.shape == (2048,)
    assert inputs.values["enable_pdl"] is False  # a scalar comes back as a Python value
    assert inputs.axes == {"batch_size": 4, "hidden_size": 2048}
    assert 0.5 < float(x.float().std()) < 1.5 and float((w.float() - 1).abs().max()) < 1.0  # randn, as drawn
    assert generate_inputs(d, "medium", 0).values["hidden_states"].shape == (64, 2048)
    assert edge_cases(d) == list(norm_inputs.CASES)  # the family still lists its own


def test_init_inputs_are_deterministic_and_follow_the_seed(fi):
    d = definition(fi)
    a, b = generate_inputs(d, "small", 0), generate_inputs(d, "small", 0)
    assert torch.equal(a.values["hidden_states"], b.values["hidden_states"])
    assert torch.equal(a.values["weight"], b.values["weight"])
    c = generate_inputs(d, "small", 1)  # the worker seeds torch with the case's seed before the call
    assert not torch.equal(a.values["hidden_states"], c.values["hidden_states"])


def test_a_definition_our_generators_know_never_runs_its_init(fi):
    data = copy.deepcopy(fi)
    del data["inputs"]["enable_pdl"]
    data["init"] = "def _norm_init(*, batch_size, device='cpu', seed=0):\n    raise ValueError('never called')\n"
    inputs = generate_inputs(definition(data), "small", 0)
    assert inputs.source == "generator"


def test_no_generator_for_the_op_type_falls_back_too(fi):
    data = copy.deepcopy(fi)
    data["op_type"] = "norm_of_our_own"
    d = definition(data)
    assert edge_cases(d) == []  # an init has no edge cases
    assert generate_inputs(d, "small", 0).source == INIT_SOURCE


def test_var_axis_sizes_the_init_refuses_are_retried_larger(fi):
    d = with_init(fi, """
if batch_size % 16:
    raise ValueError('batch_size must be a multiple of 16')
return {'input': torch.randn(batch_size, hidden_size, dtype=torch.bfloat16, device=device),
        'weight': torch.ones(hidden_size, dtype=torch.bfloat16, device=device)}
""")
    assert generate_inputs(d, "small", 0).axes["batch_size"] == 16


def test_the_helpers_all_list_is_blanked_and_nothing_else(fi):
    code = init_source(definition(fi))
    assert "__all__" not in code and code.count("\n") == fi["init"].count("\n")  # line numbers kept
    assert init_entry(definition(fi), code) == ("_norm_init", {"batch_size": False, "hidden_size": True,
                                                               "device": True, "seed": True})


# -- what does not fit is a precise error ----------------------------------------------------------------------
def test_missing_input_names_the_file_the_input_and_the_unmatched_keys(fi):
    data = copy.deepcopy(fi)
    del data["inputs"]["hidden_states"]["param"]
    with pytest.raises(InputGenerationError) as info:
        from_init(definition(data))
    message = str(info.value)
    assert "/defs/fi_norm_h2048.json: $.init:" in message
    assert "no value for input(s) 'hidden_states'" in message and "match no input: 'input', 'out'" in message
    assert info.value.definition == "fi_norm_h2048"
    assert generate_inputs(definition(data), "small", 0).source == "declared"  # where the init fails: the declaration


def test_where_the_declaration_fails_too_the_error_says_why_each_was_tried(fi):
    data = copy.deepcopy(fi)
    del data["inputs"]["hidden_states"]["param"]
    data["constraints"] = ["hidden_states.min().item() > 100.0"]  # no generator meets it
    with pytest.raises(InputGenerationError) as info:
        generate_inputs(definition(data), "small", 0)
    message = str(info.value)
    assert "the declared generator" in message and "hidden_states.min().item() > 100.0" in message
    assert "our generator does not fit" in message and "enable_pdl" in message  # why the init was tried
    assert "its init: /defs/fi_norm_h2048.json: $.init:" in message  # why the declaration was tried
    assert message.startswith("fi_norm_h2048: ") and message.count("fi_norm_h2048: ") == 1


@pytest.mark.parametrize("body, match", [
    ("return [torch.ones(2)]", "returned list, not a dict"),
    ("return {'input': torch.ones(batch_size, hidden_size, dtype=torch.float32), 'weight': torch.ones(hidden_size, "
     "dtype=torch.bfloat16)}", "input 'hidden_states': dtype torch.float32, expected bfloat16"),
    ("return {'input': torch.ones(batch_size, 7, dtype=torch.bfloat16), 'weight': torch.ones(hidden_size, "
     "dtype=torch.bfloat16)}", "const axis 'hidden_size' is 2048, but the generator needs 7"),
    ("return {'input': torch.full((batch_size, hidden_size), float('nan'), dtype=torch.bfloat16), "
     "'weight': torch.ones(hidden_size, dtype=torch.bfloat16)}", "hidden_states.*non-finite"),
    ("return {'input': torch.ones(batch_size, hidden_size, dtype=torch.bfloat16), 'weight': torch.ones(hidden_size, "
     "dtype=torch.bfloat16), 'enable_pdl': 'yes'}", "enable_pdl' is a scalar; the init made a str"),
    ("raise ValueError('no such size')", r"raised for every var-axis size tried \(4, 16, 128\).*no such size"),
])
def test_init_results_are_checked_like_generated_inputs(fi, body, match):
    with pytest.raises(InputGenerationError, match=match):
        from_init(with_init(fi, body))


def test_an_init_parameter_that_is_no_axis_is_an_error(fi):
    data = copy.deepcopy(fi)
    data["init"] = "def _norm_init(*, batch_size, num_pages, device='cpu', seed=0):\n    return {}\n"
    with pytest.raises(InputGenerationError, match=r"requires parameter 'num_pages', which is no axis"):
        from_init(definition(data))


# -- confined like a reference ------------------------------------------------------------------------------
@pytest.mark.parametrize("body, match", [
    ("import os\nreturn {'input': os.environ}", "refused by the sandbox.*import of 'os' is not allowed"),
    ("return {'input': open('/etc/passwd').read()}", "name 'open' is not allowed"),
    ("return {'input': __import__('os')}", "refused by the sandbox"),
])
def test_a_hostile_init_is_refused(fi, body, match):
    with pytest.raises(InputGenerationError, match=match):
        from_init(with_init(fi, body))
    assert generate_inputs(with_init(fi, body), "small", 0).source == "declared"  # nothing of it ran here


def test_an_init_that_never_returns_is_killed(fi, fresh_settings):
    configure(timeout=2)
    with pytest.raises(InputGenerationError, match=r"_norm_init\(batch_size=4.*timeout: no result after 2 s"):
        from_init(with_init(fi, "while True:\n    pass"))


def test_an_init_past_the_memory_limit_fails_in_its_worker(fi, fresh_settings):
    configure(memory_gb=1)
    with pytest.raises(InputGenerationError, match=r"raised for every var-axis size tried.*RuntimeError.*allocate"):
        from_init(with_init(fi, "return {'input': torch.empty(2 ** 31)}"))


# -- check ------------------------------------------------------------------------------------------------
def test_check_with_the_torch_ground_truth_passes_on_init_inputs(fi):
    d = definition(fi)
    config = CheckConfig(sources=("torch",), sizes=("small",), seeds=(0,), cases=(), device="cpu")
    results = list(run(plan(Discovered([d], []), config), config))
    summary = summarise(results)
    assert summary.by_status == {"pass": 4}, summary.failures
    assert {r.check for r in results} == {"shape", "dtype", "match", "deterministic"}
    assert all(r.inputs == INIT_SOURCE for r in results)
    match = next(r for r in results if r.check == "match")
    assert match.ground_truth.source == "torch" and match.status == "pass" and match.compared


def test_check_catches_a_wrong_reference_on_init_inputs(fi):
    data = copy.deepcopy(fi)
    data["reference"] = data["reference"].replace("* weight.to(torch.float32)", "")
    config = CheckConfig(sources=("torch",), sizes=("small",), cases=(), device="cpu")
    results = list(run(plan(Discovered([definition(data)], []), config), config))
    match = next(r for r in results if r.check == "match")
    assert match.status == "fail" and match.inputs == INIT_SOURCE


def test_reference_runs_on_init_inputs(fi):
    d = definition(fi)
    inputs = generate_inputs(d, "small", 0)
    (out,) = run_reference(d, inputs)
    x = inputs.values["hidden_states"].double()
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * inputs.values["weight"].double()
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not EMITTED.is_dir(), reason="FlashInfer 0.7.2.post1's emission is not at /tmp/fitrace")
def test_an_emitted_definition_gets_its_inputs_from_its_init():
    from flashinfer_trace.dataset import load_path

    d = load_path(EMITTED / "mla_paged" / "concat_mla_k_h128_nope128_rope64_d192.json")
    inputs = generate_inputs(d, "small", 0)
    assert inputs.source == INIT_SOURCE and inputs.values["k_rope"].shape == (4, 1, 64)
    assert torch.isfinite(inputs.values["k"].float()).all()  # its torch.empty out buffer (written in place)


# -- import-fi-trace: the worker's device reaches the emitter ---------------------------------------------------
def test_the_emit_task_runs_on_the_requested_device(monkeypatch, tmp_path):
    from flashinfer_trace.fitrace import emit, importer
    from flashinfer_trace.sandbox import pool

    seen = []
    monkeypatch.setattr(emit, "emit_all", lambda op_types, *, device: seen.append(device) or {"results": []})
    assert emit.run({"op_types": None}, "cuda:0") == {"ok": {"results": []}}
    assert emit.run({"op_types": ["rmsnorm"]}) == {"ok": {"results": []}}
    assert seen == ["cuda:0", "cpu"]  # the worker's own device; the CPU as before

    asked = []
    monkeypatch.setattr(importer.metadata, "version", lambda dist: "0.7.2.post1")
    monkeypatch.setattr(pool, "run_task", lambda op, payload, **kw: asked.append(kw["device"]) or {})
    monkeypatch.setattr(importer, "write_layout", lambda emitted, out: {"count": 0})
    importer.import_fi_trace(tmp_path, device="cuda:1")
    importer.import_fi_trace(tmp_path)
    assert asked == ["cuda:1", "cuda" if torch.cuda.is_available() else "cpu"]

    from flashinfer_trace.cli import build_parser

    args = build_parser().parse_args(["import-fi-trace", "--device", "cuda"])
    assert args.device == "cuda" and build_parser().parse_args(["import-fi-trace"]).device is None


def test_an_optional_scalar_the_init_leaves_out_gets_the_references_default(fi):
    data = copy.deepcopy(fi)
    data["tags"] = [t for t in data["tags"] if not t.startswith("param:")]  # eps is an input here
    data["inputs"]["eps"] = {"shape": None, "dtype": "float32", "optional": True}
    data["reference"] = data["reference"].replace("enable_pdl=None):", "enable_pdl=None, eps: float = 1e-5):")
    d = definition(data)
    inputs = generate_inputs(d, "small", 0)
    assert inputs.values["eps"] == 1e-5 and isinstance(inputs.values["eps"], float)
    data["reference"] = data["reference"].replace("eps: float = 1e-5", "eps=None")
    assert generate_inputs(definition(data), "small", 0).values["eps"] is None


def test_a_var_axis_only_an_output_has_needs_no_value_from_the_init(fi):
    data = copy.deepcopy(fi)
    data["axes"]["groups"] = {"type": "var"}
    data["outputs"]["scales"] = {"shape": ["batch_size", "groups"], "dtype": "float32"}
    inputs = generate_inputs(definition(data), "small", 0)
    assert inputs.source == INIT_SOURCE and "groups" not in inputs.axes
    data["constraints"] = ["groups <= batch_size"]  # named by a constraint: it must get a value
    with pytest.raises(InputGenerationError, match="axis value.* not determined: groups"):
        from_init(definition(data))


@pytest.mark.parametrize("constraint, want", [("hidden_size == 2 * half", 1024), ("half == hidden_size // 2", 1024),
                                              ("half * 3 == hidden_size", None)])
def test_an_output_only_axis_a_constraint_ties_to_the_inputs_is_derived(fi, constraint, want):
    data = copy.deepcopy(fi)
    data["axes"]["half"] = {"type": "var"}
    data["outputs"]["halves"] = {"shape": ["batch_size", "half"], "dtype": "bfloat16"}
    data["constraints"] = [constraint]
    if want is None:  # 2048 / 3 is no integer: nothing is derived, and the axis is reported
        with pytest.raises(InputGenerationError, match="not determined: half"):
            from_init(definition(data))
    else:
        assert generate_inputs(definition(data), "small", 0).axes["half"] == want


def test_running_out_of_device_memory_while_planning_is_no_collection_error(monkeypatch):
    """Planning an fi_trace definition makes one small case to learn where its inputs come from; on a GPU that ran
    out of memory this raised out of the collection of every fi_trace test (H200, 2026-11-28). The cases decide
    under the device's budget instead; any other error still raises."""
    import json

    from flashinfer_trace import check

    d = definition(json.loads(FIXTURE.read_text()))
    assert d.from_fi_trace

    def oom(*_a, **_k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")

    monkeypatch.setattr(check, "generate_inputs", oom)
    assert check._fi_trace_inputs(d, "cpu") == (None, None)

    def broken(*_a, **_k):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(check, "generate_inputs", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        check._fi_trace_inputs(d, "cpu")
