"""The network in the system description: transport classes, NCCL version, NIC counts; the
library model's all_to_all, broadcast and LL across nodes."""

from dataclasses import replace

import pytest

from tilecomm.sim import crossval as cv
from tilecomm.sim.ncclsim import DEFAULT, LL_MAX_BW, nccl_choice, nccl_rows
from tilecomm.topology import build, get_preset, spec_from_dict


def _with_transport(name, transport, **kw):
    s = get_preset(name)
    return s.with_(fabric=replace(s.fabric, transport=transport), **kw)


def test_transport_and_version_are_validated_with_the_valid_values():
    with pytest.raises(ValueError, match="fabric.transport must be one of ib, roce, efa"):
        spec_from_dict({"base": "dgx-h100", "fabric": {"transport": "infiniband"}})
    with pytest.raises(ValueError, match="nccl_version"):
        spec_from_dict({"base": "dgx-h100", "nccl_version": "latest"})
    s = spec_from_dict({"base": "dgx-h100", "nccl_version": "2.18.3-1",
                        "fabric": {"transport": "efa"}, "nics_per_node": 32, "nic_GBps": 12.5})
    assert (s.fabric.transport, s.nics_per_node, s.fabric.nodes_per_leaf) == ("efa", 32, 32)


def test_a_network_of_none_cannot_span_nodes():
    with pytest.raises(ValueError, match="transport is 'none'"):
        nccl_choice("all_reduce", 1024, build(_with_transport("dgx-h100", "none"), 2))
    assert nccl_choice("all_reduce", 1024, build(_with_transport("dgx-h100", "none"), 1))


def test_version_gates_the_algorithms_it_lacks():
    def algos(version, nodes=1, coll="all_reduce", gpus=None):
        t = build(get_preset("dgx-h100").with_(nccl_version=version), nodes, gpus)
        return {r.algo for r in nccl_rows(coll, 1 << 30, t)}
    assert "nvls" not in algos("2.16.5") and "nvls" in algos("2.17.1")
    assert "nvls_tree" not in algos("2.17.1", 2) and "nvls_tree" in algos("2.18.1", 2)
    assert "pat" not in algos("2.22.3", 8, "all_gather", 1)
    assert "pat" in algos("2.23.4", 8, "all_gather", 1) and "pat" in algos("", 8, "all_gather", 1)


def test_each_transport_class_has_its_own_per_hop_cost_and_efficiency():
    prm = DEFAULT
    ib = nccl_choice("all_reduce", 1024, build(_with_transport("dgx-h100", "ib"), 4), prm)
    tcp = nccl_choice("all_reduce", 1024, build(_with_transport("dgx-h100", "tcpxo"), 4), prm)
    roce = nccl_choice("all_reduce", 1024, build(_with_transport("dgx-h100", "roce"), 4), prm)
    assert tcp.time_us > ib.time_us == pytest.approx(roce.time_us)
    big = [nccl_choice("all_reduce", 8 << 30, build(_with_transport("dgx-h100", t), 4), prm,
                       ("ring",)) for t in ("ib", "efa")]
    assert big[1].bound == big[0].bound == "net"
    assert big[1].time_us / big[0].time_us == pytest.approx(DEFAULT.net["ib"].eff
                                                            / DEFAULT.net["efa"].eff, rel=0.02)


def test_many_nics_per_node_raise_the_network_bound():
    few = _with_transport("dgx-h100", "efa", nics_per_node=4, nic_GBps=12.5)
    many = _with_transport("dgx-h100", "efa", nics_per_node=32, nic_GBps=12.5)
    a, b = (nccl_choice("all_reduce", 8 << 30, build(s, 4), DEFAULT, ("ring",))
            for s in (few, many))
    assert a.bound == b.bound == "net" and a.time_us / b.time_us == pytest.approx(8, rel=0.05)


def test_ll_across_nodes_is_capped_as_ncclS_tuning_table():
    for nodes, cap in ((1, 0), (2, 1), (4, 2)):
        t = build("dgx-h100", nodes)
        ll = [r for r in nccl_rows("all_reduce", 64 << 10, t) if r.algo == "ring"
              and r.protocol == "LL"][0]
        n = t.world_size
        assert ll.bw_GBps * 2 * (n - 1) / n <= LL_MAX_BW["sm90"][cap] + 1e-9


