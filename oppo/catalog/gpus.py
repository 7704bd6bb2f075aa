"""GPU datasheets: memory bandwidth, dense BF16 peak, memory, intra-node link. One table for both backends (the
simulator's cost model, the executor's MFU). Dense figures, no sparsity, from the vendors' datasheets:
NVIDIA A100 (40 / 80 GB SXM), H100 SXM, H200 SXM, GH200 (96 GB HBM3), HGX B200 (per GPU), H20 (96 GB: 148
TFLOP/s dense BF16, 4.0 TB/s, NVLink 4), A800 and H800 (80 GB SXM: the A100's and H100's compute and memory, NVLink
at 400 GB/s), A40, L40S; AMD Instinct MI300X. Cards research RL also runs on (a TinyZero reproduction on one RTX
4090): GeForce RTX 4090 and RTX 3090 (the Ada and Ampere GA102 whitepapers' dense FP16/BF16 tensor figures with FP32
accumulate, as PyTorch runs them: 165.2 and 71 TFLOP/s), L4 (121 TFLOP/s dense BF16, 300 GB/s, 24 GB), A10G (AWS's
variant of the A10, which has no datasheet of its own: the A10's 125 TFLOP/s, 600 GB/s, 24 GB [assumed]) and T4
(65 TFLOP/s FP16: Turing has no BF16, so a BF16 run there runs FP16 or FP32; 320 GB/s, 16 GB).

The link is the GPU-to-GPU bandwidth within a node, per GPU and per direction (half the bidirectional figure the
datasheets print): NVLink 3 (A100) 600 GB/s, NVLink 4 (H100, H200, GH200, H20) 900 GB/s, NVLink 5 (B200) 1.8 TB/s,
A800 and H800 400 GB/s,
MI300X Infinity Fabric 896 GB/s over its seven peer links; A40, L40S, L4, A10G and the GeForce cards talk over PCIe
4.0 x16 (32 GB/s a direction; the RTX 3090's two-card NVLink bridge aside), T4 over PCIe 3.0 x16 (16 GB/s).
Between nodes each GPU has a network card of its own in the vendors' reference systems (``nic_bytes_per_s``, per GPU
per direction): DGX H100 / H200 / GH200 NVL and DGX B200 one ConnectX-7 400 Gb/s NDR per GPU (50 GB/s); DGX A100 one
ConnectX-6 200 Gb/s HDR per GPU (25 GB/s); MI300X platforms (AMD Instinct MI300X platform guide) one 400 Gb/s NIC per
GPU (50 GB/s); PCIe servers with A40 / L40S commonly one 200 Gb/s NIC per two GPUs (12.5 GB/s per GPU). A node's
bandwidth is eight of them, and a collective's k GPUs in a node use k of them (NCCL's rings, one channel a card).
A setup's ``[cluster] inter_node_bytes_per_s`` overrides it (:class:`oppo.sim.cost.gpu.Cluster`).

The host link (``host_bytes_per_s``, per GPU per direction, half the bidirectional figure the datasheets print) carries
offloaded parameters and a sleeping rollout engine's weights: PCIe 4.0 x16 (A100, A800, A40, L40S) 32 GB/s, PCIe 5.0
x16 (H100, H200, H800, H20, HGX B200, MI300X) 64 GB/s, GH200's NVLink-C2C 450 GB/s (900 GB/s bidirectional). A
datasheet figure, a prior that a calibration's fitted share of it scales (what pinned or pageable copies achieve).

The datasheet's peak is not what a GPU's matrix products reach. ``matmul_flops`` is the measured maximum achievable
matmul FLOP/s (BF16, the best shape a brute-force search found, the cache reset between runs, a mean of 100
iterations), from Stas Bekman's "Machine Learning Engineering" (github.com/stas00/ml-engineering,
compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table", commit 744d01e of 2026-08-22):
A100 SXM 271.2 TFLOP/s, GH200 828.6, H100 SXM 794.5 ("H200 is the same"), B200 SXM 1745.0 (CUDA 12.6-12.8), MI300X
668.4 (ROCm 6.3, PyTorch 2.5.1, TunableOp); 87%, 84%, 80%, 78% and 51% of the datasheet peaks. (The table's
earlier version, which did not reset the cache and so reads high, had the MI300X at 781.9 on ROCm 6.2 and 450 on
ROCm 6.1: its GEMMs have moved with each ROCm.) 0 where none was measured. The cost stack scales a profiled GPU's
fitted fractions by the ratio of two GPUs' such shares to price one that has no profile
(:func:`oppo.sim.cost.gpu.gpu_efficiencies`).

The simulator's cost stack (:mod:`oppo.sim.cost`) starts from this datasheet.
"""

from __future__ import annotations

from dataclasses import dataclass

# a x16 slot per direction as the GPU datasheets print it (A100: "PCIe Gen4: 64 GB/s", H100: "PCIe Gen5: 128 GB/s",
# both ways; the line rate after 128b/130b coding is 31.5 and 63 GB/s): PCIe 4.0, the common host link, and 5.0
PCIE4_X16_BYTES_PER_S = 32e9
PCIE5_X16_BYTES_PER_S = 64e9


