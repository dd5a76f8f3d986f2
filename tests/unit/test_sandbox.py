"""The reference sandbox's first lines: the static check and the module views refuse attacks without side
effects; honest references work through the worker. (OS confinement: test_sandbox_confinement.py.)"""

from __future__ import annotations

import builtins
import math
import os
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashinfer_trace.sandbox import (
    ALLOWED_MODULES,
    SandboxError,
    Violation,
    check_reference,
    compile_reference,
    reference_constants,
)

ENV = "FLASHINFER_TRACE_SANDBOX_PWNED"
RUN = "\ndef run(x):\n    return x\n"

# Each attack writes @PATH@ (a file under tmp_path), sets $@ENV@, or patches torch/math/builtins,
# if it ever ran. Refused by the static check (check_reference is non-empty).
STATIC_ATTACKS = [
    pytest.param("open('@PATH@', 'w').write('x')" + RUN, id="open"),
    pytest.param("exec(\"open('@PATH@', 'w')\")" + RUN, id="exec"),
    pytest.param("eval(\"open('@PATH@', 'w')\")" + RUN, id="eval"),
    pytest.param("c = compile(\"open('@PATH@', 'w')\", 'x', 'exec')" + RUN, id="compile"),
    pytest.param("__import__('os').system('touch @PATH@')" + RUN, id="dunder-import"),
    pytest.param("import os\nos.system('touch @PATH@')" + RUN, id="import-os"),
    pytest.param("import sys\nsys.modules['math'].pi = 3" + RUN, id="import-sys"),
    pytest.param("import subprocess\nsubprocess.run(['touch', '@PATH@'])" + RUN, id="import-subprocess"),
    pytest.param("import socket\nsocket.create_connection(('127.0.0.1', 9))" + RUN, id="import-socket"),
    pytest.param("import pathlib\npathlib.Path('@PATH@').write_text('x')" + RUN, id="import-pathlib"),
    pytest.param("import importlib\nimportlib.import_module('os').system('touch @PATH@')" + RUN,
                 id="import-importlib"),
    pytest.param("import shutil\nshutil.copy(__file__, '@PATH@')" + RUN, id="import-shutil"),
    pytest.param("import ctypes\nctypes.CDLL(None).system(b'touch @PATH@')" + RUN, id="import-ctypes"),
    pytest.param("import pickle\npickle.loads(b\"cos\\nsystem\\n(S'touch @PATH@'\\ntR.\")" + RUN,
                 id="import-pickle"),
    pytest.param("import os as helpers\nhelpers.environ['@ENV@'] = '1'" + RUN, id="import-os-aliased"),
    pytest.param("from os import system\nsystem('touch @PATH@')" + RUN, id="from-os-import-system"),
    pytest.param("import torch.utils.cpp_extension" + RUN, id="import-torch-submodule"),
    pytest.param("import torch\ntorch.hub.load('evil/repo', 'model')" + RUN, id="torch-hub-load"),
    pytest.param("import torch\nt = torch.load('@PATH@')" + RUN, id="torch-load"),
    pytest.param("import torch\ndef run(x):\n    torch.save(x, '@PATH@')\n    return x\n", id="torch-save"),
    pytest.param("import torch\nt = torch.from_file('@PATH@', shared=True, size=8)" + RUN,
                 id="torch-from-file"),
    pytest.param("import torch\ntorch.ops.load_library('@PATH@')" + RUN, id="torch-ops-load-library"),
    pytest.param("import torch\ntorch.utils.cpp_extension.load_inline('m', cpp_sources='', "
                 "build_directory='@DIR@')" + RUN, id="torch-cpp-extension"),
    pytest.param("import torch\nc = torch._C" + RUN, id="torch-private-C"),
    pytest.param("import torch\nm = torch.jit.load('@PATH@')" + RUN, id="torch-jit-load"),
    pytest.param("import torch\ntorch.os.environ['@ENV@'] = '1'" + RUN, id="torch-reexported-os"),
    pytest.param("import torch.nn.functional as F\nF.np.save('@PATH@', 1)" + RUN, id="functional-numpy"),
    pytest.param("import torch\nc = torch.compile(lambda x: x)" + RUN, id="torch-compile"),
    pytest.param("for c in ().__class__.__bases__[0].__subclasses__():\n"
                 "    if c.__name__ == '_wrap_close':\n"
                 "        c.__init__.__globals__['system']('touch @PATH@')" + RUN, id="subclasses-walk"),
    pytest.param("def run(x):\n    return x\nrun.__globals__['__builtins__']['len'] = None\n",
                 id="run-globals"),
    pytest.param("g = (i for i in [1])\nb = g.gi_frame.f_globals" + RUN, id="generator-frame"),
    pytest.param("def run(x):\n    try:\n        1 / 0\n    except Exception as e:\n"
                 "        return e.__traceback__.tb_frame.f_back\n", id="traceback-frame"),
    pytest.param("s = '{0.__class__.__base__}'.format(1)" + RUN, id="str-format"),
    pytest.param("s = '{x.__class__}'.format_map({'x': 1})" + RUN, id="str-format-map"),
    pytest.param("import torch\ngetattr(torch, 'save')(torch.zeros(1), '@PATH@')" + RUN, id="getattr"),
    pytest.param("import torch\nvars(torch)['save'](torch.zeros(1), '@PATH@')" + RUN, id="vars"),
    pytest.param("b = globals()['__builtins__']" + RUN, id="globals"),
    pytest.param("b = locals()" + RUN, id="locals"),
    pytest.param("__builtins__['open']('@PATH@', 'w')" + RUN, id="builtins-dict"),
    pytest.param("len = lambda x: 0" + RUN, id="shadow-builtin"),
    pytest.param("open = print" + RUN, id="rebind-forbidden-builtin"),
    pytest.param("import torch\ntorch.add = lambda *a, **k: None" + RUN, id="patch-torch-add"),
    pytest.param("import math\nmath.pi = 3" + RUN, id="patch-math-pi"),
    pytest.param("import math\ndel math.pi" + RUN, id="delete-module-attribute"),
    pytest.param("import torch\ntorch = None" + RUN, id="rebind-module-alias"),
    pytest.param("class Evil:\n    pass" + RUN, id="class-definition"),
    pytest.param("X = 0\ndef run(x):\n    global X\n    X = 1\n    return x\n", id="global-statement"),
    pytest.param("def run(x):\n    y = 0\n    def f():\n        nonlocal y\n    return x\n", id="nonlocal"),
    pytest.param("async def run(x):\n    return x\n", id="async-def"),
    pytest.param("import torch\n@torch.enable_grad()\ndef run(x):\n    return x\n", id="decorator-call"),
    pytest.param("@(lambda f: f)\ndef run(x):\n    return x\n", id="decorator-lambda"),
    pytest.param("import torch\ntorch.zeros(2).numpy().tofile('@PATH@')" + RUN, id="numpy-tofile"),
    pytest.param("X = type('X', (), {})" + RUN, id="type-three-args"),
    pytest.param("breakpoint()" + RUN, id="breakpoint"),
    pytest.param("import torch\ns = torch.zeros(1).storage()" + RUN, id="tensor-storage"),
    pytest.param("import torch\ns = torch.zeros(1).untyped_storage()" + RUN, id="tensor-untyped-storage"),
    pytest.param("import torch\ntorch.zeros(1).share_memory_()" + RUN, id="share-memory"),
    pytest.param("import torch\ntorch.set_default_dtype(torch.float64)" + RUN, id="set-default-dtype"),
    pytest.param("import torch\ntorch.set_default_device('meta')" + RUN, id="set-default-device"),
    pytest.param("import torch\ntorch.set_float32_matmul_precision('medium')" + RUN, id="matmul-precision"),
    pytest.param("import torch\ntorch.nn.Linear(1, 1).register_forward_hook(lambda *a: None)" + RUN,
                 id="register-forward-hook"),
    pytest.param("def helper():\n    return open('@PATH@', 'w')\ndef run(x):\n    return helper()\n",
                 id="nested-in-helper"),
    pytest.param("f = lambda: open('@PATH@', 'w')\ndef run(x):\n    return f()\n", id="nested-in-lambda"),
    pytest.param("def run(x):\n    return f\"{open('@PATH@', 'w')}\"\n", id="nested-in-fstring"),
    pytest.param("def run(x, y=open('@PATH@', 'w')):\n    return x\n", id="default-argument"),
    pytest.param("import torch\ntorch.save(torch.zeros(1), '@PATH@')" + RUN, id="module-level-code"),
    pytest.param("from . import secrets" + RUN, id="relative-import"),
    pytest.param("from torch import _C" + RUN, id="from-torch-import-private"),
    pytest.param("from torch import save\nsave(1, '@PATH@')" + RUN, id="from-torch-import-save"),
    pytest.param("from torch import *" + RUN, id="star-import"),
    pytest.param("import torch as __t" + RUN, id="dunder-import-alias"),
    pytest.param("def run(__x):\n    return __x\n", id="dunder-parameter"),
    pytest.param("from typing import get_type_hints" + RUN, id="typing-get-type-hints"),
    pytest.param("import typing\nt = typing.sys" + RUN, id="typing-sys"),
    pytest.param("def run(x):\n    match x:\n        case int(__class__=c):\n            return c\n",
                 id="match-class-dunder"),
    pytest.param("o = object.__subclasses__()" + RUN, id="object-subclasses"),
    pytest.param("def run(x):\n    return super()\n", id="super"),
    pytest.param("exit()" + RUN, id="exit"),
    pytest.param("import torch\ndef run(x):\n    try:\n        torch.nope\n    except AttributeError as e:\n"
                 "        return e.obj\n", id="attribute-error-obj"),
    # The chain that reached full code execution: a string-keyed getattr to Module.compile, whose
    # backend gets an FX GraphModule that pastes a target string into source run with real builtins.
    pytest.param("import torch\nc = torch.nn.ParameterDict()['compile']\n"
                 "c(backend=lambda gm, ex: gm)" + RUN, id="parameterdict-module-compile"),
    pytest.param("from torch.nn import ModuleDict" + RUN, id="from-torch-nn-import-container"),
    pytest.param("from torch import nn\nm = nn.Module()" + RUN, id="torch-nn-alias-module"),
    pytest.param("import torch\ndef run(x):\n    return x.storage_type()(1).type('os.path')\n",
                 id="storage-type-imports-by-name"),
    pytest.param("import torch\ndef run(x):\n    return x.type('torch.FloatTensor')\n", id="tensor-type-by-name"),
    pytest.param("import torch\ndef run(x):\n    return torch.cond(x.sum() > 0, lambda a: a, lambda a: a, (x,))\n",
                 id="torch-cond-dynamo"),
    pytest.param("import torch\ndef run(x):\n    return torch.while_loop(lambda a: a < 0, lambda a: a, (x,))\n",
                 id="torch-while-loop"),
]

