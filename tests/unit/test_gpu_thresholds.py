"""orchestrator.gpu.thresholds: the shipped table, overlays, and clear errors for bad files."""

from __future__ import annotations

import pytest

from orchestrator.gpu.thresholds import ThresholdsError, load_thresholds, parse_thresholds, shipped_text


def test_shipped_table():
    t = load_thresholds(env={})
    assert t.tolerance == 0.10 and {"h100", "h200", "a100", "l40s", "gb10"} <= set(t.models)
    h200 = t.for_model("h200")
    assert h200.measured and h200.bf16_gemm_tflops == 550 and h200.hbm_copy_gbps == 3200
    assert not t.for_model("h100").measured and not t.for_model("gb10").measured
    assert t.for_model("gb10").bf16_gemm_tflops is None
    # one GPU: never an all_reduce threshold; 3 GPUs use the 2-GPU entry, 16 the 8-GPU one
    assert h200.nccl_min(1) is None and h200.nccl_min(2) == 250 and h200.nccl_min(3) == 250
    assert h200.nccl_min(8) == 400 and h200.nccl_min(16) == 400 and h200.nccl_min(2, nvlink=False) == 15
    assert t.for_model("l40s").nccl_min(8) is None and t.for_model("l40s").nccl_min(8, nvlink=False) == 8
    assert t.sources == ("built-in data/gpu-thresholds.yaml",)


def test_unknown_model_in_a_file(tmp_path):
    """A copy of the shipped file with a model 'h300' added: a clear error naming the file."""
    p = tmp_path / "gpu.yaml"
    p.write_text(shipped_text() + "  h300:\n    Measured: false\n    Bf16GemmTflops: 900\n")
    with pytest.raises(ThresholdsError) as e:
        load_thresholds(p)
    assert str(e.value) == (
        f"bad GPU thresholds: {p}: Models.h300: unknown GPU model 'h300' (known: "
        + str(e.value).split("(known: ", 1)[1]
    )
    assert "h200" in str(e.value).split("(known: ", 1)[1]


def test_every_problem_listed(tmp_path):
    """A file with a mistyped field, a negative GEMM figure, a one-GPU NCCL entry, a missing Measured,
    an unknown top-level key and a tolerance of 1.5."""
    text = """
TolerancePerNode: 1.5
Colour: blue
Models:
  h100:
    Measured: true
    Bf16GemmTflop: 700
  a100:
    Measured: false
    HbmCopyGBps: -3
    NcclAllReduceBusBwGBps: {1: 10}
  l40s: {}
"""
    with pytest.raises(ThresholdsError) as e:
        parse_thresholds(text, "x.yaml")
    probs = e.value.problems
    assert "x.yaml: TolerancePerNode: Input should be less than 1 (got 1.5)" in probs
    assert "x.yaml: Colour: unknown field" in probs
    assert "x.yaml: Models.h100.Bf16GemmTflop: unknown field" in probs
    assert any(p.startswith("x.yaml: Models.a100.HbmCopyGBps: Input should be greater than 0") for p in probs)
    assert any("Models.a100.NcclAllReduceBusBwGBps" in p and "start at 2 GPUs" in p for p in probs)
    assert any(p.startswith("x.yaml: Models.l40s.Measured: Field required") for p in probs)
    assert str(e.value).startswith(f"bad GPU thresholds: {len(probs)} problems\n  - x.yaml:")


@pytest.mark.parametrize(
    "text, match",
    [
        ("Models: [", "not YAML"),
        ("- a\n- b\n", "expected a mapping with Models"),
        ("Models:\n  h100: {Measured: true, NcclAllReduceBusBwGBpsPcie: {2: 0}}\n", "bus bandwidth must be > 0"),
        ("Models: [h100]\n", "Models: Input should be a valid dictionary"),
    ],
)
def test_bad_files(text, match):
    with pytest.raises(ThresholdsError, match=match):
        parse_thresholds(text, "f.yaml")


def test_overlay(tmp_path):
    """An overlay replacing h200 (PCIe-only lab figures) and setting a 5% tolerance; then one without
    a tolerance keeps the shipped 10%; then a file that cannot be read."""
    p = tmp_path / "over.yaml"
    p.write_text("TolerancePerNode: 0.05\nModels:\n  h200: {Measured: true, Source: lab, Bf16GemmTflops: 700}\n")
    t = load_thresholds(env={"HP_GPU_THRESHOLDS": str(p)})
    assert t.tolerance == 0.05 and t.for_model("h200").bf16_gemm_tflops == 700
    assert t.for_model("h200").hbm_copy_gbps is None and t.for_model("h200").origin == str(p)
    assert t.for_model("h100").bf16_gemm_tflops == 550 and t.sources[-1] == str(p)
    p.write_text("Models:\n  h200: {Measured: true}\n")
    assert load_thresholds(p).tolerance == 0.10
    with pytest.raises(ThresholdsError, match="cannot read"):
        load_thresholds(tmp_path / "missing.yaml")


def test_model_without_thresholds():
    t = parse_thresholds("Models: {}\n", "empty.yaml")
    with pytest.raises(
        ThresholdsError, match=r"no GPU thresholds for model 'h200' in empty.yaml \(models there: none\)"
    ):
        t.for_model("h200")
