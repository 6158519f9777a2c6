"""Presets: systems with published numbers. Every parameter says where it comes from.

Bandwidths are per direction (vendor "bidirectional" figures halved). Protocol latencies are
NCCL's own tuning table (NVIDIA/nccl src/graph/tuning.cc, 2.19+: ``baseLat`` Ring
{LL 6.6, LL128 14.0, Simple 8.4} us; ``hwLat`` Ring NVLink {0.6, 1.9, 3.4}, PCI {1.0, 2.5, 5.7},
NET {2.7, 4.0, 14.0} us; NVLS NVLink 25 us). Protocol efficiencies: LL moves 8 data bytes per
16-byte line (0.5 of the Simple rate, NCCL ``busBw * .5``); LL128 moves 120 of 128 bytes (NCCL
``0.92``); Simple's efficiency is the measured large-message ring busbw over the line rate (cited
per system). See docs/model.md for the validation of these numbers against measurements.
"""

from __future__ import annotations

from .spec import Fabric, Protocol, ShmCost, SystemSpec

NCCL_TUNING = "NVIDIA/nccl src/graph/tuning.cc (baseLat/hwLat, Ring column)"


# NCCL enables LL128 by default only where the intra-node path is NVLink (tuning.cc,
# ncclTopoTuneModel: "Enable LL128 by default only on Volta/Ampere/Hopper+NVLink. Other cases are
# not tested and may cause silent data corruption", ``pEnable &= graphs[a]->typeIntra <=
# PATH_NVB`` and a compute-capability list of 70/80/90): PCIe systems get LL and Simple only.
LL128_NOTE = ("NVIDIA/nccl src/graph/tuning.cc ncclTopoTuneModel: LL128 enabled by default "
              "only on NVLink paths (typeIntra <= PATH_NVB), sm70/80/90")


def _gpu_protocols(simple_eff: float, fabric: str = "nvlink") -> tuple[Protocol, ...]:
    """NCCL's protocols with its ring latencies for ``fabric`` ('nvlink' or 'pci').

    LL / LL128 / Simple on NVLink; LL / Simple on PCIe (no LL128 there, see LL128_NOTE).
    """
    hop = {"nvlink": (0.6, 1.9, 3.4), "pci": (1.0, 2.5, 5.7)}[fabric]
    net = (2.7, 4.0, 14.0)
    ll = Protocol("LL", 0.5 * simple_eff, hop[0], net[0], 6.6)
    simple = Protocol("Simple", simple_eff, hop[2], net[2], 8.4)
    if fabric == "pci":
        return (ll, simple)
    return (ll, Protocol("LL128", 0.92 * simple_eff, hop[1], net[1], 14.0), simple)


# Rail-optimized leaf/spine of 64-port switches (NVIDIA QM9700: 64 x 400G ports): 32 nodes'
# rail-r NICs per leaf, 32 uplinks, non-blocking. Source: NVIDIA DGX SuperPOD reference arch.
SUPERPOD = Fabric(rail_optimized=True, nodes_per_leaf=32, leaves_per_pod=32,
                  oversubscription=1.0, levels=2, transport="ib")

# Per-collective host overhead as nccl-tests' timing loop sees it (kernel launch, enqueue,
# completion) beyond NCCL's latency constants: a software class, the same for every CUDA GPU
# preset. Value: ``host_us`` of ``python -m tilecomm.sim.calibrate --cross-validate`` fitted on
# every published system (sim/data/nccl_fit.json: 5.52 us).
CALL_OVERHEAD_US = 5.5
CALL_OVERHEAD_SRC = ("class 'CUDA collective call' host_us = 5.5 us: median over the published "
                     "one-node nccl-tests systems of the latency-regime residual (sim/crossval.py, "
                     "sim/data/nccl_fit.json; docs/model.md)")

# CX7 400 Gb/s = 50 GB/s line; 48.5 GB/s achievable per NIC (NVIDIA/nccl-tests#175, maintainer).
CX7_GBPS = 48.5


