"""observe, derive, plan, act: the reconcile loop and its work queue."""
