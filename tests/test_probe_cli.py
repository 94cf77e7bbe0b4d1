"""`horotopo probe` argument handling and the probe's settings (no MPI launch)."""
import pytest

from horotopo.cli import build_parser
from horotopo.probe import MODES, ProbeConfig


def test_probe_subcommand_is_registered():
    args = build_parser().parse_args(["probe", "-o", "t.json", "--quick"])
    assert args.output == "t.json" and args.quick and callable(args.func)
    args = build_parser().parse_args(["probe"])
    assert args.output is None and not args.quick and not args.json


@pytest.mark.parametrize("mode", sorted(MODES))
def test_presets_are_valid_and_quick_is_shorter(mode):
    cfg = ProbeConfig.for_mode(mode)
    assert cfg.mode == mode
    assert ProbeConfig.for_mode("quick").budget_s < ProbeConfig.for_mode("full").budget_s
    assert ProbeConfig.for_mode("quick").target_s < ProbeConfig.for_mode("full").target_s


@pytest.mark.parametrize("overrides, word", [
    ({"target_s": 0}, "target_s"), ({"max_bytes": 10}, "max_bytes"),
    ({"min_samples": 5, "max_samples": 2}, "min_samples"), ({"timeout_s": -1}, "timeout_s"),
    ({"tolerance": 2}, "tolerance"), ({"ping_reps": 0}, "ping_reps")])
def test_bad_settings_are_named(overrides, word):
    with pytest.raises(ValueError, match=word):
        ProbeConfig.for_mode("quick", **overrides)


def test_unknown_mode():
    with pytest.raises(ValueError, match="quick, full"):
        ProbeConfig.for_mode("slow")
