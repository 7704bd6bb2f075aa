"""GPU datasheets found by the names torch prints."""

from oppo.catalog.gpus import GPUS, gpu_by_device_name
from oppo.sim.cost.gpu import gpu_efficiencies


def test_gpu_names_as_torch_prints_them():
    names = {
        "NVIDIA GH200 480GB": "gh200",
        "NVIDIA H200": "h200",
        "NVIDIA H100 80GB HBM3": "h100",
        "NVIDIA H800": "h800",
        "NVIDIA H20": "h20",
        "NVIDIA A100-SXM4-80GB": "a100",
        "NVIDIA A800-SXM4-80GB": "a800",
    }
    assert {n: gpu_by_device_name(n).name for n in names} == names
    assert gpu_by_device_name("Some Other Card") is None


def test_the_export_versions_are_their_originals_with_a_slower_link():
    """A800 and H800: the A100's and H100's compute, memory and fitted fractions, NVLink at 400 GB/s (200 a
    direction) for 600 and 900."""
    for export, original in (("a800", "a100"), ("h800", "h100")):
        e, o = GPUS[export], GPUS[original]
        assert (e.peak_flops, e.hbm_bytes_per_s, e.memory_bytes) == (o.peak_flops, o.hbm_bytes_per_s, o.memory_bytes)
        assert e.link_bytes_per_s == 200e9 < o.link_bytes_per_s
        assert gpu_efficiencies()[export].efficiency == gpu_efficiencies()[original].efficiency
