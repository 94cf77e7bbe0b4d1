"""horotopo-run: flag parsing, MPI detection and the generated command lines (no MPI needed).

The detection is faked by building MPI values, or by pointing HOROTOPO_MPIEXEC at a script that
prints another MPI's version banner.
"""
import json
import logging
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from horotopo_launch import cli
from horotopo_launch.mpi import (MPI, Job, LaunchError, command_line, detect,
                                 emulated_command_line, format_command, identify)

MPICH = MPI("mpich", "/opt/mpich/bin/mpiexec", "5.0.2")
OMPI5 = MPI("openmpi", "/opt/ompi/bin/mpirun", "5.0.3")
OMPI4 = MPI("openmpi", "/opt/ompi/bin/mpirun", "4.1.5")

HYDRA_BANNER = """HYDRA build details:
    Version:                                 5.0.2
    Release Date:                            Fri Sep 25 20:45:26 UTC 2026
"""
OMPI_BANNER = "mpirun (Open MPI) 5.0.3\n\nReport bugs to https://www.open-mpi.org/community/help/\n"


def test_identify_banners():
    assert identify(HYDRA_BANNER) == ("mpich", "5.0.2")
    assert identify(OMPI_BANNER) == ("openmpi", "5.0.3")
    assert identify("mpirun (OpenRTE) 4.1.5\n") == ("openmpi", "4.1.5")
    with pytest.raises(LaunchError, match="cannot tell which MPI"):
        identify("Intel(R) MPI Library for Linux* OS, Version 2021")