def dgx_a100() -> SystemSpec:
    return SystemSpec(
        name="dgx-a100", gpu="A100-SXM4-80GB", gpus_per_node=8, intra="nvswitch",
        gpu_link_GBps=300.0,      # NVLink3 600 GB/s bidirectional per GPU (A100 datasheet)
        mem_GBps=2039.0,          # HBM2e 2,039 GB/s (A100 80GB datasheet)
        reduce_GBps=600.0,        # ~HBM/3 (read 2, write 1); reductions are fused into copies
        nics_per_node=8, nic_GBps=24.5,  # 8x ConnectX-6 HDR 200 Gb/s (DGX A100 datasheet)
        # Simple: 232.5/300 = 0.775 (8x A100 all_reduce busbw 232.54 GB/s at 4 GB,
        # github.com/li-plus/playground cuda/nccl.md)
        protocols=_gpu_protocols(0.775), fabric=SUPERPOD, launch_us=CALL_OVERHEAD_US,
        sources={"gpu_link_GBps": "A100 datasheet", "Simple.eff": "li-plus/playground nccl.md",
                 "latencies": NCCL_TUNING, "launch_us": CALL_OVERHEAD_SRC})


def dgx_a800() -> SystemSpec:
    # A100's export variant: the same GPU with NVLink cut to 400 GB/s bidirectional
    # (200 GB/s per direction) instead of 600; the fabric efficiency is A100's (not measured
    # on A800). Used to compare with Flux's A800 results (docs/model.md).
    return dgx_a100().with_(
        name="dgx-a800", gpu="A800-SXM4-80GB", gpu_link_GBps=200.0,
        sources={"gpu_link_GBps": "NVIDIA A800 SXM4: NVLink 400 GB/s bidirectional",
                 "Simple.eff": "A100's (li-plus/playground nccl.md), not measured on A800",
                 "latencies": NCCL_TUNING, "launch_us": CALL_OVERHEAD_SRC})


def dgx_h100() -> SystemSpec:
    return SystemSpec(
        name="dgx-h100", gpu="H100-SXM5-80GB", gpus_per_node=8, intra="nvswitch",
        gpu_link_GBps=450.0,      # NVLink4 900 GB/s bidirectional per GPU (H100 datasheet)
        mem_GBps=3350.0,          # HBM3 3.35 TB/s (H100 SXM datasheet)
        reduce_GBps=1100.0,       # ~HBM/3
        nics_per_node=8, nic_GBps=CX7_GBPS,  # 8x ConnectX-7 400 Gb/s (DGX H100 datasheet)
        nvls=True,
        # NVLS all_reduce algbw ~275 GB/s on 8x H100 (busbw 480; NVIDIA/nccl-tests#212, sjeaugey)
        nvls_alg_GBps=275.0, nvls_us=25.0,   # NVLS hwLat NVLink 25 us (NCCL tuning.cc)
        # Simple: ring busbw 365-370 GB/s of 450 => 0.815 (NVIDIA/nccl-tests#212, nccl#1455)
        protocols=_gpu_protocols(0.815), fabric=SUPERPOD, launch_us=CALL_OVERHEAD_US,
        sources={"gpu_link_GBps": "H100 datasheet", "nvls_alg_GBps": "nccl-tests#212",
                 "Simple.eff": "nccl-tests#212 / nccl#1455", "nic_GBps": "nccl-tests#175",
                 "latencies": NCCL_TUNING, "launch_us": CALL_OVERHEAD_SRC})


def dgx_h800() -> SystemSpec:
    # H100's export variant: the same GPU with NVLink cut to 400 GB/s bidirectional (200 GB/s
    # per direction) instead of 900 (NVIDIA H800 SXM5 datasheet: "NVLink 400GB/s"); HBM3,
    # NICs and fabric as DGX H100. The fabric efficiency is H100's (not measured on H800):
    # 0.815 x 200 = 163 GB/s, which matches DeepEP's "~160 GB/s NVLink maximum bandwidth" on
    # H800 (deepseek-ai/DeepEP docs/legacy.md) without being fitted to it. Used to compare
    # `tilecomm sim moe` with DeepEP's published figures (docs/model.md).
    h = dgx_h100()
    return h.with_(
        name="dgx-h800", gpu="H800-SXM5-80GB", gpu_link_GBps=200.0,
        nvls_alg_GBps=h.nvls_alg_GBps * 200.0 / 450.0,
        sources={**h.sources,
                 "gpu_link_GBps": "NVIDIA H800 SXM5 datasheet: NVLink 400 GB/s bidirectional",
                 "Simple.eff": "H100's (nccl-tests#212 / nccl#1455), not measured on H800",
                 "nvls_alg_GBps": "the H100 measurement (nccl-tests#212) scaled by NVLink "
                                  "bandwidth 200/450; not measured",
                 "nic_GBps": "8x ConnectX-7 400 Gb/s as DGX H100 (nccl-tests#175: 48.5 "
                             "achievable)"})


