"""Model parameter counts against published totals; layout validation; group placement."""

import json

import pytest

from tilecomm.workloads.comm import Placement, place
from tilecomm.workloads.layout import Layout, groups, validate
from tilecomm.workloads.models import PRESETS, load_model

# Published totals (billions): Llama 3 model cards (8.03 / 70.6 / 405), GPT-3 paper (175.0),
# Mixtral paper (46.7 total, 12.9 active), DeepSeek-V3 report (671 total, 37 active), Llama 2
# paper (6.7 / 13.0 / 69.0), Qwen3 model cards (30.5 / 3.3, 235 / 22), GPT-OSS model card
# (116.8 total; its 5.1B active leaves out the input embedding: + 0.58B here).
PUBLISHED = {"llama3-8b": (8.03, 8.03), "llama3-70b": (70.6, 70.6),
             "llama3-405b": (405.0, 405.0), "gpt3-175b": (175.0, 175.0),
             "mixtral-8x7b": (46.7, 12.9), "deepseek-v3": (671.0, 37.0),
             "llama2-7b": (6.74, 6.74), "llama2-13b": (13.0, 13.0), "llama2-70b": (69.0, 69.0),
             "qwen3-30b-a3b": (30.5, 3.3), "qwen3-235b-a22b": (235.0, 22.0),
             "gpt-oss-120b": (116.8, 5.1 + 201088 * 2880 / 1e9)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_counts_match_published(name):
    m = PRESETS[name]
    total, active = PUBLISHED[name]
    assert m.total_params() / 1e9 == pytest.approx(total, rel=0.01)
    assert m.active_params() / 1e9 == pytest.approx(active, rel=0.025)


def test_llama3_70b_exact_count_and_flops():
    m = PRESETS["llama3-70b"]
    assert m.total_params() == 70_553_706_496
    # 2 FLOPs per matmul weight; the input embedding is a lookup.
    assert m.matmul_flops_per_token() == 2 * (m.total_params() - 128256 * 8192)
    # Attention: 2 * s * heads * (qk + v) per layer, halved when causal.
    assert m.attn_flops_per_token(8192) == 2 * 8192 * 64 * 256 * 80
    assert m.attn_flops_per_token(8192, causal=True) == 8192 * 64 * 256 * 80


def test_kv_cache_bytes():
    assert PRESETS["llama3-70b"].kv_bytes_per_token() == 80 * 2 * 8 * 128 * 2   # GQA
    assert PRESETS["deepseek-v3"].kv_bytes_per_token() == 61 * (512 + 64) * 2    # MLA latent


def test_model_file_loads_and_names_bad_fields(tmp_path):
    good = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 100}
    p = tmp_path / "tiny.json"
    p.write_text(json.dumps(good))
    m = load_model(str(p))
    assert m.name == "tiny" and m.total_params() == (
        2 * (64 * (4 + 4) * 16 + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 2 * 100 * 64 + 64)
    p.write_text(json.dumps({**good, "layerz": 3}))
    with pytest.raises(ValueError, match="unknown field.*layerz"):
        load_model(str(p))
    p.write_text(json.dumps({k: v for k, v in good.items() if k != "ffn"}))
    with pytest.raises(ValueError, match="missing field.*ffn"):
        load_model(str(p))
    p.write_text(json.dumps({**good, "heads": 3}))
    with pytest.raises(ValueError, match="kv_heads"):
        load_model(str(p))
    with pytest.raises(ValueError, match="unknown model 'llama9'.*llama3-70b"):
        load_model("llama9")


@pytest.mark.parametrize("kw, msg", [
    (dict(tp=8, pp=2, dp=4), "does not equal the 32 GPUs"),
    (dict(tp=16, dp=2), "exceeds the 8 GPUs"),
    (dict(tp=2, pp=2, dp=8, ep=2), "needs an MoE model"),
    (dict(tp=1, pp=1, dp=32, vpp=2), "needs pp > 1"),
    (dict(tp=1, pp=64, dp=1), "does not equal"),
    (dict(tp=8, pp=4, dp=1, sp=False, tp_overlap=True), "needs sequence parallelism"),
])
def test_invalid_layouts_say_why(kw, msg):
    with pytest.raises(ValueError, match=msg):
        validate(Layout(**kw), PRESETS["llama3-70b"], 32, 8)


def test_moe_layout_constraints():
    m = PRESETS["mixtral-8x7b"]
    validate(Layout(tp=2, dp=8, ep=8), m, 16, 8)
    with pytest.raises(ValueError, match="must divide the 8 experts"):
        validate(Layout(tp=1, dp=16, ep=16), m, 16, 8)
    with pytest.raises(ValueError, match="must divide cp\\*dp"):
        validate(Layout(tp=4, dp=4, ep=8), m, 16, 8)


def test_placement_tp_inside_node_dp_across():
    g = groups(Layout(tp=8, pp=4, dp=32), 8)
    assert g.tp == Placement(8, 1, 8)
    assert g.dp == Placement(32, 32, 1)            # one rank per node, own NIC rail
    assert g.pp_cross_node
    g = groups(Layout(tp=2, pp=1, dp=16), 8)
    assert g.dp == Placement(16, 4, 4)             # 4 DP members share a node
    assert not groups(Layout(tp=2, pp=4, dp=1), 8).pp_cross_node
    assert place(4, 2, 8) == Placement(4, 1, 4)