def _fake_mpiexec(tmp_path: Path, banner: str) -> str:
    path = tmp_path / "mpirun"
    path.write_text("#!/bin/sh\ncat <<'EOF'\n" + banner + "EOF\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_detect_runs_version(tmp_path):
    mpi = detect(_fake_mpiexec(tmp_path, OMPI_BANNER))
    assert (mpi.kind, mpi.version, mpi.major) == ("openmpi", "5.0.3", 5)
    with pytest.raises(LaunchError, match="no mpiexec found"):
        from horotopo_launch import mpi as mod
        old = mod.find_mpiexec
        mod.find_mpiexec = lambda environ=None: None
        try:
            detect()
        finally:
            mod.find_mpiexec = old


def test_find_mpiexec_order(tmp_path):
    from horotopo_launch.mpi import find_mpiexec
    assert find_mpiexec({"HOROTOPO_MPIEXEC": "/x/mpiexec", "PATH": ""}) == "/x/mpiexec"
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        assert find_mpiexec({"PATH": str(tmp_path)}) == str(here)


def test_installed_wheel_is_detected():
    from horotopo_launch.mpi import find_mpiexec
    path = find_mpiexec()
    if path is None:
        pytest.skip("no mpiexec installed next to the interpreter or on PATH")
    mpi = detect(path)
    assert mpi.kind in ("mpich", "openmpi") and mpi.version


# --- parsing ----------------------------------------------------------------------------------


def test_basic_flags_and_trailing_command():
    o = cli.parse(["-np", "4", "-H", "a:2,b:2", "python", "train.py", "--lr", "0.1", "-x"])
    assert o.np == 4 and o.hosts == "a:2,b:2"
    assert o.command == ["python", "train.py", "--lr", "0.1", "-x"]
    o = cli.parse(["--num-proc", "2", "--", "python", "-c", "pass"])
    assert o.np == 2 and o.command == ["python", "-c", "pass"]


def test_unknown_flag_errors_like_argparse(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse(["--bogus", "-np", "2", "python", "x.py"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unrecognized arguments: --bogus" in err
    assert cli.main(["--bogus", "python"]) == 2


def test_bad_values_error(capsys):
    for argv in (["-np", "0", "x"], ["-np", "two", "x"], ["--log-level", "LOUD", "x"],
                 ["-p", "-3", "x"]):
        with pytest.raises(SystemExit) as exc:
            cli.parse(argv)
        assert exc.value.code == 2, argv


def test_gloo_rejected(capsys):
    assert cli.main(["--gloo", "-np", "2", "python", "x.py"]) == 2
    assert "--gloo is a horovodrun flag that horotopo-run does not support" in \
        capsys.readouterr().err
    assert cli.parse(["--mpi", "-np", "2", "x"]).np == 2


def test_unsupported_flags_warn(capsys):
    o = cli.parse(["--autotune", "--hierarchical-allreduce", "--num-nccl-streams", "2",
                   "-np", "2", "x"])
    err = capsys.readouterr().err
    assert "--autotune is accepted for horovodrun compatibility but has no effect" in err
    assert "--hierarchical-allreduce" in err and "--num-nccl-streams" in err
    assert o.command == ["x"]


@pytest.mark.parametrize("argv,what", [
    (["--min-np", "2"], "--min-np is a horovodrun flag for elastic training"),
    (["--host-discovery-script", "d.sh"], "--host-discovery-script is a horovodrun flag for "
                                          "elastic training"),
    (["--jsrun"], "--jsrun is a horovodrun flag for launching with LSF's jsrun"),
])
def test_horovodrun_only_flags_are_refused_naming_horovodrun(argv, what, capsys):
    assert cli.main([*argv, "-np", "2", "python", "x.py"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and what in err and "replacement for horovodrun" in err


def test_help_names_horovodrun_as_the_command_replaced(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.count("replaces Horovod's horovodrun") == 1 and "--check-build" in out


def test_check_build_prints_horovods_sections_with_detected_marks(capsys):
    """The layout is horovodrun's; every mark comes from what the child process found."""
    assert cli.main(["--check-build"]) == 0
    out = capsys.readouterr().out
    for title in ("Available Frameworks:", "Available Controllers:",
                  "Available Tensor Operations:", "horotopo:"):
        assert title in out
    lines = {line.strip()[4:].split("  (")[0]: line.strip()[:3] for line in out.splitlines()
             if line.strip().startswith("[")}
    import importlib.util

    torch_there = importlib.util.find_spec("torch") is not None
    assert lines["PyTorch"] == ("[X]" if torch_there else "[ ]")
    for absent in ("TensorFlow", "MXNet", "Gloo", "NCCL", "DDL", "CCL"):
        assert lines[absent] == "[ ]", absent
    assert lines["MPI"] == "[X]"      # the test suite runs with mpi4py and an MPI
    from horotopo.simulation.support import SimulatorMissing, load_simgrid
    try:
        simgrid_there = load_simgrid() is not None
    except SimulatorMissing:
        simgrid_there = False
    assert lines["SimGrid simulator"] == ("[X]" if simgrid_there else "[ ]")
    cupy_there = importlib.util.find_spec("cupy") is not None
    if not cupy_there:
        assert lines["CuPy (GPU buffers)"] == "[ ]"
        assert lines["native GPU reduce kernels"] == "[ ]"


def test_check_build_reports_a_failed_check_instead_of_marks(monkeypatch):
    monkeypatch.setattr(cli, "_BUILD_PROBE", "raise SystemExit('broken interpreter')")
    found = cli.detect_build()
    assert all(not ok and "the check failed: broken interpreter" in why
               for ok, why in found.values())
    text = cli.format_build(found)
    assert "[X]" not in text and "[ ] PyTorch" in text


def test_horovod_env_mapping():
    o = cli.parse(["-np", "2", "--fusion-threshold-mb", "32", "--cycle-time-ms", "3.5",
                   "--cache-capacity", "512", "--timeline-filename", "/tmp/t.json",
                   "--log-level", "debug", "--start-timeout", "60", "x"])
    want = {"FUSION_THRESHOLD": "33554432", "CYCLE_TIME": "3.5", "CACHE_CAPACITY": "512",
            "TIMELINE": "/tmp/t.json", "LOG_LEVEL": "DEBUG", "START_TIMEOUT": "60"}
    for key, value in want.items():
        assert o.env[f"HOROVOD_{key}"] == value
        assert o.env[f"HOROTOPO_{key}"] == value


def test_x_exports(monkeypatch, capsys):
    monkeypatch.setenv("HT_TEST_A", "from-env")
    monkeypatch.delenv("HT_TEST_MISSING", raising=False)
    o = cli.parse(["-x", "HT_TEST_A", "-x", "HT_TEST_B=given", "-x", "HT_TEST_MISSING",
                   "-np", "1", "x"])
    assert o.env["HT_TEST_A"] == "from-env" and o.env["HT_TEST_B"] == "given"
    assert "HT_TEST_MISSING" not in o.env
    assert "HT_TEST_MISSING: not set here" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.parse(["-x", "1BAD", "-np", "1", "x"])


def test_conflicts_and_missing_command(capsys):
    for argv, msg in ((["-np", "2"], "no command given"),
                      (["--check", "-np", "2"], "--check needs --emulate"),
                      (["--emulate", "t.json", "-H", "a:1", "x"], "--emulate builds its own"),
                      (["-H", "a:1", "--hostfile", "f", "x"], "mutually exclusive")):
        with pytest.raises(SystemExit):
            cli.parse(argv)
        assert msg in capsys.readouterr().err


def test_help_explains(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for word in ("--emulate", "--check", "namespace", "10%", "-np", "--hostfile",
                 "--fusion-threshold-mb", "--dry-run", "--allow-run-as-root"):
        assert word in out, word


# --- hosts -------------------------------------------------------------------------------------


def test_hosts_and_hostfile(tmp_path):
    assert cli.parse_hosts("a:4,b:2,c") == [("a", 4), ("b", 2), ("c", 1)]
    for bad in ("a:0", "a:x", ",a", ":3"):
        with pytest.raises(LaunchError):
            cli.parse_hosts(bad)
    f = tmp_path / "hosts"
    f.write_text("# cluster\nnode1 slots=4\n\nnode2 slots=2  # small\nnode3\n")
    assert cli.parse_hostfile(str(f)) == [("node1", 4), ("node2", 2), ("node3", 1)]
    f.write_text("node1 cpus=4\n")
    with pytest.raises(LaunchError, match=r"hosts:1: expected 'host slots=N'"):
        cli.parse_hostfile(str(f))
    with pytest.raises(LaunchError, match="cannot read"):
        cli.parse_hostfile(str(tmp_path / "absent"))


def test_np_defaults_to_slots_and_is_bounded():
    job = cli.job_from(cli.parse(["-H", "a:2,b:3", "x"]))
    assert job.np == 5 and job.hosts == [("a", 2), ("b", 3)]
    with pytest.raises(LaunchError, match="more than the 5 slots"):
        cli.job_from(cli.parse(["-np", "6", "-H", "a:2,b:3", "x"]))
    with pytest.raises(LaunchError, match="-np is required"):
        cli.job_from(cli.parse(["x"]))


# --- command lines -----------------------------------------------------------------------------


def _job(**kw):
    base = dict(np=4, command=["python", "train.py"])
    base.update(kw)
    return Job(**base)


def test_mpich_command_line():
    argv, env = command_line(MPICH, _job(), root=True)
    assert argv == [MPICH.mpiexec, "-n", "4", "python", "train.py"] and env == {}
    argv, env = command_line(MPICH, _job(hosts=[("a", 2), ("b", 2)], env={"K": "v"},
                                         ifaces=["eth1", "eth2"], ssh_port=2222,
                                         mpi_args=["-ppn", "2"]), root=True)
    assert argv == [MPICH.mpiexec, "-n", "4", "-hosts", "a:2,b:2", "-iface", "eth1",
                    "-genv", "UCX_NET_DEVICES", "eth1,eth2", "-genv", "K", "v",
                    "-ppn", "2", "python", "train.py"]
    assert env == {"HYDRA_LAUNCHER_EXTRA_ARGS": "-p 2222"}
    assert "--allow-run-as-root" not in argv


def test_openmpi_command_line_root_and_not():
    argv, env = command_line(OMPI5, _job(), root=True)
    assert argv[:2] == [OMPI5.mpiexec, "--allow-run-as-root"]
    assert "--oversubscribe" in argv and argv[-2:] == ["python", "train.py"] and env == {}
    argv, _ = command_line(OMPI5, _job(), root=False)
    assert "--allow-run-as-root" not in argv
    argv, _ = command_line(OMPI5, _job(hosts=[("a", 2), ("b", 2)], env={"K": "v"},
                                       ifaces=["eth1"], ssh_port=2222), root=False)
    s = " ".join(argv)
    assert "-np 4" in s and "--host a:2,b:2" in s and "--oversubscribe" not in s
    assert "--prtemca plm_ssh_args -p 2222" in s
    assert "--mca btl_tcp_if_include eth1 --prtemca oob_tcp_if_include eth1" in s
    assert "-x K=v" in s
    s4 = " ".join(command_line(OMPI4, _job(ssh_port=22, ifaces=["e"]), root=False)[0])
    assert "--mca plm_rsh_args -p 22" in s4 and "--mca oob_tcp_if_include e" in s4


def test_emulated_command_lines():
    hosts = ["10.77.128.1", "10.77.128.2", "10.77.128.3"]
    argv, env = emulated_command_line(MPICH, np=2, hosts=hosts, launcher="/t/launch.sh",
                                      iface="htbr", env={"A": "1"}, command=["prog"])
    s = " ".join(argv)
    assert "-launcher ssh -launcher-exec /t/launch.sh -iface htbr" in s
    assert "-hosts 10.77.128.1,10.77.128.2 -n 2" in s
    for pair in ("MPIR_CVAR_NOLOCAL 1", "UCX_TLS tcp,self", "UCX_NET_DEVICES htbr",
                 "UCX_TCP_BRIDGE_ENABLE y", "-genv A 1"):
        assert pair in s
    assert argv[-1] == "prog" and env == {"HYDRA_LAUNCHER_AUTOFORK": "0"}
    argv, env = emulated_command_line(OMPI5, np=3, hosts=hosts, launcher="/t/launch.sh",
                                      iface="htbr", env={}, command=["prog"], root=True)
    s = " ".join(argv)
    assert "--allow-run-as-root" in s and "--prtemca plm_ssh_agent /t/launch.sh" in s
    assert "--host 10.77.128.1:1,10.77.128.2:1,10.77.128.3:1" in s
    assert "--mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include htbr" in s
    with pytest.raises(LaunchError, match="between 1 and 3"):
        emulated_command_line(MPICH, np=4, hosts=hosts, launcher="l", iface="i", env={},
                              command=["p"])


def test_unshaped_latency_is_one_warning_line(tmp_path, capsys):
    """Declared latencies are not emulated: one horotopo-run warning naming the links, not a
    Python warning per link."""
    from horotopo.topology import resolve

    doc = json.loads(Path(resolve("racks-2x3")).read_text())
    for link in doc["links"][:2]:
        link["latency_ms"] = 0.5
    path = tmp_path / "lat.json"
    path.write_text(json.dumps(doc))
    assert cli.main(["--emulate", str(path), "--dry-run", "python", "t.py"]) == 0
    err = capsys.readouterr().err
    names = ", ".join("-".join(link["ends"]) for link in doc["links"][:2])
    assert err == ("horotopo-run: warning: latency_ms is not emulated, only rates are shaped "
                   f"(links {names})\n")


def test_format_command_quotes():
    assert format_command(["a", "b c"], {"X": "-p 2"}) == "X='-p 2' a 'b c'"


# --- main --------------------------------------------------------------------------------------


def test_dry_run_with_faked_openmpi(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOROTOPO_MPIEXEC", _fake_mpiexec(tmp_path, OMPI_BANNER))
    assert cli.main(["--dry-run", "-np", "3", "-x", "Q=1", "python", "t.py"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(str(tmp_path / "mpirun"))
    assert ("--allow-run-as-root" in out) == (os.geteuid() == 0)
    assert out.endswith("-x Q=1 python t.py")


def test_dry_run_with_faked_mpich(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOROTOPO_MPIEXEC", _fake_mpiexec(tmp_path, HYDRA_BANNER))
    assert cli.main(["--dry-run", "-np", "2", "--cycle-time-ms", "5", "python", "t.py"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == (f"{tmp_path / 'mpirun'} -n 2 -genv HOROVOD_CYCLE_TIME 5 "
                   f"-genv HOROTOPO_CYCLE_TIME 5 python t.py")


def test_console_script_runs_a_real_job():
    """The installed horotopo-run launches 2 ranks through the real mpiexec."""
    from horotopo_launch.mpi import find_mpiexec
    if find_mpiexec() is None:
        pytest.skip("no mpiexec installed next to the interpreter or on PATH")
    exe = Path(sys.executable).parent / "horotopo-run"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c",
                                           "import sys; from horotopo_launch.cli import main; "
                                           "sys.exit(main())"]
    code = ("import sys; from mpi4py import MPI; c = MPI.COMM_WORLD; "
            "sys.stdout.write(f'<rank {c.rank} of {c.size}>\\n')")
    proc = subprocess.run(cmd + ["-np", "2", sys.executable, "-c", code],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout
    assert sorted(re.findall(r"<rank (\d+) of (\d+)>", proc.stdout)) == [("0", "2"), ("1", "2")]


# ---------------------------------------------------------------------------------------------
# flags that act: each sets a variable that the ranks read through horotopo.config


ACTING_FLAGS = ["--no-stall-check", "--stall-check-warning-time-seconds", "7",
                "--stall-check-shutdown-time-seconds", "30", "--timeline-mark-cycles",
                "--disable-cache", "--timeline-filename", "t.json", "--log-level", "info",
                "--start-timeout", "9", "--cycle-time-ms", "2.5", "--fusion-threshold-mb", "1"]


def test_acting_flags_set_their_variables_and_do_not_warn(capsys):
    o = cli.parse(ACTING_FLAGS + ["-np", "2", "x"])
    assert "no effect" not in capsys.readouterr().err
    assert o.env["HOROVOD_STALL_CHECK_DISABLE"] == "1"
    assert o.env["HOROVOD_STALL_CHECK_TIME_SECONDS"] == "7"
    assert o.env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "30"
    assert o.env["HOROVOD_TIMELINE_MARK_CYCLES"] == "1"
    assert o.env["HOROVOD_CACHE_CAPACITY"] == o.env["HOROTOPO_CACHE_CAPACITY"] == "0"
    assert o.env["HOROVOD_TIMELINE"] == o.env["HOROTOPO_TIMELINE"] == "t.json"
    with pytest.raises(SystemExit):
        cli.parse(["--disable-cache", "--cache-capacity", "4", "-np", "2", "x"])


def test_every_variable_the_launcher_sets_is_declared_and_read_by_the_runtime():
    from horotopo import config
    from horotopo.api.runtime import env_settings

    o = cli.parse(ACTING_FLAGS + ["-np", "2", "x"])
    for name in o.env:
        assert name in config.SETTINGS, f"the launcher sets {name}, which nothing declares"
    # Each alias alone carries the value to the ranks, and the pair agrees (no ConfigError).
    for name, value in o.env.items():
        assert config.get(name, env={name: value}) == config.get(name, env=o.env)
    got = env_settings(o.env)
    assert got["cycle_time_s"] == pytest.approx(0.0025)
    assert got["fusion_threshold"] == 1 << 20 and got["cache_capacity"] == 0
    assert got["stall_check"] == 0.0 and got["stall_check_s"] == 7.0
    assert got["stall_shutdown_s"] == 30.0
    assert config.get("HOROVOD_START_TIMEOUT", env=o.env) == 9.0
    assert config.get("HOROVOD_LOG_LEVEL", env=o.env) == "info"
    assert config.get("HOROVOD_TIMELINE", env=o.env) == "t.json"
    assert config.get("HOROVOD_TIMELINE_MARK_CYCLES", env=o.env) is True


@pytest.mark.parametrize("flag", sorted(cli.UNSUPPORTED))
def test_each_unsupported_flag_warns_once_naming_itself(flag, capsys):
    argv = [flag] + (["v"] if cli.UNSUPPORTED[flag] else []) + ["-np", "2", "x"]
    cli.parse(argv)
    err = capsys.readouterr().err
    assert err.count(f"warning: {flag} is accepted") == 1, err
    assert err.count("warning:") == 1, err


def test_no_flag_is_accepted_silently():
    """Every option of the parser either sets something the job uses or warns."""
    parser = cli.build_parser()
    acting = {"-h", "--help", "-v", "--version", "-np", "--num-proc", "-H", "--hosts",
              "-hostfile", "--hostfile", "--mpi", "--gloo", "-p", "--ssh-port", "--verbose",
              "--network-interface", "--network-interfaces", "--fusion-threshold-mb",
              "--cycle-time-ms", "--cache-capacity", "--disable-cache", "--timeline-filename",
              "--timeline-mark-cycles", "--log-level", "--start-timeout", "--no-stall-check",
              "--stall-check-warning-time-seconds", "--stall-check-shutdown-time-seconds",
              "-x", "--mpi-args", "--dry-run", "--emulate", "--check", "--emulate-prefix",
              "--check-seconds", "-cb", "--check-build"}
    flags = {s for a in parser._actions for s in a.option_strings}
    assert flags - acting == set(cli.UNSUPPORTED) | set(cli.REFUSED)


@pytest.mark.parametrize("flag", sorted(cli.REFUSED))
def test_each_refused_flag_exits_2_naming_itself(flag, capsys):
    argv = [flag] + (["v"] if cli.REFUSED[flag][0] else []) + ["-np", "2", "x"]
    with pytest.raises(SystemExit) as exc:
        cli.parse(argv)
    assert exc.value.code == 2
    assert f"error: {flag} is a horovodrun flag for " in capsys.readouterr().err


def _launcher() -> list:
    from horotopo_launch.mpi import find_mpiexec
    if find_mpiexec() is None:
        pytest.skip("no mpiexec installed next to the interpreter or on PATH")
    exe = Path(sys.executable).parent / "horotopo-run"
    return [str(exe)] if exe.exists() else [sys.executable, "-c",
                                           "import sys; from horotopo_launch.cli import main; "
                                           "sys.exit(main())"]


def _run_job(tmp_path: Path, source: str, flags: list) -> str:
    """Run ``source`` on 2 ranks through horotopo-run with ``flags``; its merged output."""
    script = tmp_path / "job.py"
    script.write_text(source)
    proc = subprocess.run(_launcher() + ["-np", "2", "-x", "HOROTOPO_PROBE=off", *flags,
                                         sys.executable, str(script)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout
    return proc.stdout


JOB_SETTINGS = """
import json, logging
import horotopo as hvd
from horotopo.api import basics
hvd.init()
rt = basics.runtime()
print("<" + json.dumps({"rank": hvd.rank(), "stall_check": rt.settings.stall_check,
                        "cycle_time_s": rt.settings.cycle_time_s,
                        "cache": rt.controller.cache.capacity,
                        "level": logging.getLogger("horotopo").level}) + ">", flush=True)
hvd.shutdown()
"""


def test_launched_ranks_apply_log_level_stall_check_and_aliases(tmp_path):
    out = _run_job(tmp_path, JOB_SETTINGS, ["--log-level", "INFO", "--no-stall-check",
                                             "--cycle-time-ms", "3", "--disable-cache"])
    rows = sorted((json.loads(m) for m in re.findall(r"<(\{.*?\})>", out)),
                  key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [0, 1], out
    for r in rows:
        assert r["stall_check"] is False and r["cache"] == 0
        assert r["cycle_time_s"] == pytest.approx(0.003)
        assert r["level"] == logging.INFO
    # INFO messages of the 'horotopo' logger now reach stderr (Python's default shows warnings
    # only): rank 0's set-up line.
    assert "ring plan over a uniform model" in out


JOB_LATE_RANK = """
import sys, time
from mpi4py import MPI
import horotopo as hvd
if MPI.COMM_WORLD.rank == 1:
    time.sleep(8)   # never calls init within rank 0's --start-timeout
    sys.exit(0)
t0 = time.monotonic()
try:
    hvd.init()
except Exception as exc:
    print(f"<init failed after {time.monotonic() - t0:.1f} s: {exc}>", flush=True)
"""


def test_start_timeout_bounds_init_and_names_the_missing_rank(tmp_path):
    out = _run_job(tmp_path, JOB_LATE_RANK, ["--start-timeout", "2"])
    m = re.search(r"<init failed after ([\d.]+) s: (.*)>", out)
    assert m, out
    assert 1.9 <= float(m.group(1)) < 7.5, m.group(0)
    assert ("init: rank(s) 1 did not reach init within 2 s (HOROVOD_START_TIMEOUT, "
            "horotopo-run --start-timeout)") in m.group(2)


JOB_STALL = """
import time
import numpy as np
import horotopo as hvd
hvd.init()
if hvd.rank() == 0:
    t0 = time.monotonic()
    try:
        hvd.allreduce(np.ones(4), name="only_rank0")
        print("<rank 0: no error>", flush=True)
    except Exception as exc:
        print(f"<rank 0 after {time.monotonic() - t0:.1f} s: {type(exc).__name__}: {exc}>",
              flush=True)
else:
    time.sleep(6)   # never submits only_rank0
    try:
        hvd.allreduce(np.ones(4), name="late")
        print("<rank 1: no error>", flush=True)
    except Exception as exc:
        print(f"<rank 1: {type(exc).__name__}>", flush=True)
"""


def test_stall_shutdown_time_ends_the_job_naming_the_stalled_tensor(tmp_path):
    out = _run_job(tmp_path, JOB_STALL, ["--stall-check-warning-time-seconds", "1",
                                          "--stall-check-shutdown-time-seconds", "2"])
    m = re.search(r"<rank 0 after ([\d.]+) s: HorovodInternalError: (.*)>", out)
    assert m, out
    assert 1.9 <= float(m.group(1)) < 5.5, m.group(0)
    assert ("stalled for more than 2 s, HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: only_rank0 "
            "(missing ranks 1)") in m.group(2)
    assert "<rank 1: HorovodInternalError>" in out   # the whole job shut down
    assert "Missing ranks:\n1: [only_rank0]" in out  # the warning came first