# Pass the static check (names alone cannot tell), refused by the runtime module views.
RUNTIME_ATTACKS = [
    pytest.param("import torch\nw = torch.PyTorchFileWriter('@PATH@')" + RUN, id="torch-file-writer"),
    pytest.param("import torch\ncu = torch.CompilationUnit('def f(x):\\n    return x\\n')" + RUN,
                 id="torchscript-compilation-unit"),
    pytest.param("import torch\nr = torch.random.get_rng_state()" + RUN, id="torch-random-module"),
    pytest.param("import torch.nn.functional as F\nd = F.dataclasses" + RUN, id="functional-dataclasses"),
    pytest.param("import torch\nt = torch.testing" + RUN, id="torch-testing-module"),
    # `F.torch.nn` is torch.nn reached through a path the static check cannot follow: the view refuses.
    pytest.param("import torch.nn.functional as F\nc = F.torch.nn.ParameterDict" + RUN,
                 id="nn-container-through-functional"),
]


@pytest.fixture
def attack(tmp_path, monkeypatch):
    """Fill in an attack's targets; afterwards assert nothing happened."""
    monkeypatch.delenv(ENV, raising=False)
    path = tmp_path / "pwned"
    before = (torch.add, math.pi, torch.get_default_dtype(), torch.get_float32_matmul_precision(),
              builtins.len, builtins.open, torch.zeros(1).device)

    def fill(source: str) -> str:
        return source.replace("@PATH@", str(path)).replace("@DIR@", str(tmp_path)).replace("@ENV@", ENV)

    yield fill
    after = (torch.add, math.pi, torch.get_default_dtype(), torch.get_float32_matmul_precision(),
             builtins.len, builtins.open, torch.zeros(1).device)
    assert after == before
    assert not path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert ENV not in os.environ


