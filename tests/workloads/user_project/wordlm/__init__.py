"""A practitioner's word-level language model, written like PyTorch's ``word_language_model`` example: an LSTM
``RNNModel`` and a ``TransformerModel`` (``nn.TransformerEncoder`` with a causal mask), behind a forward that takes
integer token ids, on a small corpus made from a seed. Nothing in it imports cmdare."""
