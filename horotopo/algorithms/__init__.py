"""Collective algorithms, one class per algorithm (Gloo style), written over a Transport.

Vocabulary: a *segment* is the part of the buffer one tree (or one ring position) carries; a
*chunk* is the piece of a segment that travels as one message; a *step* is one message event
(a receive completing, a reduction, a send completing) in the nonblocking progress loop.

- :class:`TreeAllreduce`: the Plan's trees, each reducing its segment up ``reduce_parent`` to its
  root and broadcasting it down ``bcast_parent``, chunked and pipelined, all trees in one loop.
- :class:`TreeBroadcast`: a broadcast from any root along the Plan's broadcast trees.
- :class:`MPIAllreduce`: the library's MPI_Allreduce (small messages, fallback).
- :class:`RingAllreduce`: reduce-scatter plus allgather around the rank ring, over the transport.
- :class:`DoubleBinaryTreeAllreduce`: NCCL's double binary tree in rank order (a peer).
- :class:`CostModel`: which of tree and MPI is faster for a message size.
"""
from .cost import CostModel, DEFAULT_COST_MODEL
from .dbtree import DoubleBinaryTreeAllreduce
from .library import MPIAllreduce
from .ring import RingAllreduce
from .tree import TreeAllreduce, TreeBroadcast

__all__ = ["TreeAllreduce", "TreeBroadcast", "MPIAllreduce", "RingAllreduce",
           "DoubleBinaryTreeAllreduce", "CostModel", "DEFAULT_COST_MODEL"]