@pytest.mark.parametrize("source", STATIC_ATTACKS)
def test_static_attack_refused(source, attack):
    code = attack(source)
    assert check_reference(code), "the static check let it through"
    with pytest.raises(SandboxError) as info:
        compile_reference(code, definition="evil_def")
    assert str(info.value).startswith("evil_def: reference line ")


@pytest.mark.parametrize("source", RUNTIME_ATTACKS)
def test_runtime_attack_refused(source, attack):
    code = attack(source)
    assert not check_reference(code), "a static refusal: this case belongs in STATIC_ATTACKS"
    with pytest.raises(SandboxError, match="not available to references"):
        compile_reference(code, definition="evil_def")


def test_attack_inside_run_never_reaches_torch_internals_at_call_time():
    run = compile_reference("import torch\ndef run(x):\n    return torch.PyTorchFileWriter\n")
    with pytest.raises(AttributeError, match="not available to references"):
        run(1)


@pytest.mark.parametrize(("code", "line", "fragment"), [
    ("import torch\n\n\nimport os\n" + RUN, 4, "import of 'os'"),
    ("def run(x):\n    y = x\n    return y.__class__\n", 3, "__class__"),
    ("import torch\ndef run(x):\n    return torch.load(x)\n", 3, "'load'"),
    ("def helper(a):\n    return a\n\n@helper\ndef run(x):\n    return x\n", 4, "decorators"),
    ("def run(x):\n    return f'{eval(x)}'\n", 2, "'eval'"),
])
def test_error_names_definition_and_line(code, line, fragment):
    with pytest.raises(SandboxError) as info:
        compile_reference(code, definition="gemm_n128")
    err = info.value
    assert (err.definition, err.line) == ("gemm_n128", line)
    assert fragment in err.message
    assert str(err) == f"gemm_n128: reference line {line}: {err.message}"


