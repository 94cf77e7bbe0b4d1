"""horotopo: Horovod-compatible allreduce over near-optimal packings of reduce/broadcast trees."""
__version__ = "0.1.0"
