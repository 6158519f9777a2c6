"""``--library rccl``: RCCL's choices on AMD full-mesh nodes (MSCCL, then its tuner), the bound
each row names, and the CLI."""

import json

import pytest

from tilecomm.sim import published
from tilecomm.sim.cli import main
from tilecomm.sim.ncclsim import DEFAULT
from tilecomm.sim.rcclsim import rccl_choice, rccl_rows
from tilecomm.topology import build, get_preset


def test_choice_changes_with_size_on_one_node():
    t = build("mi300x")
    picks = {n: (r.algo, r.protocol) for n in (8, 1 << 10, 1 << 18, 1 << 20, 1 << 30)
             for r in [rccl_choice("all_reduce", n, t)]}
    assert picks[8] == ("ring", "LL")             # too few elements for an MSCCL file
    assert picks[1 << 10] == ("msccl", "LL")      # allreduce_pairs LL, 0..64 KiB
    assert picks[1 << 18] == ("msccl", "LL")      # 64 KiB..512 KiB
    assert picks[1 << 20] == ("msccl", "Simple")  # 512 KiB..16 MiB
    assert picks[1 << 30] == ("ring", "Simple")   # the tuner
    assert rccl_choice("all_gather", 1 << 10, t).protocol == "LL"
    assert rccl_choice("all_gather", 1 << 28, t).protocol == "Simple"


def test_respects_algos_and_versions():
    t = build("mi300x")
    assert {r.algo for r in rccl_rows("all_reduce", 1 << 20, t, algos=("ring",))} == {"ring"}
    assert rccl_choice("all_reduce", 1 << 20, t, algos=("tree",)).algo == "tree"
    old = build(get_preset("mi300x").with_(nccl_version="2.17.1"))
    assert rccl_choice("all_reduce", 1 << 20, old).algo == "ring"      # no MSCCL before 2.18
    assert rccl_choice("all_reduce", 1 << 20, build("mi355x")).algo != "msccl"   # gfx950
    assert rccl_choice("all_reduce", 1 << 20, build("mi300x", gpus=4)).algo != "msccl"
    with pytest.raises(ValueError, match="unknown algorithm"):
        rccl_rows("all_reduce", 1024, t, algos=("nvls",))
    with pytest.raises(ValueError, match="full-mesh"):
        rccl_rows("all_reduce", 1024, build("dgx-h100"))
    # one node of gfx942: no tree/Simple (tuning.cc); across nodes it is offered
    assert ("tree", "Simple") not in {(r.algo, r.protocol)
                                      for r in rccl_rows("all_reduce", 1 << 26, t)}
    two = build("mi300x", nodes=2)
    assert ("tree", "Simple") in {(r.algo, r.protocol)
                                  for r in rccl_rows("all_reduce", 1 << 26, two)}


def test_bounds_name_the_class_parameter():
    one = rccl_choice("all_reduce", 1 << 30, build("mi300x"))
    assert one.bound == "mesh"
    assert one.busbw_GBps == pytest.approx(448 * DEFAULT.mesh_eff, rel=0.03)
    assert rccl_choice("all_reduce", 1024, build("mi300x")).bound == "latency"
    # a thin network: the ring is NIC-bound across nodes
    thin = build(get_preset("mi300x").with_(nics_per_node=1), nodes=2)
    assert rccl_choice("all_reduce", 1 << 30, thin).bound == "net"
    faster = rccl_choice("all_reduce", 1 << 30, build("mi300x"), DEFAULT.with_(mesh_eff=0.9))
    assert faster.time_us < one.time_us


def test_published_amd_rows_load_and_bandwidth_is_close():
    rows = [r for r in published.load() if r.library == "rccl"]
    assert {r.system for r in rows} >= {"mi300x-amd-blog", "mi300x-ainic-2node"}
    big = [r for r in rows if r.regime == "bandwidth"]
    for r in big:
        p = rccl_choice(r.collective, r.nbytes, r.topo(), DEFAULT, r.algos)
        assert abs(p.time_us - r.time_us) / r.time_us < 0.1


def test_cli_rows_and_errors(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["sim", "all_reduce", "--system", "mi300x", "--library", "rccl",
                 "-b", "1K", "-e", "1G", "-f", "1024", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "msccl" in text and "RCCL's choice" in text
    rows = json.loads(out.read_text())["predictions"]
    best = [r for r in rows if r["best"]]
    assert [r["algo"] for r in best] == ["msccl", "msccl", "ring"]
    assert all(r["library"] == "rccl" for r in rows)
    with pytest.raises(SystemExit):
        main(["sim", "all_reduce", "--system", "mi300x", "--library", "nccl", "-b", "1K",
              "-e", "1K"])
    assert "use --library rccl" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sim", "all_reduce", "--system", "dgx-h100", "--library", "rccl", "-b", "1K",
              "-e", "1K"])
    assert "use --library nccl" in capsys.readouterr().err
