"""GPU datasheets found by the names torch prints."""

from oppo.catalog.gpus import gpu_by_device_name


def test_gpu_names_as_torch_prints_them():
    names = {"NVIDIA GH200 480GB": "gh200", "NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100", "NVIDIA H20": "h20"}
    assert {n: gpu_by_device_name(n).name for n in names} == names
    assert gpu_by_device_name("Some Other Card") is None
