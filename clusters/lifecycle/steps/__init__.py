"""The reconciler's decisions, one module per step or phase, each plain functions over a
`UnitOfWork` (`clusters.lifecycle.unit`): `running`, `agent` and `network` are a starting
node's steps, `join` carries a new cluster's machines through them together, `install` its
software, `workers` the machines added to a ready cluster and the replacements of lost or
unhealthy ones, `drain` which workers the head's scheduler keeps out, `release` the machines
that no longer serve it, `terminate` the end of a cluster whose machines are all released."""