def test_all_to_all_moves_each_gpus_remote_share_through_its_nics():
    one = nccl_choice("all_to_all", 1 << 30, build("dgx-h100", 1))
    two = nccl_choice("all_to_all", 1 << 30, build("dgx-h100", 2))
    assert (one.algo, one.bound, two.bound) == ("p2p", "nvlink", "net")
    # 2 nodes: half of a GPU's buffer leaves the node through one NIC (48.5 GB/s x eff)
    eff = DEFAULT.net["ib"].eff
    assert two.bw_GBps == pytest.approx(48.5 * eff / 0.5, rel=1e-6)


def test_broadcast_pays_one_hop_per_call_whatever_the_depth():
    t2, t16 = (nccl_choice("broadcast", 16, build("dgx-h100", n)) for n in (2, 16))
    assert t16.time_us == pytest.approx(t2.time_us, rel=1e-3)   # LL's cap differs a little
    ar2, ar16 = (nccl_choice("all_reduce", 16, build("dgx-h100", n)) for n in (2, 16))
    assert ar16.time_us > ar2.time_us


def test_an_unseen_network_class_gets_the_wider_band():
    bands = {"latency": {"q16": -0.2, "q84": 0.1},
             "unseen_network": {"latency": {"q16": -0.6, "q84": 0.3}}}
    lo, hi = cv.band_of(100.0, 1024, bands)
    ulo, uhi = cv.band_of(100.0, 1024, bands, unseen_network=True)
    assert ulo < lo < 100 < hi < uhi


def test_loso_reports_rows_of_an_unfitted_class_as_unseen():
    rows = [r for r in cv.published.load() if r.system == "gcp-a3-mega"]
    prm = cv.fit([r for r in cv.published.load() if r.transport_class != "tcpxo"])
    assert not prm.net_fitted("tcpxo") and prm.net_fitted("ib")
    checks = cv.evaluate(rows, prm)
    assert checks and all(not c.net_fitted for c in checks if c.row.nodes > 1)


def test_a_description_that_does_not_say_its_transport_gets_ib_and_the_wide_band(tmp_path):
    import json

    from tilecomm.sim.cli import main
    from tilecomm.topology import Fabric

    full = {k: v for k, v in get_preset("dgx-h100").__dict__.items()
            if k not in ("fabric", "sources", "protocols", "shm", "name")}
    full["name"] = "unsaid"
    unsaid = spec_from_dict({**full, "protocols": [p.__dict__ for p in
                                                   get_preset("dgx-h100").protocols]})
    assert unsaid.fabric == Fabric() and unsaid.fabric.transport == ""
    said = _with_transport("dgx-h100", "ib")
    t = [nccl_choice("all_reduce", 1 << 20, build(s, 4)).time_us for s in (unsaid, said)]
    assert t[0] == pytest.approx(t[1])
    rows = {}
    for name, spec in (("unsaid", unsaid), ("said", said)):
        path = tmp_path / f"{name}.json"
        d = {k: v for k, v in spec.__dict__.items() if k not in ("sources", "protocols", "shm")}
        d["fabric"] = spec.fabric.__dict__
        d["protocols"] = [p.__dict__ for p in spec.protocols]
        path.write_text(json.dumps(d))
        out = tmp_path / f"{name}-rows.json"
        assert main(["sim", "all_reduce", "--system", str(path), "--library", "nccl",
                     "--nodes", "4", "-b", "4K", "-e", "4K", "--json", str(out)]) == 0
        rows[name] = [r for r in json.loads(out.read_text())["predictions"] if r["best"]][0]
    u, s = rows["unsaid"], rows["said"]
    assert u["low_us"] <= s["low_us"] and u["high_us"] >= s["high_us"]
    assert (u["high_us"] - u["low_us"]) > (s["high_us"] - s["low_us"])
    assert "does not say its fabric.transport" in u["band_source"]
    assert "widened" not in s["band_source"]
