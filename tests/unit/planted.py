"""The planted-bug checks every family's unit tests share: a reference passes a case when it runs and agrees with the
float64 torch truth within the definition's tolerance and error model; a family's mutants are exactly its boundary
bugs (each with the case that catches it) and its wrong-math ones; a boundary bug passes typical inputs and fails its
case, a wrong-math one fails typical inputs."""

from __future__ import annotations

from flashinfer_trace.groundtruth import get_ground_truth
from flashinfer_trace.inputs import generate_inputs
from flashinfer_trace.mutants import mutate
from flashinfer_trace.testing import load_definition, run_reference
from flashinfer_trace.verdict.compare import tolerance_for
from flashinfer_trace.verdict.errormodel import compare_with_model


def passes(d, case: str | None) -> bool:
    x = generate_inputs(d, "small", 0, case=case)
    try:
        actual = run_reference(d, x)
    except Exception:  # noqa: BLE001 - a reference that raises fails its case
        return False
    truth = get_ground_truth("torch", d, device="cpu")(x)
    return all(r.passed for r in compare_with_model(d, x, actual, truth, tolerance_for(d)))


def assert_family_cases(family, boundary: dict[str, str], wrong_math: tuple[str, ...]) -> None:
    assert {m.id for m in family} == set(boundary) | set(wrong_math)
    assert all((m.cls == "wrong-math") == (m.id in wrong_math) for m in family)


def assert_caught_by_its_case(mutant, boundary: dict[str, str]) -> None:
    d = load_definition(mutant.definition)
    bad = mutate(d, mutant)
    case = boundary.get(mutant.id)
    assert passes(d, case), f"the true reference fails {case}"
    assert not passes(bad, case), f"{mutant.id} survives {case}"
    if mutant.id in boundary:
        assert passes(bad, None), f"{mutant.id} is caught on typical inputs already: not a boundary bug"
