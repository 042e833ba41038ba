"""cmdare.datasets."""