def hgx_h200() -> SystemSpec:
    # Same NVLink4/NVSwitch fabric as H100 (H200 datasheet: NVLink 900 GB/s); HBM3e 4.8 TB/s.
    return dgx_h100().with_(
        name="hgx-h200", gpu="H200-SXM-141GB", mem_GBps=4800.0, reduce_GBps=1600.0,
        sources={"gpu_link_GBps": "H200 datasheet: NVLink 900 GB/s bidirectional (as H100)",
                 "mem_GBps": "H200 datasheet: HBM3e 4.8 TB/s",
                 "nvls_alg_GBps": "H100 measurement (nccl-tests#212), same NVLink4 fabric; "
                                  "not measured on H200",
                 "Simple.eff": "H100's (nccl-tests#212 / nccl#1455), not measured on H200",
                 "nic_GBps": "nccl-tests#175 (ConnectX-7)", "latencies": NCCL_TUNING,
                 "launch_us": CALL_OVERHEAD_SRC})


def dgx_b200() -> SystemSpec:
    # NVLink5 1.8 TB/s bidirectional per GPU (B200 datasheet); HBM3e 8 TB/s; 8x CX7 400G
    # (DGX B200 datasheet). Efficiencies are H100's (not yet validated on B200).
    return dgx_h100().with_(
        name="dgx-b200", gpu="B200", gpu_link_GBps=900.0, mem_GBps=8000.0,
        reduce_GBps=2600.0, nvls_alg_GBps=550.0,
        sources={"gpu_link_GBps": "B200 datasheet: NVLink5 1.8 TB/s bidirectional",
                 "mem_GBps": "B200 datasheet: HBM3e 8 TB/s",
                 "nvls_alg_GBps": "2x the H100 measurement (nccl-tests#212), scaled with "
                                  "NVLink bandwidth; not measured",
                 "Simple.eff": "H100's (nccl-tests#212 / nccl#1455), not validated on B200",
                 "nic_GBps": "DGX B200 datasheet (8x ConnectX-7 400G); 48.5 achievable per "
                             "nccl-tests#175",
                 "latencies": NCCL_TUNING + " (Hopper values, not re-checked for Blackwell)",
                 "launch_us": CALL_OVERHEAD_SRC})


def gb200_nvl72() -> SystemSpec:
    # One NVLink5 domain of 72 GPUs (GB200 NVL72 spec: 130 TB/s = 72 x 1.8 TB/s), modeled as one
    # "node"; one 400G NIC per GPU (compute tray: 4 GPUs, 4 CX7). nodes=N means N racks.
    b = dgx_b200()
    return b.with_(
        name="gb200-nvl72", gpu="GB200", gpus_per_node=72, nics_per_node=72,
        sources={**b.sources,
                 "gpus_per_node": "GB200 NVL72 spec: 72 GPUs in one NVLink domain, 130 TB/s",
                 "nvls_alg_GBps": "2x the 8x H100 measurement (nccl-tests#212); not measured, "
                                  "and on 72 GPUs rather than 8",
                 "nics_per_node": "one 400G NIC per GPU (compute tray: 4 GPUs, 4 CX7)"})


