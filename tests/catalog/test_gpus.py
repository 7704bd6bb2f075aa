"""GPU datasheets found by the names torch prints."""

import dataclasses

from oppo.catalog.gpus import GPUS, gpu_by_device_name
from oppo.sim import SimConfig, load_setup, simulate
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


def test_the_cards_of_workstations_and_clouds_by_their_names():
    names = {
        "NVIDIA GeForce RTX 4090": "rtx4090",
        "NVIDIA GeForce RTX 3090": "rtx3090",
        "NVIDIA L4": "l4",
        "NVIDIA L40S": "l40s",
        "NVIDIA A10G": "a10g",
        "Tesla T4": "t4",
    }
    assert {n: gpu_by_device_name(n).name for n in names} == names
    assert GPUS["rtx4090"].peak_flops == 165.2e12 and GPUS["t4"].link_bytes_per_s == GPUS["l4"].link_bytes_per_s / 2
    for card in names.values():  # simulated at the datasheet and the default efficiencies (no operator profile)
        setup = dataclasses.replace(load_setup("paper-7b-h200"), gpu=card, cost="analytic", actor="qwen2.5-0.5b")
        result = simulate(SimConfig(setup.schedule(policy="sync", batch=8), setup, steps=1, seed=0))
        assert result.steps[0].step_s > 0, card
