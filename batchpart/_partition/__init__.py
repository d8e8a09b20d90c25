"""From a lowered call to per-device calls: the call's description, the
derived target name that carries it, the partitioner callbacks XLA calls for
that name, and the plan they follow (``cc/partition``)."""