def pcie_8gpu() -> SystemSpec:
    return SystemSpec(
        name="pcie-8gpu", gpu="PCIe GPU (L40S-class)", gpus_per_node=8, intra="pcie",
        gpu_link_GBps=26.0,       # PCIe Gen4 x16: 31.5 GB/s raw, ~26 achievable (PCI-SIG; 128b/130b)
        mem_GBps=864.0,           # L40S GDDR6 864 GB/s (L40S datasheet)
        reduce_GBps=300.0,
        gpus_per_pcie_switch=4, pcie_uplink_GBps=26.0,  # 2 switches, Gen4 x16 uplinks
        nics_per_node=2, nic_GBps=24.5,                 # 2x 200G
        protocols=_gpu_protocols(0.85, "pci"),
        fabric=Fabric(rail_optimized=False, nodes_per_leaf=16, oversubscription=1.0,
                      transport="ib"),
        launch_us=CALL_OVERHEAD_US,
        sources={"gpu_link_GBps": "PCIe 4.0 x16", "latencies": NCCL_TUNING + " (PCI row)",
                 "launch_us": CALL_OVERHEAD_SRC,
                 "protocols": "LL, Simple; no LL128: " + LL128_NOTE})


# Fitted by `python -m tilecomm.sim.cpu_loop benchmarks/results/cpu_all_reduce_2ranks_user.json
# benchmarks/results/cpu_all_reduce_2ranks_heap.json` (one_shot and ring at every other measured
# size, 16 B, 256 B, 4 KiB, 64 KiB, 1 MiB, 16 MiB, 256 MiB, both memory modes: 28 of 104 rows;
# the measured sweep is 16 B .. 256 MiB by 4x; docs/model.md "Local loop"). Refitted 2026-12-04
# after the native runner (one C call per collective: no numpy calls, op_us 0): 2 ranks on a
# 2-core Intel Xeon VM (L2 2 MiB per core; the VM reports a 480 MiB L3). The fitted cache_bytes
# is the size where the rates change on this machine. Ranks outnumbering cores are not covered
# (their synchronizations wait for context switches: see the 4-rank table).
CPU_SHM_COST = ShmCost(call_us=2.52, sync_us=0.23, op_us=0.0, copy_cache_GBps=21.59,
                       add_cache_GBps=8.71, copy_dram_GBps=11.08, add_dram_GBps=7.20,
                       cache_bytes=39903169, piece_bytes=1 << 20,
                       single_copy_min_bytes=16 << 10)   # the runtime's default; not fitted
CPU_LOOP_COMMAND = ("python -m tilecomm.sim.cpu_loop "
                    "benchmarks/results/cpu_all_reduce_2ranks_{user,heap}.json")


def cpu_shm() -> SystemSpec:
    """This machine: ranks are processes, peers' buffers are POSIX shared memory.

    Registered algorithms are timed by the runtime's own cost model (``shm``, sim/cpu_loop.py);
    the flow-model fields below are its DRAM-regime equivalents for builder-only algorithms.
    """
    c = CPU_SHM_COST
    return SystemSpec(
        name="cpu-shm", gpu="CPU process", gpus_per_node=64, intra="shm",
        gpu_link_GBps=c.copy_dram_GBps,   # a peer's shm read is a memory copy
        mem_GBps=c.copy_dram_GBps,
        reduce_GBps=c.add_dram_GBps,
        nics_per_node=1, nic_GBps=1.2,    # 10 GbE between hosts (Gloo/TCP), not measured
        launch_us=c.call_us + c.sync_us,  # Python call + handshake per collective
        protocols=(Protocol("shm", 1.0, c.sync_us, 50.0, 0.0),),  # one flag wait per step
        fabric=Fabric(rail_optimized=False, nodes_per_leaf=48, transport="socket"),
        shm=c,
        sources={"shm": CPU_LOOP_COMMAND, "nic_GBps": "placeholder (10 GbE)"})


