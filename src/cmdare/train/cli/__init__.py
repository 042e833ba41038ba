"""The command line of training: train, ps, runs, export; progress and resume."""