RMSNORM = '''import torch
import math

EPS = 1e-5

@torch.no_grad()
def run(hidden_states, weight):
    x = hidden_states.to(torch.float32)
    inv = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return (x * inv * weight.to(torch.float32)).to(hidden_states.dtype)
'''


def test_rmsnorm_reference_computes_correctly():
    run = compile_reference(RMSNORM, definition="rmsnorm_h4")
    rows = [[1.0, -2.0, 3.0, 0.5], [0.0, 0.25, -1.0, 4.0]]
    weight = [1.0, 0.5, 2.0, -1.0]
    out = run(torch.tensor(rows, dtype=torch.float64), torch.tensor(weight))
    assert out.dtype == torch.float64
    for r, row in enumerate(rows):
        inv = 1 / math.sqrt(sum(v * v for v in row) / len(row) + 1e-5)
        for c, v in enumerate(row):
            assert out[r, c].item() == pytest.approx(v * inv * weight[c], rel=1e-6)


RICH = '''import math
import torch
import torch.nn.functional as F
from typing import Optional, Tuple
from torch import Tensor

TOP_K = 2
SCALE = 1 / 128


def _softmax_f32(x: Tensor) -> Tensor:
    return F.softmax(x.float(), dim=-1)


def topk(probs: Tensor, k: int = TOP_K) -> Tuple[Tensor, Tensor]:
    with torch.no_grad():
        values, indices = torch.topk(probs, k, dim=-1)
    return values, indices


@torch.inference_mode()
def run(input: Tensor, type: Optional[Tensor] = None):
    assert input.dim() == 2, f"expected 2-D input, got {input.dim()}-D"
    _, n = input.shape
    if n < TOP_K:
        raise ValueError(f"need at least {TOP_K} columns")
    input = input * SCALE * 128
    probs = _softmax_f32(input)
    values, indices = topk(probs)
    total = sum(float(v) for v in values.flatten().tolist())
    squares = [i * i for i in range(n)]
    pick = (lambda t: t[:, :1])(values)
    try:
        norm = math.sqrt(total)
    except ValueError:
        norm = 0.0
    match n:
        case 3:
            kind = "three"
        case _:
            kind = "other"
    return values.to(input.dtype), indices, norm, squares, pick, kind
'''


def test_rich_reference_works():
    run = compile_reference(RICH, definition="topk")
    x = torch.tensor([[1.0, 3.0, 2.0], [0.0, -1.0, 5.0]])
    values, indices, norm, squares, pick, kind = run(x)
    expected = torch.softmax(x, dim=-1).topk(2, dim=-1)
    assert torch.allclose(values, expected.values)
    assert indices.tolist() == expected.indices.tolist()
    assert norm == pytest.approx(math.sqrt(expected.values.sum().item()))
    assert squares == [0, 1, 4] and pick.shape == (2, 1) and kind == "three"
    assert not torch.is_inference_mode_enabled()
    with pytest.raises(AssertionError, match="expected 2-D"):
        run(torch.zeros(3))
    with pytest.raises(ValueError, match="at least 2 columns"):
        run(torch.zeros(2, 1))


