"""The input side: WikiText (TFDS builder and plain files), tokenizers, LM streams."""
