"""Model extraction: configs (bundled and from files, with errors naming the field), the kernel plan of
each architecture, deduplication (new / shared / unchanged / conflict with version suffixes), the
command, and that extraction reproduces the shipped definitions and is a no-op when rerun."""

import json
import shutil
from pathlib import Path

import pytest
from samples import REPRESENTATIVES

from flashinfer_trace.cli import main
from flashinfer_trace.extract import ConfigError, extract, load_config, plan, select_models
from flashinfer_trace.extract.config import bundled, parse_config
from flashinfer_trace.extract.dedup import Dataset, add, differences, semantic, write
from flashinfer_trace.validate import check_data

ROOT = Path(__file__).resolve().parents[2]


def kernels(cfg, **kw):
    return {(k.family, tuple(sorted(k.kwargs.items()))) for k in plan(cfg, **kw).kernels}


def has(ks, family, **params):
    return (family, tuple(sorted(params.items()))) in ks


def gemms(cfg):
    return {(k.kwargs["n"], k.kwargs["k"]) for k in plan(cfg).kernels if k.family == "gemm"}


# -- configs ------------------------------------------------------------------------------------------
def test_bundled_configs_and_model_selection():
    assert set(bundled()) == {"llama-3.1-8b", "llama-3.1-70b", "qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b",
                              "nemotron-h-8b", "deepseek-v3.2", "qwen3-next-80b-a3b"}
    assert [c.name for c in select_models("llama")] == ["llama-3.1-70b", "llama-3.1-8b"]
    (ds,) = select_models("deepseek_v3")
    assert (ds.name, ds.family, ds.tp, ds.ep, ds.fp8_block) == ("deepseek-v3", "deepseek_v3", 8, 8, 128)
    assert [c.name for c in select_models("qwen2_moe")] == ["qwen3-30b-a3b"]
    assert select_models("mixtral-8x7b", tp=2)[0].tp == 2
    with pytest.raises(ConfigError, match="not a bundled model"):
        select_models("gpt-5")


