"""All-reduce training: every member holds the whole model and optimizer and averages gradients over an elastic
group (:mod:`cmdare.collective`) each step."""
