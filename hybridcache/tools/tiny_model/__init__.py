"""Building blocks of `make-tiny-model`: presets (shapes and config files), weights, tokenizer files."""
