import json

import numpy as np
import pytest

from tilecomm.topology import build, get_preset, load_system, preset_names, spec_from_dict


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_builds_and_composes_with_nodes(name):
    spec = get_preset(name)
    t1 = build(name, nodes=1)
    t4 = build(name, nodes=4)
    assert t1.world_size == spec.gpus_per_node
    assert t4.world_size == 4 * spec.gpus_per_node
    assert (t4.capacity > 0).all()
    # A path between nodes uses the NICs; inside a node it does not.
    assert t4.path(0, t4.world_size - 1)[0].startswith("nic_tx")
    if spec.gpus_per_node > 1:
        assert not any(k.startswith("nic") for k in t4.path(0, 1))


def test_paths_dgx_h100_rail_optimized():
    t = build("dgx-h100", nodes=64)
    assert t.path(0, 1) == ["gpu_tx[0]", "gpu_rx[1]"]
    assert t.path(3, 8 + 3) == ["nic_tx[3]", "nic_rx[11]"]          # same rail, same leaf
    assert t.path(3, 8 * 40 + 3)[1].startswith("leaf_up")              # other leaf
    assert t.path(3, 8 + 4)[1].startswith("leaf_up")                   # other rail: spine
    assert t.path(5, 5) == ["mem[5]"]


def test_pcie_paths_cross_switch_uplinks():
    t = build("pcie-8gpu", nodes=1)
    assert t.path(0, 1) == ["gpu_tx[0]", "gpu_rx[1]"]
    assert t.path(0, 5) == ["gpu_tx[0]", "sw_up[0]", "sw_down[1]", "gpu_rx[5]"]


def test_vectorized_paths_scale():
    t = build("dgx-h100", nodes=1024)
    r = np.arange(t.world_size)
    p = t.paths(r, (r + 1) % t.world_size)
    assert p.shape == (8192, 6)
    assert t.crosses_net(p).sum() == 1024


def test_system_description_json(tmp_path):
    d = {"name": "my-h100", "base": "dgx-h100", "nics_per_node": 4,
         "fabric": {"rail_optimized": False, "oversubscription": 2.0}}
    f = tmp_path / "sys.json"
    f.write_text(json.dumps(d))
    s = load_system(str(f))
    assert s.nics_per_node == 4 and s.fabric.oversubscription == 2.0
    assert s.gpu_link_GBps == get_preset("dgx-h100").gpu_link_GBps
    with pytest.raises(ValueError, match="unknown"):
        spec_from_dict({"base": "dgx-h100", "nic_speed": 1})


def test_example_system_file_loads():
    s = load_system("examples/systems/h100-2to1-cluster.json")
    t = build(s, nodes=64)
    assert t.world_size == 64 * s.gpus_per_node


def test_unknown_preset_lists_presets():
    with pytest.raises(ValueError, match="dgx-h100"):
        get_preset("dgx-z900")