# --- AMD Instinct full-mesh nodes (intra "full_mesh": 8 GPUs, 7 Infinity Fabric / xGMI links
# each, one per peer; docs/system-description.md). Bandwidths per direction: AMD quotes "Peak
# Infinity Fabric Link Bandwidth" bidirectionally (128 GB/s on MI300X/MI325X = 2 x 64 GB/s, as the
# AMD ROCm blog "Understanding RCCL Bandwidth and xGMI Performance on AMD Instinct MI300X"
# (rocm.blogs.amd.com, 2025-03-02) tabulates: 64 GB/s per link and direction, 448 GB/s = 7 x 64
# aggregated unidirectional per GPU).
#
# Protocols carry RCCL's own latencies: ROCm/rccl src/graph/tuning.cc, ``baseLat`` {LL 12.0,
# LL128 12.0, Simple 17.0} us and ``tuning_model_5`` (the model RCCL's rome_models.cc topologies
# of 8 MI300X with 7 xGMI links select, and rcclGetTuningIndexForArch maps gfx942 to; gfx950
# maps to model 6, whose hwLat are the same): hwLat "NVLINK" (RCCL files xGMI as NVLink)
# Ring {LL 0.8, Simple 2.1} us, NET Ring LL 9.5 us, NET Tree Simple 25.0 us. Model 5's NET
# Ring/Simple 320 us is a tuner bias against ring Simple across nodes, not a per-hop latency, so
# the Simple protocol's network step uses the same table's Tree/Simple 25 us (sim/rcclsim.py keeps
# 320 for RCCL's choice). LL128 is not offered: RCCL enables it by default only on gfx90a
# (tuning.cc, RCCL 2.21) or where a topology hint / RCCL_LL128_FORCE_ENABLE turns it on.
RCCL_TUNING = ("ROCm/rccl src/graph/tuning.cc (RCCL 2.21-2.22 / ROCm 6.3; rocm-systems "
               "projects/rccl 2025): baseLat LL 12 / Simple 17 us, tuning_model_5 hwLat xGMI "
               "Ring LL 0.8 / Simple 2.1 us, NET Ring LL 9.5 us, NET Tree Simple 25 us")
RCCL_PROTOCOLS_SRC = ("LL and Simple only: LL128 enabled by default only on gfx90a "
                      "(ROCm/rccl tuning.cc, ENABLE_LL128 clause); LL eff 0.5 x Simple "
                      "(8 data bytes per 16-byte line, RCCL's ncclLLFifoLine as NCCL's)")
# 8x MI300X all_reduce busbw 318.98 GB/s at 16 GB (rccl-tests, RCCL 2.22.3, out-of-place) of 448
# GB/s per direction: 0.712 (AMD ROCm blog above; it explains the ceiling by xGMI's ~45-48 GB/s
# achievable per 64 GB/s link).
MI300X_SIMPLE_EFF = 0.712
# 400 Gb/s Ethernet NICs, one per GPU (AMD Instinct MI300X platform: 8 GPUs, 8x 400G scale-out NIC
# slots; OCI / TensorWave / Pollara-AINIC clusters run RoCE): 50 GB/s line per direction; the
# network class (ncclsim: roce) holds the achieved fraction.
AMD_NIC_GBPS = 50.0
AMD_FABRIC = Fabric(rail_optimized=True, nodes_per_leaf=32, leaves_per_pod=32,
                    oversubscription=1.0, levels=2, transport="roce")


def _rccl_protocols(simple_eff: float) -> tuple[Protocol, ...]:
    """RCCL's LL and Simple with its gfx942/gfx950 latencies (RCCL_TUNING)."""
    return (Protocol("LL", 0.5 * simple_eff, 0.8, 9.5, 12.0),
            Protocol("Simple", simple_eff, 2.1, 25.0, 17.0))