@dataclass(frozen=True)
class GPU:
    name: str
    hbm_bytes_per_s: float  # datasheet memory bandwidth
    peak_flops: float  # datasheet dense BF16 FLOP/s
    memory_bytes: float
    link_bytes_per_s: float  # intra-node GPU-to-GPU link, per GPU per direction (NVLink, Infinity Fabric, PCIe)
    nic_bytes_per_s: float = 0.0  # inter-node network per GPU per direction, the reference system's (0: none known)
    matmul_flops: float = 0.0  # measured max achievable BF16 matmul FLOP/s (0: not measured)
    host_bytes_per_s: float = 0.0  # host <-> GPU link per direction (PCIe, NVLink-C2C); 0: none known (PCIe 4.0 x16)

    @property
    def host_link_bytes_per_s(self) -> float:
        """The host link per direction: the datasheet's, else a PCIe 4.0 x16 slot's."""
        return self.host_bytes_per_s or PCIE4_X16_BYTES_PER_S

    @property
    def matmul_frac(self) -> float:
        """The share of the datasheet peak a matrix product reaches at best (0: not measured)."""
        return self.matmul_flops / self.peak_flops


PCIE4, PCIE5 = PCIE4_X16_BYTES_PER_S, PCIE5_X16_BYTES_PER_S
GPUS = {
    g.name: g
    for g in (
        GPU("b200", 8.0e12, 2250e12, 180e9, 900e9, 50e9, matmul_flops=1745.0e12, host_bytes_per_s=PCIE5),
        GPU(
            "h200", 4.8e12, 989e12, 141e9, 450e9, 50e9, matmul_flops=794.5e12, host_bytes_per_s=PCIE5
        ),  # "H200 is the same"
        GPU("h100", 3.35e12, 989e12, 80e9, 450e9, 50e9, matmul_flops=794.5e12, host_bytes_per_s=PCIE5),
        # the H100's die with NVLink cut to 400 GB/s (export version); its network card as the H100's [assumed]
        GPU("h800", 3.35e12, 989e12, 80e9, 200e9, 50e9, host_bytes_per_s=PCIE5),
        # its network card: HGX H20 servers are built as HGX H100 ones, a 400 Gb/s card per GPU [assumed]
        GPU("h20", 4.0e12, 148e12, 96e9, 450e9, 50e9, host_bytes_per_s=PCIE5),
        GPU(
            "gh200", 4.0e12, 989e12, 96e9, 450e9, 50e9, matmul_flops=828.6e12, host_bytes_per_s=450e9
        ),  # measured: the 141 GB HBM3e one
        GPU("mi300x", 5.3e12, 1307.4e12, 192e9, 448e9, 50e9, matmul_flops=668.4e12, host_bytes_per_s=PCIE5),
        GPU("a100", 2.039e12, 312e12, 80e9, 300e9, 25e9, matmul_flops=271.2e12, host_bytes_per_s=PCIE4),
        GPU(
            "a100-40gb", 1.555e12, 312e12, 40e9, 300e9, 25e9, matmul_flops=271.2e12, host_bytes_per_s=PCIE4
        ),  # the A100 SXM's silicon
        # the A100's die with NVLink cut to 400 GB/s (export version); its network card as the A100's [assumed]
        GPU("a800", 2.039e12, 312e12, 80e9, 200e9, 25e9, host_bytes_per_s=PCIE4),
        GPU("l40s", 0.864e12, 362.05e12, 48e9, 32e9, 12.5e9, host_bytes_per_s=PCIE4),
        GPU("a40", 0.696e12, 149.7e12, 48e9, 32e9, 12.5e9, host_bytes_per_s=PCIE4),
        # NVIDIA L20 datasheet: 48 GB GDDR6 at 864 GB/s, 119.5 TFLOP/s dense FP16/BF16 tensor, PCIe 4.0 x16 and no
        # NVLink (GPUs talk over PCIe); its network card as the L40S's [assumed]
        GPU("l20", 0.864e12, 119.5e12, 48e9, PCIE4, 12.5e9, host_bytes_per_s=PCIE4),
        # cards of workstations and clouds: one PCIe slot each, no network card of a reference system
        GPU("rtx4090", 1.008e12, 165.2e12, 24e9, PCIE4, host_bytes_per_s=PCIE4),
        GPU("rtx3090", 0.936e12, 71e12, 24e9, PCIE4, host_bytes_per_s=PCIE4),
        GPU("l4", 0.300e12, 121e12, 24e9, PCIE4, host_bytes_per_s=PCIE4),
        GPU("a10g", 0.600e12, 125e12, 24e9, PCIE4, host_bytes_per_s=PCIE4),  # the A10's datasheet [assumed]
        GPU("t4", 0.320e12, 65e12, 16e9, PCIE4 / 2, host_bytes_per_s=PCIE4 / 2),  # FP16; PCIe 3.0 x16
        # One CPU core of this project's development machine running the executor's tiny models (float32):
        # "bandwidth" and "FLOP/s" here are effective figures to be replaced by a calibrated profile; its "link"
        # is the cores' shared memory.
        GPU("cpu-core", 10e9, 20e9, 24e9, 10e9),
    )
}

# Names as torch.cuda.get_device_name() prints them -> table entries (first match wins)
DEVICE_NAMES = (
    ("B200", "b200"),
    ("GH200", "gh200"),  # before H200, which its name contains
    ("H200", "h200"),
    ("H100", "h100"),
    ("H800", "h800"),
    ("H20", "h20"),  # after H200, whose name contains it
    ("MI300X", "mi300x"),
    ("A100-SXM4-40GB", "a100-40gb"),
    ("A100", "a100"),
    ("A800", "a800"),
    ("L40S", "l40s"),
    ("A40", "a40"),
    ("L20", "l20"),
    ("RTX 4090", "rtx4090"),
    ("RTX 3090", "rtx3090"),
    ("A10G", "a10g"),
    ("L4", "l4"),  # after L40S, whose name contains it
    ("T4", "t4"),
)


def gpu_by_device_name(device_name: str) -> GPU | None:
    """The datasheet of a device as CUDA names it (e.g. "NVIDIA H100 80GB HBM3"), or None if unknown."""
    return next((GPUS[key] for marker, key in DEVICE_NAMES if marker in device_name), None)
