"""cmdare.workloads."""