def test_imports_inside_run_and_from_submodule():
    code = ("def run(x):\n    import torch.nn.functional as F\n    from torch.nn import functional as G\n"
            "    from torch import linalg\n    return F.relu(x) + G.relu(x), linalg.norm(x)\n")
    relu, norm = compile_reference(code)(torch.tensor([-1.0, 2.0]))
    assert relu.tolist() == [0.0, 4.0] and norm.item() == pytest.approx(math.sqrt(5))


def test_torch_builds_tensors_from_lists_inside_the_namespace():
    # torch's C++ imports torch.storage through the reference's own `__import__` (a list as fromlist):
    # it gets torch's real module; the reference itself still imports nothing outside the allowlist
    from flashinfer_trace.sandbox.namespace import _Modules

    out = compile_reference("import torch\ndef run(x):\n    return x + torch.tensor([1.0, 2.0])\n")(torch.zeros(2))
    assert out.tolist() == [1.0, 2.0]
    guarded = _Modules()
    for name, fromlist in (("torch.storage", ()), ("torch.storage", None), ("os", []), ("torch.no_such", []),
                           ("torch.storage", ["x"])):
        with pytest.raises(ImportError, match="not allowed"):
            guarded.import_(name, None, None, fromlist, 0)


def test_each_compile_gets_its_own_namespace():
    code = "CALLS = []\n\ndef run(x):\n    CALLS.append(x)\n    return len(CALLS)\n"
    first, second = compile_reference(code), compile_reference(code)
    assert (first(1), first(2), second(3)) == (1, 2, 1)
    seen = compile_reference("import torch\ndef run():\n    return torch.float32, repr(torch), callable(len)\n")()
    assert seen == (torch.float32, "<module '<reference view of torch>'>", True)


def test_modules_and_functions_do_not_leave_the_worker():
    with pytest.raises(TypeError, match="cannot cross the worker boundary"):
        compile_reference("import torch\ndef run():\n    return torch\n")()
    with pytest.raises(TypeError, match="cannot cross"):
        compile_reference("def run():\n    return run\n")()


def test_missing_or_wrong_entry():
    with pytest.raises(SandboxError, match=r"defines no function run\(\)") as info:
        compile_reference("def main(x):\n    return x\n", definition="d")
    assert info.value.line is None and str(info.value) == "d: reference defines no function run()"
    with pytest.raises(SandboxError, match="not a function but int"):
        compile_reference("run = 3\n")
    assert compile_reference("def main(x):\n    return x + 1\n", entry="main")(1) == 2


def test_syntax_errors_have_lines():
    with pytest.raises(SandboxError) as info:
        compile_reference("import torch\n\ndef run(x)\n    return x\n", definition="d")
    assert info.value.line == 3 and "not valid Python" in info.value.message
    assert check_reference("def run(x):\n    return x\nreturn 1\n") == [
        Violation(3, "is not valid Python: 'return' outside function")]


def test_exception_in_module_body_is_wrapped():
    with pytest.raises(SandboxError, match="ZeroDivisionError") as info:
        compile_reference("import torch\nSCALE = 1 / 0\n" + RUN, definition="d")
    assert info.value.line == 2 and info.value.definition == "d"
    with pytest.raises(SandboxError, match="NameError"):  # print is not a builtin here
        compile_reference("print('hi')\n" + RUN)


def test_non_str_is_refused():
    with pytest.raises(SandboxError, match="must be a str, got bytes"):
        compile_reference(b"def run(x):\n    return x\n")
    assert check_reference(None) == [Violation(None, "must be a str, got NoneType")]
    assert reference_constants(42) == {}


def test_check_reference_reports_every_violation():
    code = "import os\n\ndef run(x):\n    y = x.__dict__\n    return open(y)\n"
    violations = check_reference(code)
    assert [v.line for v in violations] == [1, 4, 5]
    assert "os" in violations[0].message and "__dict__" in violations[1].message
    assert "open" in violations[2].message
    assert check_reference(RMSNORM) == [] and check_reference(RICH) == []


def test_parameters_may_use_builtin_names_but_elsewhere_they_are_refused():
    assert check_reference("def run(input, id):\n    input = input + id\n    return input\n") == []
    assert check_reference("def helper():\n    return input\ndef run(input):\n    return helper()\n")
    assert check_reference("def run(x):\n    _, n = x\n    _tmp = n\n    max = n\n    return max\n") == []


def test_sandbox_error_is_a_value_error_and_pickles():
    err = SandboxError("d", 3, "boom")
    assert isinstance(err, ValueError) and str(err) == "d: reference line 3: boom"
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.definition, copy.line, copy.message, str(copy)) == ("d", 3, "boom", str(err))


