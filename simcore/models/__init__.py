"""Model descriptions from Hugging Face ``config.json`` files, and the shipped model and GPU catalogue."""
