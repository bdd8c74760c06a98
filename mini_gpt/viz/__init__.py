"""Pictures (matplotlib, Agg): attention maps, a run's loss curves (plot.py) and run comparisons."""
