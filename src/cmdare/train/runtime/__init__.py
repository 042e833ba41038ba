"""What every part of a run on Ray uses: its reports (emitter), the calls left to finish (detached), Ray's failures
told apart (faults), the run's status and request files (run_files) and the cluster's health (cluster_health)."""
