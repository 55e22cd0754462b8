"""pecli: position information in pretrained Transformers."""

__version__ = "0.1.0"
