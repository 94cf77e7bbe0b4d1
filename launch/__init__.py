"""horotopo's launcher: ``horotopo-run`` (horovodrun-compatible) and the emulated cluster.

Installed as the package ``horotopo_launch``. :mod:`horotopo_launch.mpi` finds and drives
mpiexec; :mod:`horotopo_launch.emulate` builds shaped networks out of namespaces;
:mod:`horotopo_launch.cli` is the command line.
"""
