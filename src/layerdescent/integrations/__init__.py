"""Fronts for training loops that are not layerdescent's own: the Hugging Face Trainer."""
