"""A bench: variants x seeds from one file, run on an executor, watched by trackers."""