def mi300x() -> SystemSpec:
    return SystemSpec(
        name="mi300x", gpu="MI300X", gpus_per_node=8, intra="full_mesh",
        gpu_link_GBps=448.0,      # 7 xGMI links x 64 GB/s per direction (896 GB/s bidirectional)
        mem_GBps=5300.0,          # HBM3 5.3 TB/s (MI300X datasheet)
        reduce_GBps=1750.0,       # ~HBM/3 (read 2, write 1), as the NVIDIA presets
        nics_per_node=8, nic_GBps=AMD_NIC_GBPS,
        protocols=_rccl_protocols(MI300X_SIMPLE_EFF), fabric=AMD_FABRIC, launch_us=0.0,
        sources={"gpu_link_GBps": "AMD MI300X datasheet: 7 Infinity Fabric links to peers, "
                                  "128 GB/s peak per link (bidirectional) = 64 GB/s per "
                                  "direction; 448 GB/s aggregated unidirectional per GPU "
                                  "(AMD ROCm blog, mi300x-rccl-xgmi, 2025-03-02)",
                 "mem_GBps": "AMD MI300X datasheet: 192 GB HBM3, 5.3 TB/s",
                 "Simple.eff": "318.98 / 448: 8x MI300X all_reduce busbw at 16 GB, RCCL 2.22.3 "
                               "(AMD ROCm blog, mi300x-rccl-xgmi)",
                 "nic_GBps": "8x 400 Gb/s per node (one NIC per GPU, MI300X platform); "
                             "line rate, the network class holds the achieved fraction",
                 "fabric": "RoCE (AMD Pollara / Broadcom Thor2 / ConnectX-7 Ethernet "
                           "clusters); leaf/spine sizes assumed as SUPERPOD's",
                 "latencies": RCCL_TUNING, "protocols": RCCL_PROTOCOLS_SRC,
                 "launch_us": "0: RCCL's baseLat (12 us LL) already covers the launch; the "
                              "measured 8-GPU floor is 13.1 us (AMD blog sweep)"})


def mi325x() -> SystemSpec:
    # Same CDNA 3 die (gfx942) and Infinity Fabric as MI300X (AMD MI325X spec: 7 links, 128 GB/s
    # peak per link); HBM3E 256 GB at 6 TB/s.
    m = mi300x()
    return m.with_(
        name="mi325x", gpu="MI325X", mem_GBps=6000.0, reduce_GBps=2000.0,
        sources={**m.sources,
                 "gpu_link_GBps": "AMD MI325X spec: Infinity Fabric 128 GB/s peak per link "
                                  "(bidirectional), 7 peer links, as MI300X",
                 "mem_GBps": "AMD MI325X spec: 256 GB HBM3E, 6 TB/s",
                 "Simple.eff": "MI300X's (AMD ROCm blog, mi300x-rccl-xgmi); not measured on "
                               "MI325X"})


def mi355x() -> SystemSpec:
    # CDNA 4 (gfx950): AMD MI355X spec "Peak Infinity Fabric Link Bandwidth 153.6 GB/s", 7 peer
    # links = 1,075.2 GB/s bidirectional per GPU, 537.6 per direction; HBM3E 288 GB at 8 TB/s;
    # platforms pair each GPU with a 400G AMD Pensando Pollara NIC (RoCE).
    m = mi300x()
    return m.with_(
        name="mi355x", gpu="MI355X", gpu_link_GBps=537.6, mem_GBps=8000.0, reduce_GBps=2650.0,
        sources={**m.sources,
                 "gpu_link_GBps": "AMD MI355X spec: Infinity Fabric 153.6 GB/s peak per link "
                                  "(bidirectional), 7 peer links: 7 x 76.8 = 537.6 GB/s per "
                                  "direction (1,075 GB/s bidirectional)",
                 "mem_GBps": "AMD MI355X spec: 288 GB HBM3E, 8 TB/s",
                 "Simple.eff": "MI300X's (AMD ROCm blog, mi300x-rccl-xgmi); not measured on "
                               "MI355X",
                 "nic_GBps": "8x 400G AMD Pensando Pollara 400 AI NICs per node (MI355X "
                             "platforms, e.g. Dell XE9785); line rate"})


PRESETS = {
    "dgx-a100": dgx_a100, "dgx-a800": dgx_a800, "dgx-h100": dgx_h100, "dgx-h800": dgx_h800,
    "hgx-h200": hgx_h200, "dgx-b200": dgx_b200,
    "gb200-nvl72": gb200_nvl72, "pcie-8gpu": pcie_8gpu, "cpu-shm": cpu_shm,
    "mi300x": mi300x, "mi325x": mi325x, "mi355x": mi355x,
}


def preset_names() -> list[str]:
    return sorted(PRESETS)


def get_preset(name: str) -> SystemSpec:
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown system {name!r}; presets: {', '.join(preset_names())}, "
                         "or a path to a system description .json") from None
