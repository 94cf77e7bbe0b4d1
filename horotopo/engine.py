"""The allreduce/broadcast engine: validates buffers, agrees on metadata, picks and runs an
algorithm from :mod:`horotopo.algorithms` along a :class:`~horotopo.plan.Plan`.

The algorithms come from the registry (:mod:`horotopo.algorithms.registry`): candidates in
priority order, each enabled or not for a call; the cost model picks among the enabled ones
unless the caller forces one by name. The transport, GPU staging included, is chosen once at
set-up (:func:`horotopo.gpu.transport.transport_for`). The engine works on NumPy and CuPy
arrays; other frameworks' buffers come in through the adapters their front ends register with
the buffer layer (``import horotopo.torch`` registers torch's, see
:func:`horotopo.buffers.register_adapter`), and a call returns its own kind of buffer.

Every call starts with one small library allreduce of ``(count, dtype, op, algorithm)`` and an
error flag (min and max of each in one MPI_MIN), so a buffer that differs in size or dtype across
ranks, or invalid arguments on any rank, raise on every rank before any data moves: never a hang
and never a corrupted result. Then:

- prescale (Horovod's ``prescale_factor``) is applied to the input, into the output buffer;
- the chosen algorithm reduces; ``"average"`` is a sum with ``1 / size`` folded into postscale;
- postscale is applied to the result;
- a float min or max has each NaN made the dtype's canonical one, so that every path, and
  every rank count, gives the same bits (see :mod:`horotopo.ops` for the semantics).

Only one thread may call an Engine at a time.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from . import ops as _ops
from . import timeline as _timeline
from .algorithms import DEFAULT_COST_MODEL, CostModel
from .algorithms.cost import TREE, TopologySide, calibrated_model
from .algorithms.registry import ALLREDUCE, BROADCAST, REGISTRY, Candidates
from .algorithms.tree import Window
from .buffers import (ScratchPool, array_module, as_array, canonical_nan_into, contiguous_flat,
                      copy_into, empty_like, flat_view, is_foreign, scale_into, synchronize)
from .gpu.transport import transport_for
from .params import ENGINE, EngineParams
from .plan import Plan
from .topology import Topology

__all__ = ["Engine", "MismatchError", "ALGORITHMS"]

#: The allreduce algorithms registered when this module was imported, in priority order (the
#: metadata check's codes number them; see :mod:`horotopo.algorithms.registry`).
ALGORITHMS = tuple(c.name for c in REGISTRY[ALLREDUCE])


class MismatchError(ValueError):
    """Ranks called a collective with different sizes, dtypes, ops, roots or plans."""


class Engine:
    """Runs allreduce and broadcast along ``plan`` on ``comm``'s ranks.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm or Transport
        A communicator (the engine ``Dup()``-s it and frees the duplicate in :meth:`close`) or
        a ready :class:`~horotopo.transport.Transport` (which the caller keeps owning). Either
        is wrapped for GPU staging here, once, where MPI needs it
        (:func:`horotopo.gpu.transport.transport_for`).
    plan : Plan
        The schedule; ``plan.n`` must equal the number of ranks and every rank must pass the
        same plan (checked by digest).
    chunk_bytes : int, optional
        Bytes per chunk message; defaults to ``plan.chunk_bytes``.
    cost_model : CostModel, optional
        Chooses among the enabled algorithms (tree or MPI) when ``algorithm`` is None;
        defaults to the measured defaults in
        :data:`horotopo.algorithms.DEFAULT_COST_MODEL` (see :meth:`calibrate`).
    window : int or callable, optional
        Chunks per tree and reduce child that may hold receive scratch at once; None sizes it
        from the chunk size and the plan's trees (:func:`horotopo.algorithms.tree.window_for`);
        a callable is given the plan each tree runner runs (this one, or dbtree's) and returns
        the window (a simulation whose chunks stand for larger ones: the full-size chunk's
        automatic window for each plan, re-plans included).
    params : EngineParams, optional
        The calibration ladder and repeats; default :data:`horotopo.params.ENGINE`.
    topology : Topology, optional
        The network ``plan`` was made for: the model of the algorithm the plan records
        (:attr:`topology_side`) predicts on it. Without one, that algorithm's time is the
        plan's recorded figure scaled as its trees scale (:class:`~horotopo.algorithms.cost.
        TopologySide`).

    Raises
    ------
    MismatchError
        On every rank, when the ranks pass different plans or chunk sizes, or a plan for
        another number of ranks.
    """

    def __init__(self, comm: Any, plan: Plan, chunk_bytes: Optional[int] = None, *,
                 cost_model: Optional[CostModel] = None,
                 window: Window = None, params: EngineParams = ENGINE,
                 topology: Optional[Topology] = None) -> None:
        self.params = params
        self.transport, self._owns = transport_for(comm)
        self.plan = plan
        self.chunk_bytes = int(chunk_bytes or plan.chunk_bytes)
        self.cost_model = cost_model or DEFAULT_COST_MODEL.with_(
            mpi_latency_s=params.prior_mpi_latency_s, tree_latency_s=params.prior_tree_latency_s,
            per_message_s=params.prior_per_message_s)
        self.last_algorithm: Optional[str] = None
        self.last_messages = 0
        self.calibration: Dict[str, List[Any]] = {}
        err: Optional[Exception] = None
        if plan.n != self.transport.size:
            err = ValueError(f"the plan is for {plan.n} ranks but the communicator has "
                             f"{self.transport.size}")
        elif self.chunk_bytes < 1:
            err = ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        digest = int(plan.digest[:15], 16) if err is None else 0
        try:
            self._agree("the engine's plan", [("plan digest", digest),
                                              ("chunk_bytes", self.chunk_bytes)], err)
        except Exception:
            self.close()
            raise
        self._pool = ScratchPool()
        # Every registered candidate, bound to this transport and plan once; a call only asks
        # which are enabled and runs one.
        self.allreduce_algorithms = Candidates.bind(ALLREDUCE, self.transport, plan,
                                                    self._pool, window, params=params)
        self.broadcast_algorithms = Candidates.bind(BROADCAST, self.transport, plan,
                                                    self._pool, window, params=params)
        self._codes = {name: k + 1 for k, name in enumerate(self.allreduce_algorithms.names)}
        self.topology_side = self._topology_side(topology)
        # The model's "tree" is what runs for it: calibration and the selector time that.
        self.cost_model = self.cost_model.with_(side=self.topology_side)

    # -----------------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.transport.rank

    @property
    def size(self) -> int:
        return self.transport.size

    def _topology_side(self, topology: Optional[Topology]) -> TopologySide:
        """What runs where the cost model says "tree": the plan's recorded algorithm when it
        is enabled for this transport (as :meth:`Candidates.select
        <horotopo.algorithms.registry.Candidates.select>` runs it), else the plan's trees."""
        recorded = self.plan.planner.get("algorithm", TREE)
        kept = self.params.kept_predictions
        if recorded == TREE or recorded not in self.allreduce_algorithms.enabled(self.plan,
                                                                                  None):
            return TopologySide(kept=kept)
        candidate = self.allreduce_algorithms.get(recorded).candidate
        return TopologySide(recorded, candidate.predict, topology, kept=kept)

    def choose(self, nbytes: int, buffer: Any = None) -> str:
        """The allreduce algorithm the engine picks for ``nbytes`` (of ``buffer``'s dtype, or
        any allreduce dtype): the cost model's choice among the enabled candidates."""
        return self.allreduce_algorithms.select(self.plan, buffer, nbytes, self.chunk_bytes,
                                                self.cost_model).name

    def allreduce(self, sendbuf: Any, recvbuf: Any = None, op: str = "sum",
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  algorithm: Optional[str] = None) -> Any:
        """Allreduce ``sendbuf`` over all ranks.

        Parameters
        ----------
        sendbuf : array
            NumPy or CuPy array, or a buffer of a framework whose adapter is registered (a
            torch tensor once ``horotopo.torch`` is imported; worked on in place of its own
            memory, see :func:`horotopo.buffers.as_array`), of float16, bfloat16, float32,
            float64, int32 or int64, any shape.
        recvbuf : array, optional
            Output of the same size and dtype, C-contiguous. None returns a new array (a new
            buffer of the same framework for an adapted one) of ``sendbuf``'s shape;
            ``recvbuf is sendbuf`` reduces in place.
        op : str
            ``"sum"``, ``"average"``, ``"min"``, ``"max"`` or ``"product"``.
        prescale_factor, postscale_factor : float
            Horovod's factors: the input is multiplied by ``prescale_factor`` before the
            reduction and the result by ``postscale_factor`` after it. Integer buffers are
            scaled in float64 and cast back (truncating), as Horovod does.
        algorithm : str, optional
            A registered allreduce algorithm (``"tree"``, ``"ring"``, ``"mpi"``), forced; None
            lets the cost model choose among the enabled ones.

        Returns
        -------
        array
            ``recvbuf`` (or the new array) holding the result, bitwise identical on all ranks.

        Raises
        ------
        MismatchError
            On every rank, when ranks disagree on size, dtype, op or algorithm, or when any
            rank passed invalid arguments (that rank raises its own ValueError; a forced
            algorithm that is not enabled for the call is one, naming the enabled ones).
        """
        err: Optional[Exception] = None
        count = dcode = ocode = acode = 0
        result = recvbuf  # what the caller gets back: an adapted buffer stays of its kind
        foreign = False
        try:
            if not hasattr(sendbuf, "dtype"):
                sendbuf = np.asarray(sendbuf)
            foreign = is_foreign(sendbuf)
            if recvbuf is None and foreign:
                result = recvbuf = empty_like(sendbuf)
            same = recvbuf is sendbuf
            sendbuf = as_array(sendbuf)
            recvbuf = sendbuf if same else as_array(recvbuf)
            opn = _ops.normalize_op(op)
            dtype = _ops.check_dtype(sendbuf.dtype)
            in_place = _check_recvbuf(sendbuf, recvbuf)
            pre, post = _ops.effective_scales(opn, prescale_factor, postscale_factor, self.size)
            count = int(sendbuf.size)
            chosen = self.allreduce_algorithms.select(self.plan, sendbuf,
                                                      count * dtype.itemsize,
                                                      self.chunk_bytes, self.cost_model,
                                                      algorithm)
            alg = chosen.name
            dcode, ocode, acode = _ops.dtype_code(dtype), _ops.op_code(opn), self._codes[alg]
        except (ValueError, TypeError) as exc:
            err = exc
        self._agree("allreduce", [("element count", count), ("dtype", dcode), ("op", ocode),
                                  ("algorithm", acode)], err)
        if recvbuf is None:
            result = recvbuf = empty_like(sendbuf)
        out = flat_view(recvbuf)
        src = out if in_place else contiguous_flat(sendbuf)
        self.last_algorithm = alg
        self.last_messages = 0
        if count == 0:
            return result
        tl = _timeline.active()
        t_run = _timeline.clock() if tl is not None else 0.0
        if pre != 1.0:
            scale_into(out, src, pre)
            src = out
        # MPI reads device memory outside any stream: the kernels that wrote src (the caller's
        # or the prescale) must be done. A no-op for host arrays.
        synchronize(src)
        base = _ops.reduction_of(opn)
        if self.size == 1:
            if src is not out:
                copy_into(out, src)
        else:
            chosen.runner.run(src, out, base, self._chunk_elems(dtype))
            self.last_messages = chosen.last_messages
        if post != 1.0:
            scale_into(out, out, post)
        if base in _ops.EXTREMES and _ops.is_float_dtype(dtype):
            canonical_nan_into(out)
        if tl is not None:
            # The op's execution span on the timeline, named by the algorithm that ran it
            # (TREE_ALLREDUCE, MPI_ALLREDUCE, RING_ALLREDUCE), as Horovod names its own.
            tl.activity(f"{alg.upper()}_ALLREDUCE", t_run, args={
                "algorithm": alg, "bytes": count * dtype.itemsize, "dtype": dtype.name,
                "plan": self.plan.digest[:8]})
        if foreign:
            synchronize(out)  # the buffer's own framework knows nothing of the engine's stream
        return result

    def broadcast(self, buf: Any, root: int, algorithm: Optional[str] = None) -> Any:
        """Broadcast ``buf`` from rank ``root`` to every rank, in place; returns ``buf``.

        ``buf`` is a C-contiguous NumPy or CuPy array (or an adapted framework's buffer, see
        :meth:`allreduce`) of uint8 or any allreduce dtype. ``algorithm`` forces a registered
        broadcast algorithm (``"tree"``); None takes the first enabled one.

        Raises
        ------
        MismatchError
            On every rank, when ranks disagree on size, dtype, root or algorithm, or any rank
            passed an invalid buffer, root or algorithm (that rank raises its own ValueError).
        """
        err: Optional[Exception] = None
        count = dcode = acode = 0
        r = -1
        result = buf
        foreign = is_foreign(buf)
        chosen = None
        try:
            buf = as_array(buf)
            dtype = _ops.check_dtype(buf.dtype, broadcast=True)
            flat = flat_view(buf)
            r = _check_root(root, self.size)
            count, dcode = int(buf.size), _ops.dtype_code(dtype)
            chosen = self.broadcast_algorithms.select(self.plan, flat, int(flat.nbytes),
                                                      self.chunk_bytes, None, algorithm)
            acode = 1 + self.broadcast_algorithms.names.index(chosen.name)
        except (ValueError, TypeError, AttributeError) as exc:
            err = exc if not isinstance(exc, AttributeError) else TypeError(
                f"broadcast needs an array, got {type(buf).__name__}")
        self._agree("broadcast", [("element count", count), ("dtype", dcode), ("root", r),
                                  ("algorithm", acode)], err)
        assert chosen is not None  # _agree raised otherwise
        self.last_algorithm = chosen.name
        if count and self.size > 1:
            tl = _timeline.active()
            t_run = _timeline.clock() if tl is not None else 0.0
            if r == self.rank:
                synchronize(flat)
            chosen.runner.run(flat, r, self._chunk_elems(dtype))
            if foreign:
                synchronize(flat)  # staged receives end in copies on the engine's stream
            if tl is not None:
                tl.activity(f"{chosen.name.upper()}_BROADCAST", t_run, args={
                    "algorithm": chosen.name, "root": r, "bytes": int(flat.nbytes),
                    "plan": self.plan.digest[:8]})
        self.last_messages = chosen.last_messages
        return result

    def calibrate(self, sizes: Optional[Sequence[int]] = None, repeats: Optional[int] = None,
                  budget_s: Optional[float] = None) -> CostModel:
        """Time the topology side and MPI_Allreduce on these ranks and fit the cost model.

        The topology side is what runs where the model says "tree" (:attr:`topology_side`:
        the plan's recorded algorithm, or its trees), so the fitted scale is that algorithm's
        measured time over its own prediction.

        Collective: every rank must call it. ``sizes`` (bytes, default
        ``params.calibration_sizes``: 64 KiB .. 16 MiB) are run smallest first, each once to
        warm up and ``repeats`` (default ``params.calibration_repeats``) times timed; a size's
        time is
        the slowest rank's best, agreed by one max-allreduce, so every rank fits the same model
        (:func:`horotopo.algorithms.cost.calibrated_model`) and picks the same algorithm. With
        ``budget_s``, the ladder stops before a size whose expected cost (the last size's
        agreed times, scaled) would take the total past the budget; the decision uses agreed
        numbers only, so all ranks stop at the same size. At least two sizes always run.
        Returns the new model (also set as ``self.cost_model``).
        """
        ladder = sorted(int(s) for s in (sizes if sizes is not None
                                         else self.params.calibration_sizes))
        if repeats is None:
            repeats = self.params.calibration_repeats
        if not ladder:
            raise ValueError("calibrate needs at least one size")
        done: List[int] = []
        tree: List[float] = []
        mpi: List[float] = []
        spent = 0.0
        side = self.topology_side.algorithm
        for size in ladder:
            if budget_s is not None and len(done) >= 2:
                grow = size / done[-1]
                upcoming = (1 + repeats) * (tree[-1] + mpi[-1]) * grow
                if spent + upcoming > budget_s:
                    break
            rows = self.time_algorithms([size], (side, "mpi"), repeats)
            done.append(size)
            tree.append(rows[side][0])
            mpi.append(rows["mpi"][0])
            spent += (1 + repeats) * (tree[-1] + mpi[-1])
        self.cost_model = calibrated_model(self.plan, done, tree, mpi, self.chunk_bytes,
                                           prior=self.cost_model, params=self.params)
        self.calibration = {"sizes": done, "tree_s": tree, "mpi_s": mpi, "algorithm": side}
        return self.cost_model

    def time_algorithms(self, sizes: Sequence[int], algorithms: Sequence[str] = ("tree", "mpi"),
                        repeats: Optional[int] = None) -> Dict[str, List[float]]:
        """Slowest rank's best-of-``repeats`` (default ``params.timing_repeats``) seconds per
        algorithm and size (float32 data)."""
        if repeats is None:
            repeats = self.params.timing_repeats
        out: Dict[str, List[float]] = {a: [] for a in algorithms}
        for size in sizes:
            buf = np.ones(max(1, int(size) // 4), dtype=np.float32)
            res = np.empty_like(buf)
            for alg in algorithms:
                self.allreduce(buf, res, algorithm=alg)  # warm-up
                best = float("inf")
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    self.allreduce(buf, res, algorithm=alg)
                    best = min(best, time.perf_counter() - t0)
                out[alg].append(best)
        flat = np.array([t for a in algorithms for t in out[a]], dtype=np.float64)
        self.transport.allreduce(flat, flat, "max")
        per = len(sizes)
        return {a: flat[k * per:(k + 1) * per].tolist() for k, a in enumerate(algorithms)}

    def close(self) -> None:
        """Free the duplicated communicator (when the engine made it)."""
        if self._owns:
            self.transport.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -----------------------------------------------------------------------------------------
    def _chunk_elems(self, dtype: np.dtype) -> int:
        return max(1, self.chunk_bytes // dtype.itemsize)

    def _agree(self, what: str, fields: Sequence[tuple], err: Optional[Exception]) -> None:
        """One MIN-allreduce of ``fields``, their negations and the error flag; raise on all
        ranks unless every rank passed the same values and none had an error."""
        vals = [int(v) for _, v in fields]
        vec = np.array(vals + [-v for v in vals] + [-(1 if err else 0)], dtype=np.int64)
        self.transport.allreduce_control(vec, "min")
        k = len(vals)
        lo, hi, bad = vec[:k], -vec[k:2 * k], -vec[2 * k]
        if err is not None:
            raise err
        if bad:
            raise MismatchError(f"{what}: another rank passed invalid arguments (see its error)")
        diffs = [f"{name} ranges {lo[i]}..{hi[i]}" for i, (name, _) in enumerate(fields)
                 if lo[i] != hi[i]]
        if diffs:
            raise MismatchError(f"{what}: ranks disagree: {'; '.join(diffs)}")


def _check_recvbuf(sendbuf: Any, recvbuf: Any) -> bool:
    """Validate ``recvbuf`` against ``sendbuf``; True when the call is in place."""
    if recvbuf is None:
        return False
    if recvbuf is sendbuf:
        flat_view(recvbuf)
        return True
    if not hasattr(recvbuf, "dtype"):
        raise TypeError(f"recvbuf must be an array, got {type(recvbuf).__name__}")
    if recvbuf.dtype != sendbuf.dtype or recvbuf.size != sendbuf.size:
        raise ValueError(f"recvbuf ({recvbuf.size} x {recvbuf.dtype}) must match sendbuf "
                         f"({sendbuf.size} x {sendbuf.dtype})")
    flat_view(recvbuf)
    if array_module(recvbuf) is np and np.may_share_memory(recvbuf, sendbuf):
        raise ValueError("recvbuf overlaps sendbuf; pass recvbuf=sendbuf for in place")
    return False


def _check_root(root: Any, size: int) -> int:
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
        raise TypeError(f"root must be an int, got {type(root).__name__}")
    if not 0 <= int(root) < size:
        raise ValueError(f"root {root} is out of range 0..{size - 1}")
    return int(root)