def test_allowed_modules():
    assert {"torch", "torch.nn.functional", "math", "typing"} <= ALLOWED_MODULES
    assert not ALLOWED_MODULES & {"os", "sys", "io", "torch.utils", "torch.hub", "importlib", "numpy"}


TOKENS = ["import ", "torch", "os", ".", "__class__", "(", ")", "def ", "run", ":", "\n", "    ",
          "x", "=", "lambda", "'s'", "1", "[", "]", "open", "from ", "class ", "global ", "@", ","]


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=300), st.lists(st.sampled_from(TOKENS), max_size=40).map("".join)))
def test_check_reference_never_raises(code):
    result = check_reference(code)
    assert isinstance(result, list) and all(isinstance(v, Violation) for v in result)
    reference_constants(code)


def test_check_reference_survives_pathological_input():
    for code in ["\x00", "\ud800", "(" * 5000, "-" * 100_000 + "1", "x = " + "1 + " * 50_000 + "1"]:
        assert isinstance(check_reference(code), list)
        assert isinstance(reference_constants(code), dict)


def test_reference_constants():
    code = (
        "import torch\n"
        "EPS = 1e-5\n"
        "TOP_K = 8\n"
        "NEG = -3\n"
        "SCALE = 1/128\n"
        "TINY = 2**-7\n"
        "SHAPE = (128, 64, -1)\n"
        "NAME: str = 'rms' + 'norm'\n"
        "HALF_EPS = EPS / 2\n"
        "FLAG = True\n"
        "A = B = 4\n"
        "CALL = torch.zeros(1)\n"
        "LIST = [1, 2]\n"
        "HUGE = 10 ** 10 ** 10\n"
        "BOMB = 'a' * 10 ** 9\n"
        "ROOT = (-8) ** 0.5\n"
        "DIV = 1 / 0\n"
        "LATER = 1\n"
        "LATER = compute()\n"
        "BUMPED = 2\n"
        "BUMPED += 1\n"
        "def run(x):\n"
        "    EPS = 3\n"
        "    return x\n"
    )
    assert reference_constants(code) == {  # run's own EPS = 3 is the one run uses
        "EPS": 3, "TOP_K": 8, "NEG": -3, "SCALE": 0.0078125, "TINY": 0.0078125,
        "SHAPE": (128, 64, -1), "NAME": "rmsnorm", "HALF_EPS": 5e-6, "FLAG": True, "A": 4, "B": 4,
    }


def test_constants_in_the_body_of_run():
    """The public dataset writes its constants inside run()."""
    code = ("import torch\nSCALE = 2\n"
            "def run(x, TOP_K):\n"
            "    _, h = x.shape\n    assert h == 128\n    EPS = 1e-6\n    HALF = EPS / SCALE\n"
            "    STEP = 1\n    for i in range(3):\n        STEP = i\n    TOP_K = 4\n"
            "    return x\n")
    found = reference_constants(code)
    assert found["EPS"] == 1e-6 and found["HALF"] == 5e-7 and found["SCALE"] == 2
    assert "STEP" not in found  # rebound in a loop
    assert found["TOP_K"] == 4  # a parameter, then assigned a constant: the constant holds after it


def test_an_epsilon_written_as_a_literal():
    from flashinfer_trace.sandbox.constants import literal_epsilon

    norm = "def run(x, w):\n    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + {}) * w\n"
    assert literal_epsilon(norm.format("1e-6")) == 1e-6
    assert literal_epsilon("def run(x):\n    return x / (x.var(-1) + 1e-5).sqrt()\n") == 1e-5
    assert literal_epsilon("def run(x):\n    return (x ** 2).mean() + 2**-20\n") == 2 ** -20
    assert literal_epsilon(norm.format("0.5")) is None  # too large to be an epsilon
    assert literal_epsilon("def run(x):\n    return x + 1e-6\n") is None  # no statistic beside it
    assert literal_epsilon("def run(x):\n    return x.mean() + 1e-6, x.pow(2).mean() + 1e-5\n") is None  # two


def test_reference_constants_never_executes(tmp_path):
    target = tmp_path / "ran"
    code = f"import os\nX = os.system('touch {target}')\nY = open('{target}', 'w')\nZ = 1\n"
    assert reference_constants(code) == {"Z": 1}
    assert reference_constants("def broken(:\nEPS = 1") == {}
    assert not target.exists()
