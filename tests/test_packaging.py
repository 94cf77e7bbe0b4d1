"""Every package directory is declared in setup.cfg (a missing one installs silently broken)."""
import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_listed():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "horotopo").rglob("__init__.py")}
    found.add("horotopo_launch")
    assert found == listed, f"setup.cfg packages differ: missing {found - listed}, extra {listed - found}"


def test_launcher_imports():
    import horotopo_launch.cli  # noqa: F401
