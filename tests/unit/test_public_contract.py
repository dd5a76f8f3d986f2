"""A public name keeps its public contract (issue 31): where a shipped definition has the name of a
definition in the public flashinfer-trace dataset, its inputs (names, order, axis names, dtypes), its
outputs and its run(...) parameters are the public file's, so solutions, workloads and client code
written against the public dataset run against ours unchanged. A parameter the public file leaves out
(the norms' eps) is carried by a `param:` tag (docs/definitions.md, "Public names keep the public
contract").

fixtures/public_contract.json lists every public name with its contract (facts only, no public file
text); a future definition that takes one of those names with another signature fails here."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from sizes import param

from flashinfer_trace.dataset import Dataset
from flashinfer_trace.sandbox import compile_reference
from flashinfer_trace.testing import generate_inputs

ROOT = Path(__file__).resolve().parents[2]
DEFINITIONS = ROOT / "definitions"
PUBLIC = {k: v for k, v in json.loads((Path(__file__).parent / "fixtures" / "public_contract.json").read_text()).items()
          if not k.startswith("_")}
SHIPPED = {d.name: d for d in Dataset(DEFINITIONS)}
COLLISIONS = sorted(set(PUBLIC) & set(SHIPPED))
# not yet on the public contract (docs/definitions.md says what differs and what is planned)
NOT_YET = {f"gdn_mtp_qk{h}_v{2 * h}_d128_k_last" for h in (4, 8, 16)}


def run_parameters(code: str) -> list[str]:
    run = next(n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.FunctionDef) and n.name == "run")
    return [a.arg for a in run.args.posonlyargs + run.args.args + run.args.kwonlyargs]


def contract(d) -> dict:
    """A shipped definition's contract in the fixture's form."""
    def tensors(specs):
        return {n: [None if s.shape is None else list(s.shape), s.dtype.value] for n, s in specs.items()}
    return {"op_type": d.op_type, "inputs": tensors(d.inputs), "outputs": tensors(d.outputs),
            "run": run_parameters(d.reference)}


def differences(ours: dict, public: dict) -> list[str]:
    out = []
    for key in ("inputs", "outputs"):
        if list(ours[key]) != list(public[key]):
            out.append(f"{key}: {list(ours[key])} where the public file has {list(public[key])}")
        else:
            out += [f"{key[:-1]} {n}: {ours[key][n]} where the public file has {public[key][n]}"
                    for n in public[key] if ours[key][n] != public[key][n]]
    if ours["run"] != public["run"]:
        out.append(f"run{tuple(ours['run'])} where the public file has run{tuple(public['run'])}")
    return out


def test_the_fixture_is_the_public_dataset():
    assert len(PUBLIC) == 156  # the public dataset's definitions (docs/definitions.md, "The public dataset")
    for name, c in PUBLIC.items():
        assert set(c) == {"op_type", "inputs", "outputs", "run"}, name
        assert sorted(c["run"]) == sorted(c["inputs"]), name  # four public MoE files put routing_bias second


def test_collisions_are_the_documented_ones():
    """The names we share with the public dataset (docs/definitions.md lists them): a new one is
    checked by the next test, and the docs' table must say so."""
    assert len(COLLISIONS) == 54


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason="intermediate_states_buffer: ours [batch_size, ..] "
                                            "and an output, the public one [pool_size, ..] and an input only"))
    if n in NOT_YET else n for n in sorted(SHIPPED)])
def test_a_public_name_has_the_public_signature(name):
    """Fails for any shipped definition, now or later, that takes a public name with another contract."""
    if name not in PUBLIC:
        pytest.skip("not a public name")
    assert differences(contract(SHIPPED[name]), PUBLIC[name]) == []


@pytest.mark.parametrize("name", [param(n, n, n) for n in COLLISIONS])
def test_the_reference_runs_called_the_public_way(name):
    """A client of the public dataset calls run with the public input names as keywords and nothing
    else, and reads the public outputs back, in order."""
    d, public = SHIPPED[name], PUBLIC[name]
    inputs = generate_inputs(d, size="small", seed=0)
    names = list(public["inputs"])
    run = compile_reference(d.reference, definition=name, names=names)
    out = run(*[inputs.values[n] for n in names])
    out = out if isinstance(out, tuple) else (out,)
    assert len(out) == len(public["outputs"])
    for (oname, (shape, dtype)), value in zip(public["outputs"].items(), out, strict=True):
        assert isinstance(value, torch.Tensor), oname
        assert str(value.dtype) == f"torch.{dtype}", oname
        assert list(value.shape) == [inputs.axes[a] for a in shape], oname
