"""intra "full_mesh": every pair of a node's GPUs has its own link (AMD MI300X / MI325X / MI355X),
each carrying the GPU's total over its gpus_per_node - 1 links; the flow simulator runs on it."""

import json

import numpy as np
import pytest

from tilecomm.sim import predict
from tilecomm.topology import build, get_preset, load_system, spec_from_dict

MESH = {"name": "my-mesh", "gpu": "MI300X", "gpus_per_node": 8, "intra": "full_mesh",
        "gpu_link_GBps": 448.0, "mem_GBps": 5300.0, "reduce_GBps": 1750.0,
        "nics_per_node": 8, "nic_GBps": 50.0,
        "protocols": [{"name": "Simple", "eff": 0.7, "step_intra_us": 2.1, "step_net_us": 25.0,
                       "base_us": 17.0}]}


def test_every_pair_has_its_own_link():
    t = build("mi300x", nodes=2)
    assert t.path(0, 1) == ["mesh[0->1]"]
    assert t.path(1, 0) == ["mesh[1->0]"]                  # each direction its own link
    assert t.path(9, 15) == ["mesh[9->15]"]                # second node
    assert t.path(2, 2) == ["mem[2]"]
    assert t.path(0, 9)[0].startswith("nic_tx")            # other node: the network
    src, dst = np.meshgrid(np.arange(16), np.arange(16))
    same = (src // 8 == dst // 8) & (src != dst)
    links = t.paths(src[same], dst[same])
    assert (links[:, 1:] == -1).all()                      # one hop
    assert len(set(links[:, 0].tolist())) == 2 * 8 * 7     # 56 links per node, none shared
    caps = t.capacity[links[:, 0]]
    assert np.allclose(caps, 448.0 / 7)                    # 64 GB/s per link and direction


def test_link_counts_and_rates():
    for name, per_link in (("mi300x", 64.0), ("mi325x", 64.0), ("mi355x", 76.8)):
        s = get_preset(name)
        t = build(name, nodes=1)
        o, k = t.offset["mesh"], 8 * 7
        assert s.intra == "full_mesh" and s.gpus_per_node == 8
        assert np.allclose(t.capacity[o:o + k], per_link)
        assert per_link * 7 == pytest.approx(s.gpu_link_GBps)   # gpu_link_GBps is the total
        assert all(k in s.sources for k in ("gpu_link_GBps", "mem_GBps", "latencies"))
    t4 = build("mi300x", nodes=1, gpus=4)                  # 4 ranks use 12 of the links
    assert t4.path(0, 3) == ["mesh[0->3]"] and t4.path(3, 2) == ["mesh[3->2]"]
    assert t4.capacity[t4.offset["mesh"]] == 64.0
    assert build("dgx-h100").path(0, 1) == ["gpu_tx[0]", "gpu_rx[1]"]   # others unchanged


def test_user_description_json(tmp_path):
    f = tmp_path / "mesh.json"
    f.write_text(json.dumps(MESH))
    t = build(load_system(str(f)), nodes=2)
    assert t.path(3, 4) == ["mesh[3->4]"]
    s = load_system(str(f))
    assert s.intra == "full_mesh"
    assert spec_from_dict({"base": "mi300x", "gpu_link_GBps": 700.0}).intra == "full_mesh"


@pytest.mark.parametrize("change, msg", [
    ({"nvls": True, "nvls_alg_GBps": 100.0}, "has no switch"),
    ({"gpus_per_node": 1}, "gpus_per_node >= 2"),
    ({"gpus_per_pcie_switch": 4}, "pcie"),
    ({"pcie_uplink_GBps": 26.0}, "pcie"),
    ({"intra": "ring"}, "intra must be one of"),
])
def test_nonsense_is_refused(change, msg):
    with pytest.raises(ValueError, match=msg):
        spec_from_dict({**MESH, **change})


def test_direct_algorithms_beat_a_ring_on_a_mesh_not_on_nvswitch():
    big, small = 1 << 28, 1 << 10
    mesh = {p.algo: p for p in predict("all_reduce", big, system="mi300x")}
    nvs = {p.algo: p for p in predict("all_reduce", big, system="dgx-h100")}
    # a ring uses one of 7 links per neighbour pair; two_shot uses all 7 at once
    assert mesh["ring"].time_us > 4 * mesh["two_shot"].time_us
    assert mesh["one_shot"].time_us < mesh["ring"].time_us
    assert mesh["two_shot"].bottleneck == "mesh"
    assert nvs["ring"].time_us < 1.3 * nvs["two_shot"].time_us      # NVSwitch: a ring is fine
    assert predict("all_reduce", small, system="mi300x")[0].algo in ("one_shot", "two_shot")
    ag = {p.algo: p for p in predict("all_gather", big, system="mi300x")}
    assert ag["direct"].time_us < ag["ring"].time_us
    across = predict("all_reduce", big, system="mi300x", nodes=2)
    assert across and all(p.time_us > 0 for p in across)
