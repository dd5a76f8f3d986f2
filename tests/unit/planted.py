"""The planted-bug checks every family's unit tests share: a reference passes a case when it runs and agrees with the
float64 torch truth within the definition's tolerance and error model; a family's mutants are exactly its boundary
bugs (each with the case that catches it) and its wrong-math ones; a boundary bug passes typical inputs and fails its
case, a wrong-math one fails typical inputs; every mutant of a family is killed by `kill` on the CPU."""

from __future__ import annotations

from collections.abc import Iterable

from flashinfer_trace.groundtruth import get_ground_truth
from flashinfer_trace.inputs import generate_inputs
from flashinfer_trace.mutants import kill, mutate
from flashinfer_trace.testing import load_definition, run_reference
from flashinfer_trace.verdict.compare import tolerance_for
from flashinfer_trace.verdict.errormodel import compare_with_model


def truth(d, x):
    """The float64 torch ground truth of `d` on `x`, on the CPU."""
    return get_ground_truth("torch", d, device="cpu")(x)


def agrees(d, x, got) -> bool:
    """`got`, outputs of `d` on `x`, agree with the float64 torch truth within the tolerance and error model. The
    truth is computed after the outputs: a reference that wrote into its inputs is compared on what it left there."""
    return all(r.passed for r in compare_with_model(d, x, got, truth(d, x), tolerance_for(d)))


def passes(d, case: str | None, size: str = "small", *, crash_fails: bool = True) -> bool:
    """The reference of `d` agrees with the truth on seed 0 of `case` (None: typical inputs) at `size`. A reference
    that raises fails the case; with crash_fails=False its exception propagates (a bug must then be caught by a
    wrong answer, not by a crash)."""
    x = generate_inputs(d, size, 0, case=case)
    try:
        actual = run_reference(d, x)
    except Exception:  # noqa: BLE001 - a reference that raises (a wrong shape, an index out of range) fails its case
        if not crash_fails:
            raise
        return False
    return agrees(d, x, actual)


def mutant_named(family, name: str):
    """The one mutant of `family` named `name` (definition:id)."""
    [m] = [m for m in family if m.name == name]
    return m


def assert_family_cases(family, boundary: dict[str, str], wrong_math: tuple[str, ...]) -> None:
    assert {m.id for m in family} == set(boundary) | set(wrong_math)
    assert all((m.cls == "wrong-math") == (m.id in wrong_math) for m in family)


def assert_boundary_classes(family, boundary: dict[str, str], classes: Iterable[str]) -> None:
    """`boundary` (mutant name -> its case) names exactly the family's boundary-class mutants, of `classes`."""
    assert {m.cls for m in family if m.name in boundary} == set(classes)
    assert set(boundary) == {m.name for m in family if m.cls.startswith("boundary-")}


def assert_boundary_bug(mutant, cases: Iterable[str | None], *, sizes: Iterable[str] = ("small",),
                        crash_fails: bool = True) -> None:
    """The true reference passes each of `cases` and `mutant` fails each; the mutant passes typical inputs at each of
    `sizes` (none: the typical inputs may catch it too)."""
    d = load_definition(mutant.definition)
    bad = mutate(d, mutant)
    for case in cases:
        assert passes(d, case, crash_fails=crash_fails), f"the true reference fails {case}"
        assert not passes(bad, case, crash_fails=crash_fails), f"{mutant.name} survives {case}"
    for size in sizes:
        assert passes(bad, None, size, crash_fails=crash_fails), \
            f"{mutant.name} is caught on typical {size} inputs already: not a boundary bug"


def assert_caught_by_its_case(mutant, boundary: dict[str, str]) -> None:
    """`boundary` maps mutant ids to their cases; a mutant not in it is wrong math, caught on typical inputs."""
    case = boundary.get(mutant.id)
    assert_boundary_bug(mutant, [case], sizes=("small",) if mutant.id in boundary else ())


def assert_killed(mutant) -> None:
    """`kill` catches the mutant against the torch truth at the small size, seed 0."""
    k = kill(mutant, "torch", sizes=("small",), seeds=(0,))
    assert k.killed is True, k.how
