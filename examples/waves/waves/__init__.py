"""waves: a forecaster of noisy sine waves, a small project of one's own trained under cmdare.

Nothing here knows cmdare: a dataset that makes its own data (:mod:`waves.data`), a model that is not an
image classifier (:mod:`waves.model`), a loss and a metric (:mod:`waves.losses`).
"""