def _config(tmp_path, name, drop=None, **changes):
    data = json.loads(bundled()[name].read_text())
    data.pop("flashinfer_trace")
    if drop:
        data.pop(drop)
    data.update(changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("name,field", [("llama-3.1-8b", "hidden_size"), ("mixtral-8x7b", "num_local_experts"),
                                        ("qwen3-30b-a3b", "moe_intermediate_size"), ("deepseek-v3", "kv_lora_rank"),
                                        ("deepseek-v3", "n_group")])
def test_a_missing_field_is_an_error_naming_file_and_field(tmp_path, name, field):
    path = _config(tmp_path, name, drop=field)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(path) in str(e.value) and f"{field}: missing" in str(e.value)


@pytest.mark.parametrize("changes,message", [
    ({"hidden_size": "4096"}, "hidden_size: '4096' is not a positive int"),
    ({"rms_norm_eps": -1}, "rms_norm_eps: -1 is not a positive float"),
    ({"model_type": "gpt2"}, "model_type: 'gpt2' is not supported"),
    ({"quantization_config": {"quant_method": "awq"}}, "quantization_config: only fp8"),
])
def test_bad_values_are_errors(tmp_path, changes, message):
    with pytest.raises(ConfigError, match=message):
        load_config(_config(tmp_path, "llama-3.1-8b", **changes))


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(ConfigError, match="not JSON: line 1"):
        load_config(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="a JSON object"):
        parse_config([1], "x.json")


def test_a_plain_hf_config_gets_its_name_and_cli_parallelism(tmp_path):
    path = _config(tmp_path, "llama-3.1-8b", _name_or_path="meta-llama/Llama-3.1-8B")
    cfg = load_config(path, tp=2)
    assert (cfg.name, cfg.tp, cfg.ep) == ("llama-3.1-8b", 2, 1)


# -- plans ---------------------------------------------------------------------------------------------
def test_llama_8b_at_tp1():
    cfg = select_models("llama-3.1-8b")[0]
    ks = kernels(cfg)
    assert gemms(cfg) == {(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)}
    assert has(ks, "rmsnorm", hidden_size=4096, eps=1e-5) and has(ks, "fused_add_rmsnorm", hidden_size=4096, eps=1e-5)
    for stage in ("decode", "prefill"):
        assert has(ks, "gqa_paged", stage=stage, num_qo_heads=32, num_kv_heads=8, head_dim=128, page_size=1)
    assert has(ks, "gqa_ragged", num_qo_heads=32, num_kv_heads=8, head_dim=128)
    assert has(ks, "rope", num_qo_heads=32, num_kv_heads=8, head_dim=128, rotary_dim=128, neox=True)
    assert has(ks, "silu_and_mul", intermediate_size=14336)
    assert {dict(k[1])["kind"] for k in ks if k[0] == "sampling"} == {"top_k", "top_p", "top_k_top_p"}
    assert has(kernels(cfg, page_size=16), "gqa_paged", stage="decode", num_qo_heads=32, num_kv_heads=8,
               head_dim=128, page_size=16)


def test_llama_70b_at_tp8_shards_heads_mlp_and_vocabulary():
    cfg = select_models("llama-3.1-70b")[0]
    ks = kernels(cfg)
    assert gemms(cfg) == {(1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584), (16032, 8192)}
    assert has(ks, "gqa_paged", stage="decode", num_qo_heads=8, num_kv_heads=1, head_dim=128, page_size=1)
    assert has(ks, "silu_and_mul", intermediate_size=3584)


def test_qwen3_moe():
    cfg = select_models("qwen3-30b-a3b")[0]
    ks = kernels(cfg)
    assert has(ks, "moe", routing="renormalize", weights="fp8_block_scale", top_k=8, num_experts=128,
               num_local_experts=128, hidden_size=2048, intermediate_size=768)
    assert has(ks, "rmsnorm", hidden_size=128, eps=1e-6) and has(ks, "rmsnorm", hidden_size=2048, eps=1e-6)
    assert gemms(cfg) == {(5120, 2048), (2048, 4096), (128, 2048), (151936, 2048)}
    assert not any(k[0] == "silu_and_mul" for k in ks)  # fused into the experts


def test_deepseek_v3_at_tp8_ep8():
    cfg = select_models("deepseek-v3")[0]
    p = plan(cfg)
    ks = kernels(cfg)
    assert has(ks, "moe", routing="deepseek", weights="fp8_block_scale", top_k=8, num_experts=256,
               num_local_experts=32, hidden_size=7168, intermediate_size=2048, n_group=8, topk_group=4)
    for stage in ("decode", "prefill"):
        assert has(ks, "mla_paged", stage=stage, num_qo_heads=16, head_dim_ckv=512, head_dim_kpe=64, page_size=1)
    assert has(ks, "rope", num_qo_heads=16, num_kv_heads=1, head_dim=64, rotary_dim=64, neox=False)
    assert gemms(cfg) == {(2112, 7168), (3072, 1536), (7168, 2048), (4608, 7168), (7168, 2304), (512, 7168),
                          (7168, 256), (256, 7168), (16160, 7168)}
    assert {k.kwargs["intermediate_size"] for k in p.kernels if k.family == "silu_and_mul"} == {2304, 256}
    assert {k.kwargs["hidden_size"] for k in p.kernels if k.family == "rmsnorm"} == {7168, 1536, 512}
    assert any("kv_b_proj" in why for why in p.left_out)
    moe = next(k for k in p.kernels if k.family == "moe")
    assert moe.parallel == ("ep:8",)


def test_mixtral_at_tp8():
    cfg = select_models("mixtral-8x7b")[0]
    ks = kernels(cfg)
    assert has(ks, "moe", routing="renormalize", weights="bfloat16", top_k=2, num_experts=8, num_local_experts=8,
               hidden_size=4096, intermediate_size=1792)
    assert (8, 4096) in gemms(cfg) and (4000, 4096) in gemms(cfg)


def test_parallelism_that_does_not_divide_is_an_error():
    with pytest.raises(ConfigError, match="num_attention_heads 32 is not divisible by --tp 3"):
        plan(select_models("llama-3.1-8b", tp=3)[0])
    with pytest.raises(ConfigError, match="experts 256 is not divisible by --ep 3"):
        plan(select_models("deepseek-v3", ep=3)[0])
    with pytest.raises(ConfigError, match="--page-size 0"):
        plan(select_models("llama-3.1-8b")[0], page_size=0)


def test_qwen2_moe_without_renormalisation_is_refused(tmp_path):
    path = _config(tmp_path, "qwen3-30b-a3b", model_type="qwen2_moe", norm_topk_prob=False)
    with pytest.raises(ConfigError, match="norm_topk_prob: false"):
        plan(load_config(path))


# -- dedup ---------------------------------------------------------------------------------------------
def _toy(name="rmsnorm_h8", value=8, ref="EPS = 1e-5", tags=("model:a",), description="x"):
    return {"name": name, "op_type": "rmsnorm", "description": description, "tags": list(tags),
            "axes": {"hidden_size": {"type": "const", "value": value, "description": "width"}},
            "inputs": {}, "outputs": {}, "reference": ref}


def test_dedup_new_shared_unchanged_and_conflicts(tmp_path):
    ds = Dataset(tmp_path)
    assert add(ds, _toy(), "a", ["norm"]).status == "new"
    write(ds)
    ds = Dataset(tmp_path)
    assert add(ds, _toy(description="other prose"), "a", []).status == "unchanged"
    shared = add(ds, _toy(tags=("model:b", "tp:2")), "b", [])
    assert shared.status == "shared"
    c = add(ds, _toy(value=16, ref="EPS = 1e-6", tags=("model:c",)), "c", [])
    assert (c.status, c.name, c.conflicts_with) == ("conflict", "rmsnorm_h8_v2", "rmsnorm_h8")
    assert c.differences == ["$.axes.hidden_size.value", "$.reference"]
    assert add(ds, _toy(value=16, ref="EPS = 1e-6", tags=("model:d",)), "d", []).name == "rmsnorm_h8_v2"
    assert add(ds, _toy(value=32), "e", []).name == "rmsnorm_h8_v3"
    write(ds)
    data = json.loads((tmp_path / "rmsnorm" / "rmsnorm_h8.json").read_text())
    assert data["tags"] == ["model:a", "model:b", "tp:2"] and data["description"] == "x"
    v2 = json.loads((tmp_path / "rmsnorm" / "rmsnorm_h8_v2.json").read_text())
    assert v2["name"] == "rmsnorm_h8_v2" and v2["tags"] == ["model:c", "model:d"]
    assert write(Dataset(tmp_path)) == []
    assert differences(semantic(_toy()), semantic(_toy(ref="y"))) == ["$.reference"]


# -- the real templates on the real dataset --------------------------------------------------------------
@pytest.fixture
def dataset_copy(tmp_path):
    shutil.copytree(ROOT / "definitions", tmp_path / "definitions")
    return tmp_path / "definitions"


def _coverage(path) -> bool:
    """A hand-written file that fills a gap of the bundled models (docs/boundary/attention.md): tagged coverage:..."""
    return any(t.startswith("coverage:") for t in json.loads(path.read_text())["tags"])


def test_the_dataset_is_what_the_bundled_models_extract(dataset_copy):
    """Every shipped definition but the coverage ones comes from a bundled model, and extracting them all
    again changes nothing."""
    configs = [c for name in bundled() for c in select_models(name)]
    configs += select_models("nemotron-h-8b", tp=2)  # the tp 2 shard of the hybrid (h64 ng4) as well
    configs += select_models("qwen3-next-80b-a3b", tp=2) + select_models("qwen3-next-80b-a3b", tp=4)  # gdn qk8/qk4
    ex = extract(configs, dataset_copy)
    assert ex.written == [] and {o.status for o in ex.outcomes} == {"unchanged"}
    assert {o.name for o in ex.outcomes} == {p.stem for p in dataset_copy.rglob("*.json") if not _coverage(p)}
    assert len({o.name for o in ex.outcomes}) >= 40


def test_extraction_confirms_the_first_definitions_and_reruns_as_a_no_op(tmp_path):
    """From the fourteen definitions written first: theirs are confirmed, the rest are new and validate."""
    folder = tmp_path / "definitions"
    for path in (ROOT / "definitions").rglob("*.json"):
        if path.stem in REPRESENTATIVES:
            (folder / path.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, folder / path.parent.name / path.name)
    configs = select_models("llama-3.1-8b") + select_models("deepseek-v3")
    ex = extract(configs, folder)
    by_name = {o.name: o for o in ex.outcomes}
    assert not [o for o in ex.outcomes if o.status == "conflict"], [o.as_dict() for o in ex.outcomes]
    assert set(REPRESENTATIVES) <= set(by_name)
    assert all(by_name[n].status in ("unchanged", "shared") for n in REPRESENTATIVES)
    assert {o.status for o in ex.outcomes if o.name not in REPRESENTATIVES} == {"new"}
    for path in ex.written:
        data = json.loads(path.read_text())
        assert check_data(data, str(path), path.stem) == [], path
    again = extract(configs, folder)
    assert again.written == [] and {o.status for o in again.outcomes} == {"unchanged"}


def test_cli_extract_dry_run_and_report(dataset_copy, tmp_path, capsys):
    for path in dataset_copy.rglob("*.json"):  # a dataset without Mixtral's own kernels
        if json.loads(path.read_text())["tags"].count("model:mixtral-8x7b") and "rmsnorm" not in path.stem:
            path.unlink()
    before = sorted(p.name for p in dataset_copy.rglob("*.json"))
    assert main(["extract", "--model", "mixtral-8x7b", "--definitions", str(dataset_copy), "--dry-run"]) == 0
    assert sorted(p.name for p in dataset_copy.rglob("*.json")) == before
    out = capsys.readouterr().out
    assert "mixtral-8x7b" in out and "dry run: nothing written" in out and "new" in out
    report = tmp_path / "report"
    assert main(["extract", "--model", "mixtral-8x7b", "--definitions", str(dataset_copy), "--report",
                 str(report)]) == 0
    data = json.loads((report / "extract-report.json").read_text())
    assert data["models"][0]["counts"].get("new", 0) > 0 and data["models"][0]["counts"].get("unchanged", 0) > 0
    assert "## Kernels shared across models" in (report / "extract-report.md").read_text()
    assert main(["extract", "--model", "nope", "--definitions", str(dataset_copy)]) == 2
