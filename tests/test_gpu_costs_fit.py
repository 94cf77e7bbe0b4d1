"""benchmarks/gpu_costs.py's fits recover the figures of rows made from known lines (no GPU)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_costs  # noqa: E402


def _rows():
    rows = [{"what": "reduce", "direction": "float32 sum", "bytes": b,
             "time_s": 5e-6 + b / 1e12} for b in gpu_costs.REDUCE_SIZES]
    for b in gpu_costs.COPY_SIZES:
        rows.append({"what": "staging copy", "direction": "device-to-host", "bytes": b,
                     "time_s": 8e-6 + b / 50e9})
        rows.append({"what": "staging copy", "direction": "host-to-device", "bytes": b,
                     "time_s": 6e-6 + b / 40e9})
    for path, per_msg in (("direct", 12e-6), ("staged", 30e-6)):
        for chunk in gpu_costs.CHAIN_CHUNKS:
            received = 512 * chunk
            rows.append({"what": "engine chain", "direction": path, "bytes": chunk,
                         "messages": 1024, "received_bytes": received,
                         "time_s": 1024 * per_msg + received / 1e12})
    return rows


def test_fits_recover_the_lines_the_rows_were_made_from():
    fig = gpu_costs.figures(_rows())
    assert fig["device_reduce_Bps"] == pytest.approx(1e12, rel=1e-6)
    assert fig["reduce_launch_s"] == pytest.approx(5e-6, rel=1e-6)
    # the profile takes the slower direction's rate and the larger fixed cost
    assert fig["staging_copy_Bps"] == pytest.approx(40e9, rel=1e-6)
    assert fig["staging_copy_s"] == pytest.approx(8e-6, rel=1e-6)
    assert fig["device_per_message_s"] == pytest.approx(12e-6, rel=1e-6)
    assert fig["staged_per_message_s"] == pytest.approx(30e-6, rel=1e-6)


def test_a_section_that_did_not_run_gives_no_figure():
    fig = gpu_costs.figures([r for r in _rows() if r["what"] != "staging copy"])
    assert "staging_copy_Bps" not in fig and "staging_copy_s" not in fig
    assert "device_reduce_Bps" in fig
